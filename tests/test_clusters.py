"""Cluster files: every preset round-trips through one, hand-written fabrics behave as their links
say (closed forms), and bad files fail with one line naming the key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import simpy
import yaml

from simpar import topologies
from simpar.cli import main
from simpar.collective_run import simulate_collective
from simpar.costs.nccl import LINK_EFFICIENCY
from simpar.engine import Network
from simpar.models.presets import PRESETS as MODELS
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.topologies.cluster_file import dump, parse

SIZES = {"ring": [2, 5], "star": [1, 4], "pcie": [1, 6], "workstation": [4], "nvlink-ring": [2, 8],
         "nvlink-full": [3, 4], "dgx-a100": [4, 16, 264], "dgx-h100": [8, 24], "dgx-h200": [8, 16], "dgx-b200": [4, 16]}


def graph_of(topo):
    nodes = {n: (d["kind"], d["machine"], d["spec"], d["affinity"]) for n, d in topo.graph.nodes(data=True)}
    edges = {frozenset((a, b)): (a, b, d["link"]) for a, b, d in topo.graph.edges(data=True)}
    return (topo.name, topo.description, topo.nccl, topo.nvls, topo.gpus_forward, topo.gpus, topo.server,
            nodes, edges, list(topo.capacities))


def write(tmp_path, raw: dict, name: str = "cluster.yaml") -> str:
    path = tmp_path / name
    path.write_text(dump(raw))
    return str(path)


def test_presets_cover_every_topology_in_the_tests():
    assert set(SIZES) == set(topologies.PRESETS)


@pytest.mark.parametrize("name,gpus", [(n, g) for n, sizes in SIZES.items() for g in sizes])
def test_each_preset_round_trips_through_its_cluster_file(tmp_path, name, gpus):
    path = write(tmp_path, topologies.preset_cluster(name, gpus), f"{name}.yaml")
    assert graph_of(topologies.build(path, gpus)) == graph_of(topologies.build(name, gpus))


@pytest.mark.parametrize("name,gpus,strategy", [("dgx-a100", 16, "zero3"), ("pcie", 4, "zero2-offload"),
                                                ("star", 4, "dp"), ("nvlink-ring", 8, "ddp")])
def test_a_preset_and_its_file_simulate_identically(tmp_path, name, gpus, strategy):
    path = write(tmp_path, topologies.preset_cluster(name, gpus))
    model = MODELS["gpt2"]
    results = [simulate(make_scenario(model, strategy, gpus, topology=t, precision="fp16-mixed"), check_oom=False)
               for t in (name, path)]
    assert results[0].step_time_s == results[1].step_time_s
    assert results[0].ranks == results[1].ranks and results[0].links == results[1].links


def test_topologies_show_prints_a_file_that_reads_back(tmp_path, capsys):
    assert main(["topologies", "--show", "dgx-h100", "--gpus", "16"]) == 0
    path = tmp_path / "h100.yaml"
    path.write_text(capsys.readouterr().out)
    assert graph_of(topologies.build(str(path), 16)) == graph_of(topologies.build("dgx-h100", 16))


def test_device_swaps_the_gpu_of_a_preset_and_of_a_file(tmp_path):
    for name in ("dgx-h100", write(tmp_path, topologies.preset_cluster("dgx-h100", 16))):
        topo = topologies.build(name, 16, device="h200")
        assert {topo.graph.nodes[g]["spec"].name for g in topo.gpus} == {"h200"}
        assert topo.graph.nodes[topo.gpus[0]]["spec"].memory_bytes == 141 * 10**9


# -- hand-written fabrics, checked against closed forms -----------------------------------------------

ETH4 = {"name": "eth4", "nodes": 4, "gpus_per_node": 8, "gpu": "a100-40gb", "host": "epyc-7742x2",
        "pcie": {"gen": 4, "gpus_per_switch": 4},
        "intra_node": {"fabric": "nvswitch", "bandwidth": "300GB/s", "efficiency": "nvlink3"},
        "nics": {"per_node": 2, "bandwidth": "100Gb/s", "kind": "eth", "latency": "2us"},
        "network": {"topology": "single-switch"}}


def cross_node_transfer(topo, pairs, nbytes):
    """All pairs send ``nbytes`` at once; (seconds, network) when the last lands."""
    env = simpy.Environment()
    network = Network(env, topo)
    env.run(until=network.transfer_all([(topo.gpus[a], topo.gpus[b], nbytes, 1) for a, b in pairs]))
    return env.now, network


def test_ethernet_nics_shared_by_four_gpus(tmp_path):
    topo = topologies.build(write(tmp_path, ETH4), 32)
    assert len(topo.gpus) == 32 and topo.graph.nodes[topo.gpus[0]]["spec"].name == "a100-40gb"
    nbytes = 10**9
    seconds, network = cross_node_transfer(topo, [(i, 8 + i) for i in range(8)], nbytes)
    # 8 flows leave node 0 through 2 NICs of 12.5 GB/s: 4 flows share each NIC's wire
    latency = topo.route_latency(topo.gpus[0], topo.gpus[8])
    assert seconds == pytest.approx(latency + nbytes / (12.5e9 / 4), rel=1e-9)
    eth = [c for c in range(topo.num_channels) if topo.channel_kind(c) == "eth" and network.channel_bytes[c]]
    assert sorted(topo.channel_name(c) for c in eth) == sorted(
        f"{a}->{b}" for a, b in [("n0.nic0", "eth-switch"), ("n0.nic1", "eth-switch"),
                                 ("eth-switch", "n1.nic0"), ("eth-switch", "n1.nic1")])
    assert all(network.channel_bytes[c] == 4 * nbytes for c in eth)


def fat_tree(oversubscription):
    raw = topologies.preset_cluster("dgx-a100", 16)
    raw["network"] = {"topology": "fat-tree", "nodes_per_leaf": 1, "oversubscription": oversubscription}
    return parse(raw).build(16)


def test_oversubscribed_uplinks_halve_cross_node_bandwidth():
    nbytes = 4 * 10**9
    full, half = fat_tree(1), fat_tree(2)
    nic = 25e9 * LINK_EFFICIENCY["ib-hdr"]
    pairs = [(i, 8 + i) for i in range(8)]
    for topo, rate in ((full, nic), (half, nic / 2)):  # 8 NICs per leaf, uplink 8 (or 4) NICs' worth
        seconds, _ = cross_node_transfer(topo, pairs, nbytes)
        assert seconds == pytest.approx(topo.route_latency(topo.gpus[0], topo.gpus[8]) + nbytes / rate, rel=1e-9)
    # a ring all-reduce over both nodes: the cross-node steps run at half the rate, and dominate
    ring = [simulate_collective(t, "allreduce", "ring", 2**32).busbw_Bps for t in (full, half)]
    assert ring[1] / ring[0] == pytest.approx(0.5, rel=0.02)


RAILS = {"name": "rails", "nodes": 4, "gpus_per_node": 8, "gpu": "h100-sxm", "host": "xeon-8480x2",
         "pcie": {"gen": 5, "gpus_per_switch": 2},
         "intra_node": {"fabric": "nvswitch", "bandwidth": "450GB/s", "efficiency": "nvlink4", "sharp": True},
         "nics": {"per_node": 8, "bandwidth": "400Gb/s", "efficiency": "ib-ndr"},
         "network": {"topology": "rail-optimized", "nodes_per_leaf": 2}}


def test_rail_optimized_keeps_same_rail_traffic_off_the_spine(tmp_path):
    topo = topologies.build(write(tmp_path, RAILS), 32)
    names = lambda a, b: [topo.channel_name(c) for c in topo.route(topo.gpus[a], topo.gpus[b])]  # noqa: E731
    assert [n for n in names(3, 8 + 3) if "ib-" in n] == ["n0.nic3->ib-rail3", "ib-rail3->n1.nic3"] or \
        [n for n in names(3, 8 + 3) if "ib-" in n] == ["n0.nic3->ib-pod0-rail3", "ib-pod0-rail3->n1.nic3"]
    assert any("spine" in n for n in names(3, 16 + 3))  # another pod: up through the spine
    assert any("spine" in n for n in names(0, 8 + 5))  # another rail: through the spine
    # GPU i of every node in one pod exchanging: the spine carries nothing
    _, network = cross_node_transfer(topo, [(i, 8 + i) for i in range(8)] + [(8 + i, i) for i in range(8)], 10**8)
    spine = [c for c in range(topo.num_channels) if "spine" in topo.channel_name(c)]
    assert spine and all(network.channel_bytes[c] == 0 for c in spine)
    rail = [c for c in range(topo.num_channels) if topo.channel_name(c).startswith("n0.nic")]
    assert all(network.channel_bytes[c] == 10**8 for c in rail if "->ib-" in topo.channel_name(c))


def test_inline_gpu_spec(tmp_path):
    raw = dict(ETH4, gpu={"preset": "a100-80gb", "name": "a100-96gb", "memory": "96GiB",
                          "peak_flops": {"bf16": "400T"}})
    gpu = topologies.build(write(tmp_path, raw), 8).graph.nodes["gpu0"]["spec"]
    assert (gpu.name, gpu.memory_bytes, gpu.bf16_flops, gpu.fp16_flops) == ("a100-96gb", 96 * 2**30, 400e12, 312e12)
    bare = dict(ETH4, gpu={"name": "mine", "memory": "16GiB", "memory_bandwidth": "1TB/s",
                           "peak_flops": {"fp32": "20T", "fp16": "100T"}})
    gpu = topologies.build(write(tmp_path, bare), 8).graph.nodes["gpu0"]["spec"]
    assert (gpu.memory_bandwidth, gpu.bf16_flops, gpu.kernels) == (1e12, None, None)


def test_a_cluster_file_runs_end_to_end(tmp_path, capsys):
    path = write(tmp_path, ETH4)
    assert main(["run", "--cluster", path, "--strategy", "ddp", "--model", "gpt2", "--json", "-"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["scenario"]["cluster"]["gpus"] == 32 and out["scenario"]["cluster"]["topology"] == path
    assert main(["plot", "--cluster", path, "--out", str(tmp_path / "c.png")]) == 0
    assert os.path.getsize(tmp_path / "c.png") > 10_000


# -- bad files ----------------------------------------------------------------------------------------

def _without(raw: dict, *path):
    raw = yaml.safe_load(yaml.safe_dump(raw))
    node = raw
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return raw


def _with(raw: dict, value, *path):
    raw = yaml.safe_load(yaml.safe_dump(raw))
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return raw


@pytest.mark.parametrize("raw,key", [
    (_without(ETH4, "nodes"), "nodes: missing"),
    (_with(ETH4, "a100-41gb", "gpu"), "gpu: unknown preset 'a100-41gb'"),
    (_with(ETH4, "-100Gb/s", "nics", "bandwidth"), "nics.bandwidth: must be positive"),
    (_with(ETH4, 3, "nics", "per_node"), "nics.per_node: 3 NICs cannot be shared evenly by the 8 GPUs"),
    (_with(ETH4, "fast", "intra_node", "bandwidth"), "intra_node.bandwidth: cannot read 'fast'"),
    (_with(ETH4, 1, "nic"), "nic: unknown key (typo?)"),
    (_with(ETH4, "torus", "network", "topology"), "network.topology: unknown 'torus'"),
    (_with(ETH4, 0.5, "network", "oversubscription"), "network.oversubscription: must be >= 1"),
    (_without(ETH4, "nics"), "nics: 4 nodes need NICs"),
    (_with(ETH4, [1, 2], "pcie"), "pcie: expected a mapping"),
])
def test_bad_cluster_files_fail_with_one_line_naming_the_key(tmp_path, capsys, raw, key):
    assert main(["run", "--cluster", write(tmp_path, raw)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"cluster.yaml: {key}" in err


def test_unreadable_and_conflicting_cluster_flags(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("nodes: [1,\n")
    assert main(["run", "--cluster", str(tmp_path / "bad.yaml")]) == 2
    assert "is not YAML" in capsys.readouterr().err
    assert main(["run", "--cluster", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["run", "--cluster", write(tmp_path, ETH4), "--topology", "dgx-a100"]) == 2
    assert "leave --topology out" in capsys.readouterr().err
    assert main(["run", "--cluster", write(tmp_path, ETH4), "--gpus", "12"]) == 2
    assert "not a multiple of 8" in capsys.readouterr().err


def test_a_step_on_an_oversubscribed_fat_tree(tmp_path):
    """Oversubscription costs what crosses the uplinks. NCCL-style rings (one per local GPU) cross a
    leaf boundary only where the ring passes from one leaf's nodes to the next: 8 flows against an
    uplink of 8 nodes x 8 NICs / 2, so 2:1 leaves of 8 nodes cost a ring nothing. With one node per
    leaf every ring hop between nodes crosses: 8 flows on 4 NICs' worth, the same step exposes more
    communication. Bytes on every link are the same either way."""
    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples/clusters/fat-tree-2to1.yaml").read_text())
    for per_leaf, slower in ((8, False), (1, True)):
        results = {}
        for ratio in (1, 2):
            raw["network"].update(oversubscription=ratio, nodes_per_leaf=per_leaf)
            path = write(tmp_path, raw, f"ft{ratio}.yaml")
            scenario = make_scenario(MODELS["gpt2-xl"], "ddp", 128, topology=path)
            results[ratio] = (simulate(scenario), simulate_collective(topologies.build(path, 128), "allreduce", "ring",
                                                                      2**30))
        (step1, ring1), (step2, ring2) = results[1], results[2]
        assert step1.links == step2.links
        assert [r["bytes_sent"] for r in step1.ranks] == [r["bytes_sent"] for r in step2.ranks]
        if slower:
            assert ring2.time_s > 1.5 * ring1.time_s
            assert step2.breakdown["communication"] > 1.3 * step1.breakdown["communication"]
        else:
            assert ring2.time_s == ring1.time_s and step2.step_time_s == step1.step_time_s
