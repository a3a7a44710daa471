"""``--compare-real --engine deepspeed``: DeepSpeed itself beside the simulation and simpar's executor.

The simulation for this column prices DeepSpeed's habits (its fp32 partitions, all-reduced ZeRO-1/2
buckets, persistent ZeRO-3 parameters: ``simpar.deepspeed``), where the executor's column prices
simpar's own Plan. Every difference that remains is listed with its reason.
"""

from __future__ import annotations

import dataclasses

from simpar import units
from simpar.deepspeed import filled, load, read_config
from simpar.real.deepspeed_engine import run_config, run_deepspeed
from simpar.scenario import Scenario
from simpar.sim import simulate

CATEGORIES = ("params", "grads", "optimizer", "host")  # what DeepSpeed's engine and optimizer hold, read from them
HABITS = ("deepspeed_habits", "param_persistence_threshold", "offload_params")
# why a category can differ between the simulation and what DeepSpeed's engine holds
WHY = {"grads": "ZeRO-1/2 turn the 16-bit gradient partition into fp32 inside step() (stage_1_and_2.py: flatten, "
                ".to(fp32)), so both exist only between the two moments read here (after each backward, inside the "
                "optimizer's step); simpar counts both, as DeepSpeed's estimator does",
       "step_time_s": "DeepSpeed's per-module hooks and many small collectives cost Python time on CPU ranks; the "
                      "simulator's profile of this machine was measured on simpar's executor"}


def _error(sim: float, real: float) -> float | None:
    return None if not real else (sim - real) / real


def deepspeed_beside(args, scenario: Scenario, losses: list[float], steps: int, seed: int, timeout: float,
                     against: str = "simpar's executor") -> dict:
    """DeepSpeed's run and the simulation with DeepSpeed's habits; ``losses`` (``against``'s) to hold it to."""
    from simpar.cli.machine import machine_topology

    config = load(args.deepspeed)
    train = scenario.train
    ds = read_config(config, scenario.model, scenario.strategy.dp, train.precision, train.micro_batch,
                     train.global_batch)
    habits = {k: ds.options[k] for k in HABITS if k in ds.options}
    as_deepspeed = dataclasses.replace(scenario, strategy=dataclasses.replace(scenario.strategy, **habits))
    topology, _ = machine_topology(args, scenario)
    sim = simulate(as_deepspeed, topology=topology, serial=True).to_json()
    run, changed = run_config(filled(config, ds))
    real = run_deepspeed(scenario, run, steps, seed, timeout)
    rows = {"step_time_s": (sim["step_time_s"], real["step_time_s"]),
            "bytes_sent": (max(r["bytes_sent"] for r in sim["ranks"]), max(r["bytes_sent"] for r in real["ranks"]))}
    for category in CATEGORIES:
        rows[category] = (max(r["memory"][category] for r in sim["ranks"]),
                          max(r["memory"].get(category, 0) for r in real["ranks"]))
    comparison = {k: {"sim": s, "real": r, "error": _error(s, r)} for k, (s, r) in rows.items()}
    loss_gap = max(abs(a - b) for a, b in zip(real["losses"], losses))
    calls = real["ranks"][0]["calls"]
    differences = list(changed) + [
        f"bytes: DeepSpeed's collectives counted at torch.distributed as the bytes a ring sends for them "
        f"({', '.join(f'{n} x{c} {units.human_bytes(b / max(steps - 1, 1))}/step' for n, (c, b) in sorted(calls.items()))} "
        f"in the {max(steps - 1, 1)} step(s) after the first on rank 0; the first records DeepSpeed's module trace)"]
    for category in ("step_time_s", *CATEGORIES):
        row = comparison[category]
        off = abs(row["error"]) > 0.05 if row["error"] is not None else row["sim"] != row["real"]
        if off and category in WHY:
            differences.append(f"{category}: {WHY[category]}")
    differences.append("buffers and activations are not compared: DeepSpeed's reduce buckets and gathered ZeRO-3 "
                       "modules live in its own structures, autograd's saved tensors are read in simpar's executor only")
    return {"config": run, "sim": sim, "real": real, "comparison": comparison, "losses_against": against,
            "loss_max_abs_diff_vs_executor": loss_gap, "differences": differences}


def deepspeed_alone(args, scenario: Scenario, steps: int, seed: int, timeout: float, notes: list[str]) -> int:
    """A config simpar's executor cannot perform (offload_param): DeepSpeed beside the simulation only, its
    losses held to one process training on the whole batch."""
    from simpar.cli.common import scenario_json, write_json
    from simpar.real.executor import single_process

    reference = single_process(scenario, steps, seed)["losses"]
    beside = deepspeed_beside(args, scenario, reference, steps, seed, timeout, "one process on the whole batch")
    notes = notes + ["deepspeed: simpar's executor does not perform offload_param: DeepSpeed runs alone beside "
                     "the simulation, its losses held to one process training on the whole batch"]
    if args.json and write_json({"scenario": scenario_json(scenario), "inputs": notes, "deepspeed": beside},
                                args.json):
        return 0
    for line in notes:
        print(line)
    print_beside(beside, None)
    return 0


def print_beside(beside: dict, executor: dict | None) -> None:
    from simpar.cli.common import loss_summary

    real, c = beside["real"], beside["comparison"]
    print(f"\nDeepSpeed itself on the same ranks (losses {loss_summary(real['losses'])}; "
          f"largest difference from {beside['losses_against']} {beside['loss_max_abs_diff_vs_executor']:.1e})")
    print(f"  {'':<22}{'simulated':>12}{'DeepSpeed':>12}{'error':>10}   (simulated with DeepSpeed's habits)")
    for key, label, show in (("step_time_s", "step time", units.human_time),
                             ("bytes_sent", "sent per rank", units.human_bytes),
                             *((k, k, units.human_bytes) for k in CATEGORIES)):
        row = c[key]
        if row["sim"] or row["real"]:
            error = "n/a" if row["error"] is None else f"{100 * row['error']:+.0f} %"
            print(f"  {label:<22}{show(row['sim']):>12}{show(row['real']):>12}{error:>10}")
    print("what DeepSpeed does differently, or was asked to:")
    for line in beside["differences"]:
        print(f"  - {line}")
