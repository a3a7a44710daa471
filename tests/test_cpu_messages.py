"""What a message costs the executor's CPU ranks beyond a ring step: a one-way message (a Worker-Server
leg, a pipeline send) half a calibrated step, on half-duplex rank ends; a pipeline send's isend holds
its sender (``send_issue``)."""

from dataclasses import replace

import pytest

from simpar.models import model
from simpar.plan import Send
from simpar.scenario import make_scenario
from simpar.sim import simulate
from tests.test_calibrate import _profile


def test_a_one_way_message_costs_half_a_ring_step_and_a_server_takes_its_workers_in_turn():
    """A rank's core works for what it sends and what it receives: a ring step (both at once) is priced
    as calibrated, a Worker-Server leg (one way) at half its latency and twice its bandwidth; the
    server's end carries every worker's push, so at 4 ranks each phase is three legs long. The bytes
    are the algorithm's, unchanged."""
    from simpar.collective_run import simulate_collective

    leg = 50e-6 / 2 + 2e6 / (2 * 2e9)  # one way: 2 MB, half the 50 us, at 4 GB/s
    two = simulate_collective(_profile().topology(2, "fp32"), "allreduce", "ps", 2 * 10**6)
    assert two.time_s == pytest.approx(2 * leg, rel=1e-6)  # push, then pull
    leg = 1e-3 / 2 + 2e6 / (2 * 1e9)  # 4 ranks: their step is 1 ms and 1 GB/s
    four = simulate_collective(_profile().topology(4, "fp32"), "allreduce", "ps", 2 * 10**6)
    assert four.time_s == pytest.approx(2 * 3 * leg, rel=1e-6)
    assert [r["bytes_sent"] for r in four.ranks] == [6 * 10**6, 2 * 10**6, 2 * 10**6, 2 * 10**6]
    assert [r["bytes_received"] for r in four.ranks] == [6 * 10**6, 2 * 10**6, 2 * 10**6, 2 * 10**6]


def test_a_half_duplex_link_is_one_channel_for_both_ways():
    from simpar.topologies.graph import Link, Topology

    topo = Topology("t")
    for name in ("a", "b", "c"):
        topo.add_node(name, "gpu")
    topo.connect("a", "b", Link("eth", 4e9, 1e-6, half_duplex=True))
    topo.connect("b", "c", Link("eth", 3e9, 1e-6, reverse_bandwidth=1e9))
    assert topo.num_channels == 3 and topo.route("a", "b") == topo.route("b", "a") == (0,)
    assert [topo.channel_name(c) for c in range(3)] == ["a<->b", "b->c", "c->b"]
    topo.set_efficiency("eth", lambda rate: 0.5)
    assert list(topo.capacities) == [2e9, 1.5e9, 0.5e9]


def test_a_worker_server_all_reduce_is_priced_as_measured_in_the_steps_pattern():
    """Where the calibration measured the executor's Worker-Server all-reduce on its own
    (``worker_server``: its wake, each one-way leg's latency and bandwidth), its legs cost that, taken
    in turn by the server (push, then pull: 2(k - 1) legs), and its first call after computing pays its
    own wake in place of the ring's; the ring's pricing, and the bytes, do not change."""
    from simpar.collective_run import simulate_collective
    from simpar.strategies import build_plan

    ring_before = simulate_collective(_profile().topology(4, "fp32"), "allreduce", "ring", 2 * 10**6).time_s
    def calibrated():
        profile = _profile()
        profile.wake = {"2": 1e-3, "4": 2e-3}  # the ring's first call after computing
        return profile

    profile = calibrated()
    profile.worker_server = {"2": [0.3e-3, 0.4e-3, 8e9], "4": [1.5e-3, 0.25e-3, 4e9]}
    leg = 0.4e-3 + 2e6 / 8e9
    two = simulate_collective(profile.topology(2, "fp32"), "allreduce", "ps", 2 * 10**6)
    assert two.time_s == pytest.approx(2 * leg, rel=1e-6)
    leg = 0.25e-3 + 2e6 / 4e9
    four = simulate_collective(profile.topology(4, "fp32"), "allreduce", "ps", 2 * 10**6)
    assert four.time_s == pytest.approx(2 * 3 * leg, rel=1e-6)
    assert [r["bytes_sent"] for r in four.ranks] == [6 * 10**6, 2 * 10**6, 2 * 10**6, 2 * 10**6]
    ring = simulate_collective(profile.topology(4, "fp32"), "allreduce", "ring", 2 * 10**6)
    assert ring.time_s == ring_before

    # in a step: dp's all-reduce after the backward pays the Worker-Server wake, ddp's the ring's
    topology = profile.topology(2, "fp32")
    assert topology.collective_wake(0.0, "ps") == pytest.approx(0.3e-3)
    assert topology.collective_wake(0.0, "ring") == topology.collective_wake(0.0) == 1e-3
    scenario = make_scenario(model("tiny-deep"), "dp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    plan = build_plan(scenario)
    measured = simulate(scenario, topology=topology, serial=True)
    priced = simulate(scenario, topology=calibrated().topology(2, "fp32"), serial=True)
    call = [e for e in measured.op_timeline[0]["ops"] if e["class"] == "collectives"]
    assert len(call) == 1 and plan.programs[0].ops[call[0]["op"]].algo == "ps"
    before = [e for e in priced.op_timeline[0]["ops"] if e["class"] == "collectives"][0]
    nbytes = plan.programs[0].ops[call[0]["op"]].nbytes
    # the call's wake and legs change by what the two pricings differ in, its handling does not
    old = calibrated().topology(2, "fp32")
    old_legs = 2 * (old.route_latency("gpu0", "gpu1") / 2 + nbytes / old.bottleneck("gpu0", "gpu1"))
    new_legs = 2 * (0.4e-3 + nbytes / 8e9)
    assert (call[0]["end"] - call[0]["start"]) - (before["end"] - before["start"]) == pytest.approx(
        (0.3e-3 - old.wake_latency) + new_legs - old_legs, rel=1e-6)
    # the fast path (symmetric replicas) prices it the same
    assert simulate(scenario, topology=topology).step_time_s == pytest.approx(measured.step_time_s, rel=1e-9)


def test_a_call_after_a_short_compute_pays_a_share_of_the_wake():
    """The first call after computing pays more than the calls after it, and more the longer the compute
    (2 ranks, 4 KiB: 0.9 ms back to back, 1.7 after 0.3 ms of compute, 3.2 after the unit). The profile
    measures it after a short compute too (``wake_short``); below the unit's compute the wake is
    interpolated through (0, 0), that point and the unit's, as a share of the algorithm's wake; beyond,
    it is whole and grows. A tensor-parallel piece's all-reduce pays its share."""
    from simpar.strategies import build_plan
    from simpar.sim.op_costs import OpCosts

    profile = _profile()
    profile.wake, profile.wake_phase = {"2": 1e-3}, {"2": 2e-3}
    profile.wake_curve = {"2": [[2e-3, 3e-3], [0.0, 0.1e-3]]}  # growing 0.1 s a second of compute
    profile.worker_server = {"2": [0.5e-3, 1e-4, 1e9]}
    whole = profile.topology(2, "fp32")
    assert whole.wake_share(0.0) == whole.wake_share(1e-3) == 1.0  # not measured: paid whole
    profile.wake_short = {"2": [[0.5e-3, 0.6e-3]]}
    topology = profile.topology(2, "fp32")
    shares = [topology.wake_share(p) for p in (0.0, 0.25e-3, 0.5e-3, 1.25e-3, 2e-3, 5e-3)]
    assert shares == pytest.approx([0.0, 0.3, 0.6, 0.8, 1.0, 1.0])
    assert topology.collective_wake(1.25e-3) == pytest.approx(0.8e-3)
    assert topology.collective_wake(1.25e-3, "ps") == pytest.approx(0.4e-3)  # the same share of its own
    assert topology.collective_wake(4e-3) == pytest.approx(1e-3 + 0.1 * 2e-3)  # whole, and the growth
    topology.wake_short = ((3e-3, 0.9e-3),)  # no point below the unit's compute: a straight line to it
    assert topology.wake_share(1e-3) == pytest.approx(0.5)
    # two points (phase_worker's short and mid loops): through each, in the order of their compute; a point
    # costlier than the whole wake is held to it
    topology.wake_short = ((1.2e-3, 1.5e-3), (0.4e-3, 0.5e-3))
    shares = [topology.wake_share(p) for p in (0.2e-3, 0.4e-3, 0.8e-3, 1.2e-3, 1.6e-3, 2e-3)]
    assert shares == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    topology.wake_short = ((0.4e-3, 0.2e-3), (1.2e-3, 0.6e-3))  # a steep rise between them, level after
    assert [topology.wake_share(p) for p in (0.8e-3, 1.6e-3)] == pytest.approx([0.4, 0.8])

    scenario = make_scenario(model("tiny-deep"), "tp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    plan = build_plan(scenario)
    short, paid = (simulate(scenario, topology=p.topology(2, "fp32"), serial=True) for p in (profile, _whole(profile)))
    costs = OpCosts(plan, scenario, profile.topology(2, "fp32"))
    calls = [e for e in short.op_timeline[0]["ops"] if e["class"] == "collectives"]
    before = {e["op"]: e for e in paid.op_timeline[0]["ops"] if e["class"] == "collectives"}
    assert len(calls) == len(before) > 0
    phases = [costs.after_compute[(0, e["op"])] for e in calls if (0, e["op"]) in costs.after_compute]
    assert sum(p < 0.5e-3 for p in phases) > len(phases) / 2  # most follow a piece's compute: short of the unit
    for e in calls:  # each call after a piece pays what its share, at the program's pace, leaves off the whole wake
        phase = costs.paces.get((0, e["op"]), costs.after_compute.get((0, e["op"])))
        saved = 0.0 if phase is None else 1e-3 * (1 - costs.topology.wake_share(phase))
        was = before[e["op"]]
        assert (was["end"] - was["start"]) - (e["end"] - e["start"]) == pytest.approx(saved, abs=1e-9)
    assert short.step_time_s < paid.step_time_s


def test_a_call_after_a_short_compute_is_priced_at_what_the_short_loop_measured():
    """``wake_short`` holds what the first call after a short compute cost beyond the ring's price of that
    call, below zero where it cost less (its calls go nearer the back-to-back pace than the step latency in
    a step, which is measured after a unit's compute): at that compute the simulator charges the measured
    call; between it and the unit's compute it interpolates towards the whole wake."""
    from simpar.calibrate.fits import ring_price

    profile = _profile()
    alpha, bandwidth = profile.ring["2"]
    profile.wake, profile.wake_phase = {"2": 1e-3}, {"2": 2e-3}
    measured = 0.6 * ring_price("allreduce", 2**18, 2, alpha, bandwidth)  # cheaper than its steps
    profile.wake_short = {"2": [[0.5e-3, measured - ring_price("allreduce", 2**18, 2, alpha, bandwidth)]]}
    topology = profile.topology(2, "fp32")
    assert topology.wake_share(0.5e-3) < 0 < topology.wake_share(1.5e-3) < topology.wake_share(2e-3) == 1.0
    assert topology.collective_wake(0.5e-3) + ring_price("allreduce", 2**18, 2, alpha, bandwidth) == \
        pytest.approx(measured)

    # in a step: tp's calls after its pieces pay less than their steps (the wake taken off the steps' latency),
    # the replayed step equal to the full simulation
    scenario = make_scenario(model("tiny-deep"), "tp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    none_off = replace(profile, wake_short={"2": [[0.5e-3, 0.0]]})
    full, replayed, at_steps = (simulate(scenario, topology=p.topology(2, "fp32"), serial=True, replay=r)
                                for p, r in ((profile, False), (profile, True), (none_off, False)))
    fixed = simulate(scenario, topology=profile.topology(2, "fp32"), serial=True, fast=True)
    assert full.step_time_s == pytest.approx(replayed.step_time_s, rel=1e-9) == fixed.step_time_s
    assert full.step_time_s < at_steps.step_time_s


def test_a_call_after_no_compute_is_anchored_at_the_back_to_back_pace():
    """The step latency is fitted on a series of calls after a unit's compute and carries its stalls; a call
    after no compute goes at the back-to-back pace (tensor-parallel calls after short pieces cost less than
    their steps at the step latency). So the short computes' curve starts from the
    back-to-back ring's price of the short loops' all-reduce less the step's, not from nothing: where ranks fit
    the cores and the profile has the back-to-back fit; older profiles and more ranks than cores as before."""
    from simpar.calibrate.profile import SHORT_SIZE
    from simpar.calibrate.fits import ring_price

    profile = _profile()
    profile.wake, profile.wake_phase = {"2": 1e-3, "4": 1e-3}, {"2": 2e-3, "4": 2e-3}
    profile.wake_short = {"2": [[0.5e-3, -0.1e-3]], "4": [[0.5e-3, -0.1e-3]]}
    older = profile.topology(2, "fp32")
    assert older.wake_anchor == 0.0 and older.wake_share(0.0) == 0.0  # no back-to-back fit: as before
    profile.samples = {"shared": {"2": {"back_to_back": [20e-6, 2e9]}, "4": {"back_to_back": [0.2e-3, 1e9]}}}
    anchor = (ring_price("allreduce", SHORT_SIZE, 2, 20e-6, 2e9) - ring_price("allreduce", SHORT_SIZE, 2, 50e-6, 2e9))
    assert anchor == pytest.approx(-60e-6)  # two steps, each 30 us quicker back to back
    topology = profile.topology(2, "fp32")
    assert topology.wake_anchor == pytest.approx(anchor)
    # through (0, the anchor), the short loop's point (unchanged) and the whole wake at the unit's compute
    shares = [topology.wake_share(p) for p in (0.0, 0.25e-3, 0.5e-3, 1.25e-3, 2e-3)]
    assert shares == pytest.approx([-0.06, -0.08, -0.1, 0.45, 1.0])
    assert topology.collective_wake(0.0) == pytest.approx(anchor)
    assert profile.topology(4, "fp32").wake_anchor == 0.0  # 4 ranks on 2 cores: every call waits for slices

    # in a step: tp's calls after its pieces pay the difference, the replayed and fixed steps equal the full one
    scenario = make_scenario(model("tiny-deep"), "tp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    full, replayed = (simulate(scenario, topology=topology, serial=True, replay=r) for r in (False, True))
    fixed = simulate(scenario, topology=profile.topology(2, "fp32"), serial=True, fast=True)
    assert full.step_time_s == pytest.approx(replayed.step_time_s, rel=1e-9) == fixed.step_time_s
    assert full.step_time_s < simulate(scenario, topology=older, serial=True).step_time_s


def test_a_brief_loop_beside_the_forward_pieces_prices_their_calls_from_its_point():
    """tp's forward pieces compute for less than the short loop (at 2 ranks 0.20-0.26 ms against 0.36-0.41), and
    their calls cost about what a call after the short loop does; interpolated from the back-to-back pace they
    read 11-17 % short. A brief loop's point beside them (the same extra, a shorter compute) lifts what every
    call after a compute shorter than the short loop's pays, and nothing after a longer one."""
    profile = _profile()
    profile.wake, profile.wake_phase = {"2": 1e-3}, {"2": 2e-3}
    profile.samples = {"shared": {"2": {"back_to_back": [20e-6, 2e9]}}}
    profile.wake_short = {"2": [[0.4e-3, 0.5e-3], [0.8e-3, 0.6e-3]]}
    two = profile.topology(2, "fp32")
    profile.wake_short = {"2": [[0.3e-3, 0.5e-3], [0.4e-3, 0.5e-3], [0.8e-3, 0.6e-3]]}
    three = profile.topology(2, "fp32")
    assert three.collective_wake(0.3e-3) == pytest.approx(0.5e-3)  # through the brief point
    assert two.collective_wake(0.3e-3) < 0.5e-3  # on the line from the back-to-back pace
    for phase in (0.1e-3, 0.25e-3, 0.35e-3):
        assert three.collective_wake(phase) > two.collective_wake(phase)
    for phase in (0.0, 0.4e-3, 0.6e-3, 1.5e-3):
        assert three.collective_wake(phase) == pytest.approx(two.collective_wake(phase))
    scenario = make_scenario(model("tiny-deep"), "tp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    assert simulate(scenario, topology=three, serial=True).step_time_s > \
        simulate(scenario, topology=two, serial=True).step_time_s


def test_the_calls_after_short_computes_are_read_at_their_programs_pace():
    """A call's wake after a short compute follows the rank's pace over its calls (benchmarks/call_pace.py): every
    ring collective of a program after a compute shorter than ``wake_phase`` is priced at the mean of those
    computes; the compute before each is still recorded as it is, and ZeRO-3's gathers (their own series'
    points) and a program's only short call keep their own. The replayed and the fixed-duration steps equal
    the full simulation."""
    from simpar.plan import Collective
    from simpar.strategies import build_plan
    from simpar.sim.op_costs import OpCosts

    profile = _profile()
    profile.wake, profile.wake_phase = {"2": 1e-3}, {"2": 1.2e-3}
    profile.wake_short = {"2": [[0.3e-3, 0.2e-3], [0.4e-3, 0.5e-3], [0.8e-3, 0.7e-3]]}
    topology = profile.topology(2, "fp32")

    def short_calls(strategy):
        scenario = make_scenario(model("tiny-deep"), strategy, 2, micro_batch=2, precision="fp32",
                                 topology="cpu-host")
        plan = build_plan(scenario)
        costs = OpCosts(plan, scenario, topology)
        calls = [(pi, op) for pi, prog in enumerate(plan.programs) for op in prog.ops if isinstance(op, Collective)
                 and costs.after_compute.get((pi, op.id), 1.0) < 1.2e-3]
        return scenario, costs, calls

    scenario, costs, calls = short_calls("tp")  # (its ranks' programs are alike: one is kept)
    phases = [costs.after_compute[(pi, op.id)] for pi, op in calls]
    assert len(phases) > 10 and max(phases) > 2 * min(phases)  # forward and backward pieces differ
    mean = sum(phases) / len(phases)
    for pi, op in calls:
        assert costs.paces[(pi, op.id)] == pytest.approx(mean)
        assert costs.wake(pi, op) == pytest.approx(topology.collective_wake(mean) + costs.handling(op))
    own = {(pi, op.id): topology.collective_wake(costs.after_compute[(pi, op.id)]) for pi, op in calls}
    assert any(costs.wake(pi, op) - costs.handling(op) != pytest.approx(own[(pi, op.id)]) for pi, op in calls)
    full, replayed = (simulate(scenario, topology=profile.topology(2, "fp32"), serial=True, replay=r)
                      for r in (False, True))
    fixed = simulate(scenario, topology=profile.topology(2, "fp32"), serial=True, fast=True)
    assert full.step_time_s == pytest.approx(replayed.step_time_s, rel=1e-9)
    assert full.step_time_s == pytest.approx(fixed.step_time_s, rel=1e-9)

    _, costs, calls = short_calls("zero3")  # its gathers keep their own compute
    gathers = [(pi, op) for pi, op in calls if costs._sharded_gather(op)]
    assert gathers and not any((pi, op.id) in costs.paces for pi, op in gathers)
    _, costs, calls = short_calls("ddp")  # one call after the backward: its own
    assert len(calls) <= 1 and not costs.paces


def test_a_steps_first_call_after_the_optimizer_is_read_at_its_own_compute_not_the_pace():
    """tp's first call follows the backward's last call, the optimizer step and the embedding: not the pieces'
    pace. With every call's compute below ``wake_phase`` the others share their mean, and it keeps its own (the
    compute since the previous call, round the step, holding the step op)."""
    from simpar.plan import Collective
    from simpar.sim.op_costs import OpCosts
    from simpar.strategies import build_plan

    profile = _profile()
    profile.wake, profile.wake_phase = {"2": 1e-3}, {"2": 50e-3}  # every tp call after a "short" compute
    profile.wake_short = {"2": [[0.3e-3, 0.2e-3], [0.4e-3, 0.5e-3], [0.8e-3, 0.7e-3]]}
    topology = profile.topology(2, "fp32")
    scenario = make_scenario(model("tiny-deep"), "tp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    plan = build_plan(scenario)
    costs = OpCosts(plan, scenario, topology)
    calls = [op for op in plan.programs[0].ops if isinstance(op, Collective) and (0, op.id) in costs.after_compute]
    first, rest = calls[0], calls[1:]  # (a call after a call pays no wake)
    assert first is next(op for op in plan.programs[0].ops if isinstance(op, Collective)) and len(rest) > 10
    assert (0, first.id) not in costs.paces
    assert costs.after_compute[(0, first.id)] > max(costs.after_compute[(0, op.id)] for op in rest)
    assert costs.wake(0, first) == pytest.approx(topology.collective_wake(costs.after_compute[(0, first.id)]))
    mean = sum(costs.after_compute[(0, op.id)] for op in rest) / len(rest)
    assert all(costs.paces[(0, op.id)] == pytest.approx(mean) for op in rest)


def _whole(profile):
    return replace(profile, wake_short={})


def _late_profile(late: dict[str, float] | None):
    profile = _profile()
    profile.late_recv = late or {}
    return profile


def test_a_pipeline_receive_posted_after_its_send_waits_for_gloos_rendezvous():
    """gloo moves a message once both ends have posted it: a receive posted after its send (the data,
    in the simulator, sent ahead) lasts at least the calibrated ``late_recv`` and its bytes from its
    posting; one posted before its send waits for the data alone, as without the table. 1F1B on 2 stages
    meets both orders; the step grows by no more than the late receives' cost."""
    from simpar.plan import Recv
    from simpar.strategies import build_plan

    scenario = make_scenario(model("tiny-deep"), "pp", 2, micro_batch=2, microbatches=4, precision="fp32",
                             topology="cpu-host")
    plan = build_plan(scenario)
    late = 2e-3
    profile = _late_profile({"2": late})
    topology = profile.topology(2, "fp32")
    bandwidth = topology.bottleneck(topology.gpus[0], topology.gpus[1])
    waited, plain = (simulate(scenario, topology=p.topology(2, "fp32"), serial=True) for p in (profile, _profile()))

    def receives(result):
        """[(recv op, start, end, its send's start)] of a run."""
        sends = {program.ops[e["op"]].tag: e["start"] for timeline, program in zip(result.op_timeline, plan.programs)
                 for e in timeline["ops"] if isinstance(program.ops[e["op"]], Send)}
        return [(program.ops[e["op"]], e["start"], e["end"], sends[program.ops[e["op"]].tag])
                for timeline, program in zip(result.op_timeline, plan.programs) for e in timeline["ops"]
                if isinstance(program.ops[e["op"]], Recv)]

    # without the table a receive ends when its data lands, a fixed time after its send (2 ranks: one price)
    landing = {round(end - sent, 12) for _, start, end, sent in receives(plain) if end > start}
    assert len(landing) == 1
    kinds = {"late": 0, "early": 0}
    for op, start, end, sent in receives(waited):
        if sent <= start:  # its send went first
            kinds["late"] += 1
            assert end - start >= late + op.nbytes / bandwidth - 1e-12
        else:
            kinds["early"] += 1
            assert end - sent == pytest.approx(next(iter(landing)))
    assert kinds["late"] and kinds["early"]
    # the step grows by about the late receives on its critical path (all three here; 1 % for the cores'
    # sharing, whose slowdown shifts with who waits when)
    assert plain.step_time_s + late <= waited.step_time_s <= plain.step_time_s + 1.01 * kinds["late"] * (
        late + 16384 / bandwidth)
    assert simulate(scenario, topology=_late_profile(None).topology(2, "fp32"), serial=True).step_time_s == \
        plain.step_time_s


def test_the_late_receive_is_read_at_the_ranks_runnable_and_fitted_beyond_its_bytes():
    """The table by world size is read like the send's (interpolated by the ranks runnable, held at the
    ends); the calibration's figure is each size's mean receive (the tail included) less its bytes at the
    ring's bandwidth, averaged over the sizes."""
    from simpar.calibrate.pipeline_bench import late_recv_cost

    topology = _late_profile({"2": 1e-3, "4": 5e-3}).topology(4, "fp32")
    assert [topology.late_recv(k) for k in (1, 2, 3, 4, 8)] == pytest.approx([1e-3, 1e-3, 3e-3, 5e-3, 5e-3])
    assert _profile().topology(2, "fp32").late_recv(2) == 0.0
    ranks = [{"4096": [0.2e-3, 4.0e-3], "65536": [0.3e-3]}, {"4096": [0.3e-3], "65536": [4.1e-3, 0.2e-3]}]
    rate = 65536 / 1e-4  # 64 KiB in 0.1 ms
    expected = ((4.5e-3 / 3 - 4096 / rate) + (4.6e-3 / 3 - 1e-4)) / 2
    assert late_recv_cost(ranks, rate) == pytest.approx(expected)
    assert late_recv_cost([{"4096": [1e-6]}], 1e3) == 0.0  # never below nothing
    assert late_recv_cost([], rate) == 0.0
