"""A pipeline receive posted after its send, priced by the ranks computing while it waits
(``late_recv_busy``, ``busy_late_worker``) instead of by the ranks runnable read off a table measured with
every rank computing."""

import pytest

from simpar.models import model
from simpar.plan import Recv, Send
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.strategies import build_plan
from tests.test_calibrate import _profile


def _pp4(late=None, busy=None):
    profile = _profile()
    profile.slowdown = {"1": 1.0, "2": 1.0, "4": 2.0}
    profile.late_recv = late or {}
    profile.late_recv_busy = busy or {}
    return profile


def _scenario():
    return make_scenario(model("tiny-deep"), "pp", 4, micro_batch=2, microbatches=8, precision="fp32",
                         topology="cpu-host")


def test_the_topology_reads_the_busy_table_at_the_ranks_computing_else_the_old_one():
    topology = _pp4({"2": 1e-3, "4": 5e-3}, {"4": {"1": 1e-3, "2": 3e-3, "3": 6e-3}}).topology(4, "fp32")
    # by the ranks computing: interpolated, held at the ends (none computing reads as one)
    assert [topology.late_recv(4, c) for c in (0, 1, 2, 3, 4)] == pytest.approx([1e-3, 1e-3, 3e-3, 6e-3, 6e-3])
    assert topology.late_recv(3) == pytest.approx(3e-3)  # no count given: the table by ranks runnable
    # a profile measured for other world sizes only, or an older one without the table: by ranks runnable
    for profile in (_pp4({"2": 1e-3, "4": 5e-3}, {"8": {"1": 9.0}}), _pp4({"2": 1e-3, "4": 5e-3})):
        topology = profile.topology(4, "fp32")
        assert topology.late_recv_by_computing is None
        assert topology.late_recv(3, 1) == pytest.approx(3e-3)


def test_a_late_receive_is_priced_at_the_ranks_computing_when_it_is_posted(monkeypatch):
    """The simulator hands the topology the ranks computing at each late receive's posting; each such receive
    lasts at least what the table says for them, and a table flat at one figure prices the step exactly as
    the old table flat at that figure."""
    from simpar.topologies.graph import Topology

    table = {"1": 1e-3, "2": 3e-3, "3": 6e-3}
    profile = _pp4({"2": 9e-3, "4": 9e-3}, {"4": table})
    seen = []
    original = Topology.late_recv

    def spy(self, runnable, computing=None):
        price = original(self, runnable, computing)
        seen.append((computing, price))
        return price

    monkeypatch.setattr(Topology, "late_recv", spy)
    result = simulate(_scenario(), topology=profile.topology(4, "fp32"), serial=True)
    monkeypatch.setattr(Topology, "late_recv", original)
    assert seen and all(isinstance(c, int) and 0 <= c <= 4 for c, _ in seen)
    assert all(price < 9e-3 for _, price in seen)  # never the table by ranks runnable
    assert {c for c, _ in seen} - {0, 1}  # the pipeline posts some with more than one rank computing
    plan = build_plan(_scenario())
    sends = {program.ops[e["op"]].tag: e["start"] for timeline, program in zip(result.op_timeline, plan.programs)
             for e in timeline["ops"] if isinstance(program.ops[e["op"]], Send)}
    late = [e["end"] - e["start"] for timeline, program in zip(result.op_timeline, plan.programs)
            for e in timeline["ops"] if isinstance(program.ops[e["op"]], Recv)
            and sends[program.ops[e["op"]].tag] <= e["start"]]
    assert late and min(late) >= 1e-3 - 1e-12
    flat, old = _pp4({"2": 2e-3, "4": 2e-3}, {"4": {"1": 2e-3, "3": 2e-3}}), _pp4({"2": 2e-3, "4": 2e-3})
    assert simulate(_scenario(), topology=flat.topology(4, "fp32"), serial=True).step_time_s == \
        simulate(_scenario(), topology=old.topology(4, "fp32"), serial=True).step_time_s


def test_the_busy_table_averages_over_the_counts_every_profile_has():
    from simpar.calibrate.average import average_profiles

    one, two = _pp4(busy={"4": {"1": 1e-3, "2": 3e-3, "3": 5e-3}}), _pp4(busy={"4": {"1": 2e-3, "2": 5e-3}})
    averaged = average_profiles([one, two], ["a", "b"], common=True)
    assert averaged.late_recv_busy == {"4": pytest.approx({"1": 1.5e-3, "2": 4e-3})}
    older = _pp4()  # calibrated before the table: left out of its average, not refused
    assert average_profiles([one, older], ["a", "b"]).late_recv_busy == {"4": pytest.approx(one.late_recv_busy["4"])}


@pytest.mark.slow
def test_busy_late_worker_times_one_pairs_late_receives_beside_each_count_of_busy_ranks():
    from simpar.calibrate.pipeline_bench import LATE_SIZES, busy_late_worker
    from simpar.real.launch import launch

    laps = 4
    ranks = launch(busy_late_worker, 3, (laps,), timeout=300)
    assert ranks[2] == {}  # the third rank only computes, or waits
    for pair in ranks[:2]:
        assert set(pair) == {"1", "2"}  # the sender alone computing, then one more rank beside it
        for sizes in pair.values():
            assert set(sizes) == {str(s) for s in LATE_SIZES}
            # roles swap lap by lap: each rank receives in half of the timed laps
            assert all(len(times) == laps // 2 and all(t > 0 for t in times) for times in sizes.values())
