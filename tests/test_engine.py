import numpy as np
import pytest
import simpy

from simpar import topologies
from simpar.engine import Network, max_min_rates
from simpar.topologies import Link, Topology


def run(topo, transfers):
    env = simpy.Environment()
    net = Network(env, topo)
    events = [net.transfer(*t) for t in transfers]
    env.run()
    return env, net, events


def test_single_transfer_pays_latency_then_bytes_over_bandwidth():
    topo = topologies.build("ring", 4, bandwidth=10e9, latency=2e-6)
    env, net, _ = run(topo, [("gpu0", "gpu2", 10**9)])
    assert env.now == pytest.approx(2 * 2e-6 + 1e9 / 10e9)  # two hops of latency, one bottleneck
    assert net.sent["gpu0"] == net.received["gpu2"] == 10**9
    assert net.timeline[0].end == pytest.approx(env.now)


def test_steps_pay_the_latency_once_per_step():
    topo = topologies.build("ring", 2, bandwidth=1e9, latency=1e-3)
    env, *_ = run(topo, [("gpu0", "gpu1", 10**6, 5)])
    assert env.now == pytest.approx(5 * 1e-3 + 1e-3)


def test_two_transfers_on_one_channel_share_it_equally():
    topo = topologies.build("ring", 4, bandwidth=10e9, latency=0)
    env, net, _ = run(topo, [("gpu0", "gpu1", 10**9), ("gpu0", "gpu1", 10**9)])
    assert env.now == pytest.approx(2e9 / 10e9)
    assert [r.end for r in net.timeline] == pytest.approx([0.2, 0.2])


def test_opposite_directions_do_not_contend_full_duplex():
    topo = topologies.build("ring", 4, bandwidth=10e9, latency=0)
    env, *_ = run(topo, [("gpu0", "gpu1", 10**9), ("gpu1", "gpu0", 10**9)])
    assert env.now == pytest.approx(0.1)


def test_short_transfer_leaves_its_share_to_the_long_one():
    topo = topologies.build("ring", 4, bandwidth=10e9, latency=0)
    env, net, _ = run(topo, [("gpu0", "gpu1", 10**9), ("gpu0", "gpu1", 3 * 10**9)])
    short, long = net.timeline
    assert short.end == pytest.approx(0.2)  # 1 GB at 5 GB/s while both stream
    assert long.end == pytest.approx(0.2 + 2e9 / 10e9)  # then 2 GB alone at 10 GB/s


def test_max_min_fairness_gives_unused_share_to_others():
    # Flow 0 crosses channels 0 and 1, flow 1 only channel 0, flow 2 only channel 1.
    # Channel 0 has 10, channel 1 has 4: flows 0 and 2 get 2 each (channel 1's fair share),
    # leaving 8 of channel 0 to flow 1.
    rates = max_min_rates(np.array([0, 0, 1, 2]), np.array([0, 1, 0, 1]), np.array([10.0, 4.0]), 3)
    assert rates == pytest.approx([2, 8, 2])


def test_link_bytes_are_counted_on_every_hop_per_direction():
    topo = Topology("line")
    for name in ("a", "b", "c"):
        topo.add_node(name, "gpu")
    topo.add_node("sw", "eth-switch")
    topo.connect("a", "sw", Link("eth", 1e9, 0))
    topo.connect("sw", "b", Link("eth", 1e9, 0))
    topo.connect("sw", "c", Link("eth", 1e9, 0))
    _, net, _ = run(topo, [("a", "b", 100), ("a", "c", 50), ("c", "a", 7)])
    carried = {name: b for name, _, b in net.busiest_channels()}
    assert carried == {"a->sw": 150, "sw->b": 100, "sw->c": 50, "c->sw": 7, "sw->a": 7}


def test_transfer_to_self_or_of_zero_bytes_is_free():
    topo = topologies.build("ring", 2, bandwidth=1e9, latency=1)
    env, net, _ = run(topo, [("gpu0", "gpu0", 10**9), ("gpu0", "gpu1", 0)])
    assert env.now == 0 and not net.sent
