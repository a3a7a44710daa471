import pytest

from simpar import SimparError, topologies


@pytest.mark.parametrize("name", list(topologies.PRESETS))
def test_every_preset_builds_and_routes_between_all_gpu_pairs(name):
    gpus = min(4, topologies.PRESETS[name].max_gpus)
    topo = topologies.build(name, gpus)
    assert len(topo.gpus) == gpus
    for a in topo.gpus:
        for b in topo.gpus:
            assert (len(topo.route(a, b)) > 0) == (a != b)


def route_names(topo, a, b):
    return [topo.channel_name(c) for c in topo.route(a, b)]


def test_dgx_routes_nvswitch_inside_a_node_and_the_gpus_own_nic_between_nodes():
    topo = topologies.build("dgx-a100", 32)
    assert route_names(topo, "n0.gpu2", "n0.gpu5") == ["n0.gpu2->n0.nvswitch", "n0.nvswitch->n0.gpu5"]
    between = route_names(topo, "n0.gpu5", "n3.gpu5")
    assert between[1:3] == ["n0.pcie-sw2->n0.nic5", "n0.nic5->ib-leaf0"]
    assert between[-2:] == ["n3.nic5->n3.pcie-sw2", "n3.pcie-sw2->n3.gpu5"]
    assert not any(".gpu" in hop.split("->")[1] for hop in between[:-1]), "GPUs must not forward"


def test_dgx_fabric_crosses_the_core_only_between_leaves():
    topo = topologies.build("dgx-h100", 8 * 40)
    assert "ib-core" not in " ".join(route_names(topo, "n0.gpu0", "n15.gpu0"))
    assert "ib-leaf0->ib-core" in route_names(topo, "n0.gpu0", "n16.gpu0")


def test_pcie_tree_offload_path_reaches_host_memory_through_the_switch():
    topo = topologies.build("pcie", 8)
    assert route_names(topo, "gpu5", "host") == ["gpu5->pcie-sw1", "pcie-sw1->cpu", "cpu->host"]
    assert route_names(topo, "gpu0", "gpu1") == ["gpu0->pcie-sw0", "pcie-sw0->gpu1"]


def test_nvlink_ring_uses_nvlink_for_neighbours_and_pcie_otherwise():
    topo = topologies.build("nvlink-ring", 8)
    assert route_names(topo, "gpu3", "gpu4") == ["gpu3->gpu4"]
    assert all(topo.channel_kind(c) == "pcie" for c in topo.route("gpu0", "gpu4"))


def test_uniform_ring_relays_around_the_ring():
    topo = topologies.build("ring", 8, bandwidth=1e9, latency=1e-6)
    assert len(topo.route("gpu0", "gpu3")) == 3
    assert topo.route_latency("gpu0", "gpu3") == pytest.approx(3e-6)


def test_star_has_a_dedicated_server():
    topo = topologies.build("star", 5)
    assert topo.server == "server" and topo.server not in topo.gpus
    assert route_names(topo, "n4.gpu0", "server") == ["n4.gpu0->eth-switch", "eth-switch->server"]


def test_workstation_has_no_peer_to_peer():
    topo = topologies.build("workstation", 4)
    assert route_names(topo, "gpu0", "gpu1") == ["gpu0->cpu", "cpu->gpu1"]


@pytest.mark.parametrize("name, gpus, message", [
    ("dgx-a100", 12, "not a multiple of 8"),
    ("workstation", 5, "at most 4 GPUs"),
    ("pcie", 0, "at least 1"),
    ("fat-tree", 8, "unknown preset 'fat-tree'"),
])
def test_impossible_layouts_are_clear_errors(name, gpus, message):
    with pytest.raises(SimparError, match=message):
        topologies.build(name, gpus)


def test_bandwidth_only_applies_to_ring_and_star():
    with pytest.raises(SimparError, match="--bandwidth: only the ring and star"):
        topologies.build("dgx-a100", 8, bandwidth=1e9)
