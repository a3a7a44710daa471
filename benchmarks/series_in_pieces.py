"""The calibration's ZeRO-3 series read in pieces: how much its level moves within one launch and between launches,
and whether the host's speed over each piece follows it.

    python benchmarks/series_in_pieces.py [--launches 3] [--seconds 18] [--piece 1.8]

Each launch (2 ranks, fp32) runs ``series_worker`` (calibrate/series.py: the executor's own ZeRO-3 calls after a
forward's burst and a backward's, in turn) for ``--seconds``, then splits rank 0's repetitions into pieces of about
``--piece`` seconds. Per piece it prints the gathers' mean (second to fourth of both patterns, the calls
``series_level`` is fitted on), the reduce-scatter after the backward and the host's speed over the piece
(real/host_speed.py, the spinners' loop); per launch the mean and SD/mean of the pieces, and over the launches
the correlation of the pieces' gathers with the host's slowness (1 / speed). Nothing is fitted. On the fifty-first
stop (2026-12-02, 2 ranks): two runs of three launches of 18 s read pieces of 1.8 s at 0.61-1.12 ms, SD/mean 8.6-19.4 %
within a launch, where the launches' means read 0.83-0.91 ms; the host's slowness correlated +0.36 with the
pieces' gathers (30 pieces; +0.16 over ten launches of 1.8 s): the loop's level moves within seconds, mostly for
a reason the spinners do not see, so a longer loop, not a reading of the host's speed, takes that noise out
(docs/calibration.md, fifty-first stop).
"""

from __future__ import annotations

import argparse
import statistics
import time


def worker(ctx, seconds: float) -> dict:
    from simpar.calibrate.series import series_worker

    timed = series_worker(ctx, seconds)
    timed["offset"] = time.time() - time.perf_counter()  # the marks are perf_counter's; the spinners' time.time's
    return timed


def pieces(marks: list[list[float]], piece: float) -> list[tuple[int, int]]:
    """[start, end) of consecutive repetitions of ``marks`` (rank 0's, each [compute end, each call's end])
    spanning about ``piece`` seconds each; a last piece of fewer than 20 repetitions is dropped."""
    spans, start = [], 0
    while start < len(marks):
        end = start
        while end < len(marks) and marks[end][0] - marks[start][0] < piece:
            end += 1
        if end - start >= 20:
            spans.append((start, end))
        start = end
    return spans


def main() -> int:
    from simpar.calibrate.series import SERIES, series_positions
    from simpar.real import host_speed
    from simpar.real.launch import launch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=18.0)
    parser.add_argument("--piece", type=float, default=1.8)
    args = parser.parse_args()
    gathers_all, slowness = [], []
    for index in range(args.launches):
        ranks = launch(worker, 2, (args.seconds,), timeout=600)
        rows = []
        for start, end in pieces(ranks[0]["series"], args.piece):
            forward = series_positions([r["series"][start:end] for r in ranks])
            backward = series_positions([r["series_bwd"][start:end] for r in ranks])
            gathers = statistics.fmean(forward[1:SERIES] + backward[1:SERIES])
            began, ended = (ranks[0]["series"][start][0] + ranks[0]["offset"],
                            ranks[0]["series"][end - 1][-1] + ranks[0]["offset"])
            speed = host_speed.reading(began, ended)
            rows.append((gathers, backward[0], speed))
            if speed:
                gathers_all.append(gathers)
                slowness.append(1.0 / speed)
        means = [g for g, _, _ in rows]
        print(f"launch {index + 1}: gathers by piece (ms) " + " ".join(f"{1e3 * g:.2f}" for g in means)
              + f" | mean {1e3 * statistics.fmean(means):.3f}, SD/mean "
              f"{100 * statistics.pstdev(means) / statistics.fmean(means):.1f} %")
        print("   reduce-scatter (ms) " + " ".join(f"{1e3 * s:.2f}" for _, s, _ in rows)
              + " | host speed (M/s) " + " ".join(f"{v / 1e6:.1f}" if v else "-" for _, _, v in rows))
    if len(gathers_all) > 2:
        print(f"correlation of a piece's gathers with the host's slowness: "
              f"{statistics.correlation(gathers_all, slowness):+.2f} over {len(gathers_all)} pieces")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
