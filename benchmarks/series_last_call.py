"""Does a series' last call pay for the peer computing after it? The calibration's own series, with its
compute before each series (a product burst) against a sleep as long.

    python benchmarks/series_last_call.py [--launches 3] [--seconds 4]

Runs ``series_worker`` (calibrate/series.py: the executor's own ZeRO-3 gathers of a layer's modules, on 2
ranks) ``--launches`` times each way, in turn: as calibrated, a compute of about 0.9 ms before each series;
then with that compute replaced by ``time.sleep`` of as long, so that after its last call a rank leaves its
core free. Prints each position's mean time and the last call's cost beyond the fifth to seventh's.

On the development VM (2026-11-28, thirty-first stop) the last call cost 0.09-0.15 ms more with the burst
and -0.03 to 0.00 with the sleep: the extra is the peer's compute, which begins as soon as the peer's own
call returns, while this rank's call still needs the peer's part of the exchange. Since the thirty-third
stop the calibration keeps it (``series_last``) and the simulator prices it on every ZeRO-3 gather a compute
follows (docs/calibration.md, the stop log; ``calls_in_step.py --by-place`` sets it beside the step's).
"""

from __future__ import annotations

import argparse
import statistics
import time


def sleeping_worker(ctx, seconds: float) -> dict:
    """``series_worker`` with its compute before each series a sleep of the burst's length."""
    import simpar.calibrate.bench as bench
    from simpar.calibrate.series import series_worker

    bench._short_burst = lambda length: (lambda: time.sleep(length))
    return series_worker(ctx, seconds)


def last_extra(positions: list[float]) -> float:
    """The last call's time beyond the mean of the fifth to seventh (seconds)."""
    return positions[-1] - statistics.fmean(positions[4:7])


def main() -> None:
    from simpar.calibrate.series import series_positions, series_worker
    from simpar.real.launch import launch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    for _ in range(args.launches):
        for name, worker in (("burst", series_worker), ("sleep", sleeping_worker)):
            timed = launch(worker, 2, (args.seconds,), timeout=300)
            positions = series_positions([t["series"] for t in timed])
            print(f"{name}: " + " ".join(f"{1e3 * p:.2f}" for p in positions) +
                  f" ms | last beyond 5th-7th {1e3 * last_extra(positions):+.3f} ms", flush=True)


if __name__ == "__main__":
    main()
