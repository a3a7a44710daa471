"""``simpar run --compare-real``: simulate the step on a profile of this machine, perform it for real
with one process per rank, and print both side by side with relative errors."""

from __future__ import annotations

import math
import sys

import torch
from tqdm import tqdm

from simpar import units
from simpar.flops import utilisation
from simpar.cli.common import loss_summary, scenario_json, write_figures, write_json
from simpar.cli.machine import machine_topology
from simpar.errors import SimparError
from simpar.plan import OP_CLASSES
from simpar.real.compare import MEMORY_ROWS, comparison, run_real
from simpar.real.executor import check_supported
from simpar.scenario import Scenario
from simpar.sim import simulate

BACKENDS = ("gloo", "nccl")
COLLECTIVES = ("explicit", "native")


AUTO_SECONDS = 3.0  # --steps auto: as many steps as take about this long at the simulated step time
AUTO_STEPS = (3, 200)  # ... at least and at most
UNPRICED_STEPS = 3  # --steps auto where the run is not priced before it runs (torchrun's ranks) or beside DeepSpeed


def real_options(args) -> tuple[int | None, float, int, str, str]:
    """--steps (None for auto), --timeout, --seed, --backend and --collectives, checked."""
    steps = None if str(args.steps).strip().lower() == "auto" else units.positive_int(args.steps, "--steps")
    timeout = units.positive(args.timeout, "--timeout")
    seed = units.positive_int(args.seed, "--seed", minimum=0)
    backend = args.backend.strip().lower()
    if backend not in BACKENDS:
        raise SimparError(f"--backend: must be one of {', '.join(BACKENDS)}, got {args.backend!r}")
    collectives = args.collectives.strip().lower()
    if collectives not in COLLECTIVES:
        raise SimparError(f"--collectives: must be one of {', '.join(COLLECTIVES)}, got {args.collectives!r}")
    return steps, timeout, seed, backend, collectives


def auto_steps(step_time: float) -> int:
    """Steps for --steps auto: the first (a warm-up, left out) and about ``AUTO_SECONDS`` of timed ones. A
    CPU's step times move by tens of percent from step to step: two timed steps of a 10 ms step read it
    anywhere within a factor of two, a few seconds of them steadily."""
    least, most = AUTO_STEPS
    return min(most, max(least, 1 + math.ceil(AUTO_SECONDS / max(step_time, 1e-6))))


def run_and_compare(args, scenario: Scenario, notes: list[str] = ()) -> int:
    steps, timeout, seed, backend, collectives = real_options(args)
    if collectives == "native" and scenario.strategy.ep > 1:
        raise SimparError("--collectives: expert parallelism's all-to-all runs as explicit pairwise sends only "
                          "(gloo has no list all-to-all); leave --collectives native out")
    world = scenario.strategy.world
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and have < world:
        raise SimparError(f"--backend: nccl runs one rank per GPU; {world} ranks need {world} GPUs, this machine "
                          f"has {have} (use gloo, or torchrun across machines)")
    deepspeed = args.engine.strip().lower() == "deepspeed"
    if deepspeed and scenario.strategy.offload_params:  # DeepSpeed alone: simpar's executor cannot perform it
        from simpar.cli.run_deepspeed import deepspeed_alone

        return deepspeed_alone(args, scenario, steps or UNPRICED_STEPS, seed, timeout, list(notes))
    check_supported(scenario)  # before the run is priced: pricing may calibrate this machine first
    priced = price(args, scenario)  # (topology, note, simulated)
    # DeepSpeed's own steps beside take many times simpar's: auto is the fixed few there
    steps = steps or (UNPRICED_STEPS if deepspeed else auto_steps(priced[2].step_time_s))
    with tqdm(total=world * steps, desc=f"{world} ranks x {steps} steps", unit="step", file=sys.stderr,
              disable=None, leave=False) as bar:  # disable=None: no bar when stderr is not a terminal
        real = run_real(scenario, steps, seed, timeout, backend, progress=lambda done: bar.update(done - bar.n),
                        collectives=collectives)
    beside = None
    if deepspeed:
        from simpar.cli.run_deepspeed import deepspeed_beside

        beside = deepspeed_beside(args, scenario, real["losses"], steps, seed, timeout)
    return report(args, scenario, real, backend, list(notes), beside, priced=priced)


def price(args, scenario: Scenario, calibrate_now: bool = True) -> tuple:
    """(topology, the line saying which, the simulated step) of the scenario on this machine's profile
    (``calibrate_now``: ``machine_topology``'s)."""
    topology, note = machine_topology(args, scenario, calibrate_now)
    simulated = simulate(scenario, topology=topology, replay=not args.no_replay, serial=True,
                         record_links=bool(args.trace))
    return topology, note, simulated


def report(args, scenario: Scenario, real: dict, backend: str, notes: list[str], beside: dict | None = None,
           calibrate_now: bool = True, priced: tuple | None = None) -> int:
    """Print (or write) the scenario simulated on this machine's profile (``priced``, else ``price``) beside
    ``real``."""
    topology, note, simulated = priced or price(args, scenario, calibrate_now)
    sim = simulated.to_json(timeline=args.memory_timeline, ops=args.op_timeline)
    # the measured step's model FLOP/s and MFU, against the peak of the device the simulator gave the ranks
    real = {**real, **utilisation(scenario, real["step_time_s"], topology)}
    result = {"scenario": scenario_json(scenario), "inputs": notes, "profile": note, "sim": sim, "real": real,
              "comparison": comparison(sim, real)}
    if beside is not None:
        result["deepspeed"] = beside
    wrote = write_figures(args, scenario, {**result, "sim": simulated.to_json(timeline=True, ops=True, links=True)})
    if args.json and write_json(result, args.json):
        return 0
    for line in notes:
        print(line)
    print_comparison(scenario, result, backend)
    if beside is not None:
        from simpar.cli.run_deepspeed import print_beside

        print_beside(beside, result["real"])
    for line in wrote:
        print(line)
    return 0


def _percent(error: float | None) -> str:
    return "n/a" if error is None else f"{100 * error:+.0f} %"


def _line(label: str, row: dict, show, extra: str = "") -> str:
    real = "not counted" if row["real"] is None else show(row["real"])
    return f"  {label:<22}{show(row['sim']):>12}{real:>12}{_percent(row['error']):>10}  {extra}".rstrip()


def print_comparison(scenario: Scenario, result: dict, backend: str) -> None:
    s, t, c = scenario.strategy, scenario.train, result["comparison"]
    cp = f" x cp {s.cp}" if s.cp > 1 else ""
    print(f"{s.name} on {s.world} ranks (dp {s.dp}{cp} x pp {s.pp} x tp {s.tp}): {scenario.model.name}, {t.precision}, "
          f"{t.optimizer}, global batch {t.global_batch}")
    print(f"simulated on a profile of this machine vs measured with {backend} ({result['real']['steps']} steps; "
          f"losses {loss_summary(result['real']['losses'])})")
    print(f"note: {result['profile']}")
    if scenario.model.experts:  # (the simulated routing; the measured one is in the notes below)
        from simpar.cli.run import print_moe

        print_moe(scenario)
    print()
    print(f"  {'':<22}{'simulated':>12}{'measured':>12}{'error':>10}")
    print(_line("step time", c["step_time_s"], units.human_time))
    print("time per op class (mean per rank and step, the first step left out; ops priced and run one at a time, "
          "in Plan order):")
    for kind in OP_CLASSES:
        row = c["op_time_s"][kind]
        if row["sim"] or row["real"]:
            print(_line(kind, row, units.human_time))
    print(_line("in no op", c["outside_ops_s"], units.human_time,
                "(measured: the executor's work between ops; a calibrated profile prices it in the "
                "computes after it)"))
    print("bytes per rank and step (largest rank):")
    for key, label in (("bytes_sent", "sent"), ("bytes_received", "received"), ("offload_bytes", "offload")):
        row = c[key]
        if row["sim"] or row["real"]:
            equal = "" if row["ranks_equal"] is None else f"equal on {row['ranks_equal']}/{row['ranks']} ranks"
            print(_line(label, row, units.human_bytes, equal))
    print("memory per rank (peak of each category, largest rank):")
    for category in MEMORY_ROWS:
        row = c["memory"][category]
        if row["sim"] or row["real"]:
            print(_line(category, row, units.human_bytes))
    for note in result["real"]["notes"] + result["sim"]["notes"]:
        print(f"note: {note}")
