"""Calibration: fits, the saved profile and the simulator priced with it; validate's report."""

import json

import numpy as np
import pytest

from simpar.calibrate.profile import HardwareProfile
from simpar.calibrate.fits import fit_line
from simpar.errors import SimparError
from simpar.models import model
from simpar.scenario import make_scenario
from simpar.sim import simulate


def _profile() -> HardwareProfile:
    return HardwareProfile(machine={"host": "test", "cores": 2, "torch": "x", "cpu": "x"},
                           compute={"fp32": {"fwd": [20e-6, 100e-6, 50e-6, 50e9], "bwd": [40e-6, 200e-6, 90e-6, 40e9]}},
                           ring={"2": [50e-6, 2e9], "4": [1e-3, 1e9]},
                           optimizer_params_per_s={"adam": 1e8, "sgd": 4e8}, copy_bytes_per_s=1e10)


def test_unit_costs_fit_an_overhead_per_kind_of_unit_and_one_rate():
    from simpar.calibrate.fits import fit_unit_costs

    truth = {"embedding": 30e-6, "layer": 300e-6, "head": 80e-6}
    rows = [{"unit": kind, "fwd_flops": f, "fwd_s": truth[kind] + f / 2e10}
            for kind in truth for f in (1e6, 4e6, 16e6)]
    assert fit_unit_costs(rows, "fwd") == (pytest.approx([30e-6, 300e-6, 80e-6, 2e10]), {})


def test_unit_costs_refit_without_an_overhead_that_fits_below_zero():
    """The layer rows sit below the line (as noise can put them): its overhead is fixed at 0 and
    the others refitted, instead of a negative overhead clipped after the fact."""
    from simpar.calibrate.fits import fit_unit_costs

    rows = [{"unit": "embedding", "fwd_flops": f, "fwd_s": 30e-6 + f / 2e10} for f in (1e6, 4e6, 16e6)]
    rows += [{"unit": "layer", "fwd_flops": f, "fwd_s": f / 2e10 * 0.9} for f in (1e6, 4e6, 16e6)]
    rows += [{"unit": "head", "fwd_flops": f, "fwd_s": 80e-6 + f / 2e10} for f in (1e6, 4e6, 16e6)]
    fit, _ = fit_unit_costs(rows, "fwd")
    assert fit[1] == 0.0 and all(v >= 0 for v in fit)
    # the same as least squares of the relative error on the embedding, head and FLOP columns alone
    design = np.array([[r["unit"] == "embedding", r["unit"] == "head", r["fwd_flops"]] for r in rows], dtype=float)
    seconds = np.array([r["fwd_s"] for r in rows])
    e, h, per_flop = np.linalg.lstsq(design / seconds[:, None], np.ones(len(rows)), rcond=None)[0]
    assert fit == pytest.approx([e, 0.0, h, 1 / per_flop], rel=1e-9)


def test_fit_line_recovers_a_line_and_stays_non_negative():
    xs = [1e3, 1e4, 1e5, 1e6]
    assert fit_line(xs, [2e-6 + x / 1e9 for x in xs]) == pytest.approx((2e-6, 1e-9))
    assert fit_line(xs, [x / 1e9 - 1e-3 for x in xs])[0] == 0.0  # through the origin rather than below it
    assert fit_line([5, 5], [1.0, 3.0]) == (2.0, 0.0)
    disturbed = [2e-6 + x / 1e9 for x in xs] + [1.0]  # one timing hit by the scheduler
    assert fit_line(xs + [2e5], disturbed) == pytest.approx((2e-6, 1e-9))


def test_profile_round_trips_and_prices_compute_as_overhead_plus_flops(tmp_path):
    path = tmp_path / "hw.json"
    _profile().save(str(path))
    profile = HardwareProfile.load(str(path))
    assert profile == _profile()
    scenario = make_scenario(model("tiny"), "ddp", 2, precision="fp32", topology="cpu-host")
    topo = profile.topology(2, "fp32")
    device = topo.graph.nodes[topo.gpus[0]]["spec"]
    assert device.costs["fwd"] == ({"embedding": 20e-6, "layer": 100e-6, "head": 50e-6}, 50e9)
    assert device.costs["step"] == ({}, 1e8)
    four = profile.topology(4, "fp32")  # 4 ranks: priced alone, the cores shared as the ranks compute
    assert four.graph.nodes["gpu0"]["spec"].costs["fwd"] == device.costs["fwd"]
    assert four.core_slowdown == {1: 1.0, 2: 1.0, 3: 1.5, 4: 2.0}  # k ranks on 2 cores: max(1, k / 2) each
    assert profile.topology(8, "fp32").core_slowdown[8] == 4.0
    from simpar.sim.runner import Simulator
    from simpar.strategies import build_plan

    sim = Simulator(build_plan(scenario), scenario, topo)
    fwd = next(op for op in sim.plan.programs[0].ops if getattr(op, "phase", "") == "fwd" and op.unit == 1)
    assert sim.compute_time(sim.plan.programs[0], fwd) == pytest.approx(100e-6 + fwd.flops / 50e9)
    head = next(op for op in sim.plan.programs[0].ops if getattr(op, "phase", "") == "bwd" and op.unit == 3)
    assert sim.compute_time(sim.plan.programs[0], head) == pytest.approx(90e-6 + head.flops / 40e9)
    assert simulate(scenario, topology=topo).step_time_s > 0


def test_tensor_parallel_pieces_share_their_layer_overhead_instead_of_each_paying_it():
    """The calibrated overhead is the framework's cost of a whole unit's ops; tensor parallelism cuts a
    layer into pieces (attention, MLP) that divide those ops, so a layer's pieces pay its overhead once
    between them (in proportion to their kernels), while the FLOPs are priced per piece as before."""
    from simpar.sim.op_costs import OpCosts
    from simpar.strategies import build_plan

    for sp in (False, True):
        scenario = make_scenario(model("tiny"), "tp", 2, precision="fp32", topology="cpu-host", sequence_parallel=sp)
        plan = build_plan(scenario)
        costs, prog = OpCosts(plan, scenario, _profile().topology(2, "fp32")), plan.programs[0]
        for phase, (overhead, rate) in (("fwd", (100e-6, 50e9)), ("bwd", (200e-6, 40e9))):
            pieces = [op for op in prog.ops if getattr(op, "phase", "") == phase and op.unit == 1
                      and op.microbatch == 0]
            assert len(pieces) == (4 if sp else 2) and all(op.part for op in pieces)
            shares = [costs.compute_time(prog, op) - op.flops / rate for op in pieces]
            assert sum(shares) == pytest.approx(overhead) and all(0 < s < overhead for s in shares)


def test_the_cores_are_shared_by_the_ranks_computing_at_the_moment():
    """Processor sharing, by hand: with 2 computing each takes 2x (the table). A (1 s of work) starts at
    0, B (1 s) at 0.5: A alone to 0.5, both at half speed to 1.5 (A done), B alone for its last 0.5 s;
    a job standing for 2 ranks counts as 2."""
    import simpy

    from simpar.sim.cores import SharedCores

    env = simpy.Environment()
    cores = SharedCores(env, {2: 2.0, 4: 3.0})
    ends = {}

    def job(name, start, work, ranks=1):
        yield env.timeout(start)
        yield cores.run(work, ranks)
        ends[name] = env.now

    for args in (("a", 0.0, 1.0), ("b", 0.5, 1.0), ("pair", 3.0, 1.0, 2), ("c", 3.0, 1.0)):
        env.process(job(*args))
    env.run()
    assert ends["a"] == pytest.approx(1.5) and ends["b"] == pytest.approx(2.0)
    assert ends["pair"] == pytest.approx(3.0 + 2.5) == ends["c"]  # 3 ranks at once: 2.5x (interpolated)


def test_ranks_sharing_cores_price_a_data_parallel_step_as_all_computing_at_once_and_a_pipeline_less():
    """DDP's ranks (one program) always compute together: processor sharing prices it exactly as every
    compute slowed by the table at the world size; a pipeline's stages take turns, so it pays less
    than that; and asking for the fast path gives the full simulation."""
    profile = _profile()
    for strategy, kwargs in (("ddp", {}), ("pp", {"microbatches": 8})):
        scenario = make_scenario(model("tiny-deep"), strategy, 4, micro_batch=2, precision="fp32",
                                 topology="cpu-host", **kwargs)
        shared = profile.topology(4, "fp32")
        constant = profile.topology(4, "fp32")
        costs = constant.graph.nodes["gpu0"]["spec"].costs
        for phase, (overheads, rate) in list(costs.items()):
            costs[phase] = ({k: 2.0 * o for k, o in overheads.items()}, rate / 2.0)
        constant.core_slowdown = None
        priced = simulate(scenario, topology=shared, serial=True).step_time_s
        at_once = simulate(scenario, topology=constant, serial=True).step_time_s
        if strategy == "ddp":
            assert priced == pytest.approx(at_once, rel=1e-9)
        else:
            assert priced < 0.9 * at_once
        assert simulate(scenario, topology=shared, serial=True, fast=True).step_time_s == priced


def test_a_ring_step_costs_the_fitted_latency_and_bandwidth():
    from simpar.collective_run import simulate_collective

    topo = _profile().topology(2, "fp32")
    result = simulate_collective(topo, "allreduce", "ring", 2 * 10**6)
    # two ring steps (reduce-scatter, all-gather) of 1 MB each at 2 GB/s, 50 us latency
    assert result.time_s == pytest.approx(2 * (50e-6 + 1e6 / 2e9), rel=1e-6)
    four = simulate_collective(_profile().topology(4, "fp32"), "allreduce", "ring", 4 * 10**6)
    assert four.time_s == pytest.approx(6 * (1e-3 + 1e6 / 1e9), rel=1e-6)  # 4 ranks: their own step (1 ms, 1 GB/s)


def _woken(world: int = 2):
    profile = _profile()
    profile.wake, profile.resume = {"2": 1.5e-3, "4": 0.0}, {"2": 2e-4, "4": 0.0}
    profile.handoff = {"2": 0.4e-3, "4": 0.0}
    return profile.topology(world, "fp32")


def test_the_first_call_after_computing_pays_the_wake_and_the_first_compute_after_a_call_the_resume():
    """ZeRO-1 on 2 ranks: the reduce-scatter comes after the backward, the all-gather after the
    optimizer step: both pay the 1.5 ms wake; the optimizer step comes right after the
    reduce-scatter: it pays the 0.2 ms resume; without them the same plan is exactly that much
    shorter."""
    from simpar.collectives import call_delay
    from simpar.sim.op_costs import OpCosts
    from simpar.strategies import build_plan

    scenario = make_scenario(model("tiny"), "zero1", 2, precision="fp32", topology="cpu-host")
    woken, plain = _woken(), _profile().topology(2, "fp32")
    plan = build_plan(scenario)
    costs = OpCosts(plan, scenario, woken)
    calls = [op for op in plan.programs[0].ops if type(op).__name__ == "Collective"]
    assert len(calls) == 2 and all(costs.wakes(0, op) for op in calls)
    assert call_delay(woken, True) == 1.5e-3 and call_delay(woken, False) == 0.0
    resumed = [op for op in plan.programs[0].ops if costs.resume(0, op) if type(op).__name__ == "Compute"]
    assert [op.phase for op in resumed] == ["step"] and costs.resume(0, resumed[0]) == 2e-4
    extra = simulate(scenario, topology=woken).step_time_s - simulate(scenario, topology=plain).step_time_s
    assert extra == pytest.approx(2 * 1.5e-3 + 2e-4, rel=1e-6)


def test_a_pipeline_send_after_computing_pays_the_handoff_not_the_collective_wake():
    """A handoff waits for one neighbour, a collective for its whole group: sends pay their own
    latency. 1F1B on 2 stages (no collective in its plan): the collective's wake changes nothing,
    the handoff's lengthens the step, and the fast path prices it as the full simulation does."""
    from simpar.collectives import call_delay

    scenario = make_scenario(model("tiny-deep"), "pp", 2, micro_batch=2, microbatches=4, precision="fp32",
                             topology="cpu-host")

    def step(wake: float, handoff: float, fast: bool = False) -> float:
        profile = _profile()
        profile.wake, profile.handoff = {"2": wake}, {"2": handoff}
        return simulate(scenario, topology=profile.topology(2, "fp32"), fast=fast).step_time_s

    profile = _profile()
    profile.wake, profile.handoff = {"2": 1.5e-3}, {"2": 0.4e-3}
    topo = profile.topology(2, "fp32")
    assert call_delay(topo, True, handoff=True) == 0.4e-3 and call_delay(topo, True) == 1.5e-3
    assert call_delay(topo, False, handoff=True) == 0.0
    assert step(1.5e-3, 0.0) == step(0.0, 0.0)
    assert step(0.0, 0.4e-3) > step(0.0, 0.0) + 0.4e-3  # at least one handoff on the critical path


def test_calls_back_to_back_pay_no_wake_and_the_fast_path_prices_wakes_as_the_full_one():
    from simpar.sim.op_costs import OpCosts
    from simpar.strategies import build_plan

    for strategy, kwargs in (("zero3", {}), ("ddp", {}), ("tp", {}), ("pp", {"microbatches": 4})):
        scenario = make_scenario(model("tiny-deep"), strategy, 2, micro_batch=2, precision="fp32",
                                 topology="cpu-host", **kwargs)
        topo = _woken()
        plan = build_plan(scenario)
        costs = OpCosts(plan, scenario, topo)
        ops = [op for op in plan.programs[0].ops if type(op).__name__ not in ("Alloc", "Free")]
        for before, op in zip(ops, ops[1:]):  # woken exactly where the op before computed
            if type(op).__name__ in ("Collective", "Send"):
                assert costs.wakes(0, op) == (type(before).__name__ in ("Compute", "Copy"))
        if strategy != "zero3":  # (the fast path leaves ZeRO-3's overlapping allocations to the full one)
            topo.core_slowdown = None  # (with ranks sharing cores the fast path is the full one)
            other = _woken()
            other.core_slowdown = None
            full, fast = simulate(scenario, topology=topo), simulate(scenario, topology=other, fast=True)
            assert fast.step_time_s == pytest.approx(full.step_time_s, rel=1e-9), strategy


def test_a_collective_after_a_longer_compute_pays_a_wake_grown_by_that_compute():
    """DDP on 4 ranks sharing 2 cores, one bucket: the all-reduce comes after the whole step's compute
    (the optimizer step before it counted round the step). With a wake curve that grows 0.2 s per s of
    compute beyond 3 ms, the step is longer by exactly 0.2 x (that compute's simulated time - 3 ms), read off the
    simulation's own timeline of the step without growth. A phase shorter than 3 ms pays no more."""
    from simpar.plan import Collective, Compute
    from simpar.sim.op_costs import OpCosts
    from simpar.sim.runner import Simulator
    from simpar.strategies import build_plan

    scenario = make_scenario(model("tiny-deep"), "ddp", 4, micro_batch=2, precision="fp32", topology="cpu-host")
    plan = build_plan(scenario)
    calls = [op for op in plan.programs[0].ops if isinstance(op, Collective)]
    assert len(calls) == 1

    def simulator(growth: float, phase: float = 3e-3) -> Simulator:
        profile = _profile()
        profile.wake, profile.wake_phase = {"4": 1e-3}, {"4": phase}
        profile.wake_curve = {"4": [[phase, phase + 1.0], [0.0, growth]]}
        sim = Simulator(plan, scenario, profile.topology(4, "fp32"), serial=True)
        sim.run()
        return sim

    plain, grown = simulator(0.0), simulator(0.2)
    computed = sum(plain.times[0][op.id][2] - plain.times[0][op.id][1]
                   for op in plan.programs[0].ops if isinstance(op, Compute))
    assert computed > 3e-3
    assert grown.env.now - plain.env.now == pytest.approx(0.2 * (computed - 3e-3), rel=1e-6)
    assert OpCosts(plan, scenario, grown.topology).wake(0, calls[0]) == pytest.approx(1e-3 + 0.2 * (computed - 3e-3))
    assert simulator(0.2, phase=computed + 1e-3).env.now == pytest.approx(plain.env.now, rel=1e-12)


def test_bad_profiles_and_flags_are_one_line_errors(tmp_path, cli):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SimparError, match="--hardware: .* is a version None profile"):
        HardwareProfile.load(str(bad))
    with pytest.raises(SimparError, match="--hardware: cannot read"):
        HardwareProfile.load(str(tmp_path / "missing.json"))
    with pytest.raises(SimparError, match="--precision: the hardware profile was calibrated for fp32"):
        _profile().topology(2, "bf16-mixed")
    good = tmp_path / "hw.json"
    _profile().save(str(good))
    result = cli("run", "--hardware", str(good), "--topology", "pcie")
    assert result.returncode == 2 and "--topology: --hardware gives the machine" in result.stderr
    result = cli("run", "--hardware", str(good), "--strategy", "zero2", "--gpus", "4", "--json", "-")
    assert result.returncode == 0 and json.loads(result.stdout)["sim"]["step_time_s"] > 0
    for args, message in [(("calibrate", "--gpus", "2,1"), "--gpus"), (("calibrate", "--backend", "nccl"), "--backend"),
                          (("validate", "--strategies", "zero9"), "--strategies: unknown 'zero9'")]:
        result = cli(*args)
        assert result.returncode == 2 and message in result.stderr, result.stderr


def test_validate_measures_in_rounds_and_judges_each_case_on_all_its_runs(monkeypatch):
    """Every case once, then every case again: a drift of the machine's speed falls on all of them."""
    import simpar.validate as validate

    order = []
    monkeypatch.setattr(validate, "measure", lambda *case: order.append(case[:2]) or {"step_time_s": len(order)})
    monkeypatch.setattr(validate, "judge", lambda profile, strategy, gpus, precision, runs: (strategy, gpus, runs))
    pairs = [("ddp", 2), ("tp", 4), ("pp", 8)]
    judged = validate.run_cases(None, pairs, "fp32", 3, 60.0, repeats=2)
    assert order == pairs + pairs
    assert judged == [(s, g, [{"step_time_s": i + 1}, {"step_time_s": i + 4}]) for i, (s, g) in enumerate(pairs)]


def test_a_pipeline_send_pays_the_latency_measured_with_as_many_ranks_runnable_as_at_that_moment():
    """Send costs by ranks runnable (interpolated between the measured world sizes, held at the ends);
    on 8 shared-core ranks a pipeline's sends meet fewer busy ranks than the calibration's pattern,
    where every rank calls at once: 1F1B is shorter than with every send at the 8-rank latency, and
    longer than with every send at the 2-rank one."""
    from simpar.collectives import point_to_point  # noqa: F401 (the path under test)

    profile = _profile()
    profile.ring = {"2": [0.5e-3, 2e9], "4": [1e-3, 2e9], "8": [3e-3, 2e9]}
    profile.handoff = {"2": 0.1e-3, "4": 0.5e-3, "8": 2e-3}
    topo = profile.topology(8, "fp32")
    assert topo.send_costs(2) == pytest.approx((0.1e-3, 0.5e-3))
    assert topo.send_costs(3) == pytest.approx((0.3e-3, 0.75e-3))
    assert topo.send_costs(8) == pytest.approx((2e-3, 3e-3)) == topo.send_costs(16)
    scenario = make_scenario(model("tiny-deep"), "pp", 8, micro_batch=2, microbatches=16, precision="fp32",
                             topology="cpu-host")

    def step(ring: dict, handoff: dict, tables: bool = True) -> float:
        profile.ring, profile.handoff = ring, handoff
        topology = profile.topology(8, "fp32")
        if not tables:
            topology.step_latency_by_ranks = topology.handoff_by_ranks = None
        return simulate(scenario, topology=topology, serial=True).step_time_s

    measured = step(profile.ring, profile.handoff)
    all_busy = step(profile.ring, profile.handoff, tables=False)  # every send at the world's (8) figures
    two = step({k: [0.5e-3, 2e9] for k in profile.ring}, {k: 0.1e-3 for k in profile.handoff})
    assert two < measured < all_busy


def test_a_compute_right_after_a_pipeline_receive_pays_its_own_resume():
    """1F1B on 2 stages: every compute right after a receive pays ``resume_after_recv`` (measured by the
    relay, stages taking turns), one right after a send or collective ``resume``."""
    from simpar.plan import Compute, Recv
    from simpar.sim.op_costs import OpCosts
    from simpar.strategies import build_plan

    scenario = make_scenario(model("tiny-deep"), "pp", 2, micro_batch=2, microbatches=4, precision="fp32",
                             topology="cpu-host")
    profile = _profile()
    profile.resume, profile.resume_after_recv = {"2": 2e-4}, {"2": 7e-4}
    plan = build_plan(scenario)
    costs = OpCosts(plan, scenario, profile.topology(2, "fp32"))
    for pi, prog in enumerate(plan.programs):
        last = None
        for op in prog.ops:
            if isinstance(op, Compute) and op.device == "gpu":
                expected = 7e-4 if isinstance(last, Recv) else (2e-4 if type(last).__name__ in ("Send", "Collective")
                                                                 else 0.0)
                assert costs.resume(pi, op) == expected
            if type(op).__name__ not in ("Alloc", "Free"):
                last = op
    assert sum(costs.resume(pi, op) == 7e-4 for pi, p in enumerate(plan.programs) for op in p.ops) == 8



def test_a_world_beyond_the_largest_measured_reads_its_latencies_by_the_ranks_per_core():
    """Tables per world size read at the nearest measured world (on a log scale); beyond the largest, where the
    ranks outnumber the cores, a latency grows with the ranks per core (each call waits out every rank's time
    slice) and a bandwidth stays; where they fit the cores, nothing is scaled."""
    profile = _profile()  # 2 cores; rings measured at 2 and 4 ranks
    profile.wake, profile.handoff = {"2": 1e-3, "4": 2e-3}, {"2": 1e-4, "4": 3e-4}
    profile.worker_server = {"4": [1e-3, 2e-4, 1e9]}
    assert profile.ring_step(4) == (1e-3, 1e9) and profile.ring_step(2) == (50e-6, 2e9)
    assert profile.ring_step(16) == pytest.approx((4e-3, 1e9))  # 16 / 4: four times the ranks per core
    sixteen = profile.topology(16, "fp32")
    assert sixteen.wake_latency == pytest.approx(8e-3) and sixteen.handoff_latency == pytest.approx(1.2e-3)
    assert sixteen.worker_server_wake == pytest.approx(4e-3)
    assert sixteen.worker_server_leg == pytest.approx((8e-4, 1e9))
    assert profile.topology(3, "fp32").wake_latency == pytest.approx(2e-3)  # nearest: 4 (log 3 is nearer 4)
    wide = _profile()
    wide.machine = dict(wide.machine, cores=16)  # 16 cores: 16 ranks fit, read at 4 as measured
    assert wide.ring_step(16) == (1e-3, 1e9)
