"""H200, B200 and GB200: datasheet presets, DGX H200 / B200 topologies, and a GB200 NVL72 rack as a cluster file
(72 GPUs in one NVLink 5 domain)."""

from pathlib import Path

import pytest

from simpar import topologies
from simpar.cli import main
from simpar.collective_run import simulate_collective
from simpar.devices.presets import gpu
from simpar.models import model
from simpar.scenario import make_scenario
from simpar.sim import simulate

NVL72 = str(Path(__file__).resolve().parents[1] / "examples/clusters/gb200-nvl72.yaml")


@pytest.mark.parametrize("name,memory,bf16,fp8", [("h200", 141e9, 989.4e12, 1978.9e12),
                                                  ("b200", 180e9, 2250e12, 4500e12),
                                                  ("gb200", 186e9, 2500e12, 5000e12)])
def test_datasheet_presets(name, memory, bf16, fp8):
    spec = gpu(name)
    assert (spec.memory_bytes, spec.bf16_flops, spec.fp8_flops) == (memory, bf16, fp8) and spec.kernels is not None
    assert gpu("a100-80gb").fp8_flops is None


def test_the_nvl72_rack_is_one_nvlink_domain_and_its_all_reduce_reports_busbw(capsys):
    topology = topologies.build(NVL72, 72)
    assert len(topology.gpus) == 72 and len({topology.machine(g) for g in topology.gpus}) == 1
    ring = simulate_collective(topology, "allreduce", "ring", 2**30)
    eight = simulate_collective(topologies.build("dgx-h100", 8), "allreduce", "ring", 2**30)
    assert ring.busbw_Bps > 1.5 * eight.busbw_Bps  # NVLink 5 is twice NVLink 4's rate
    assert main(["collective", "--op", "allreduce", "--gpus", "72", "--cluster", NVL72]) == 0
    assert "busbw" in capsys.readouterr().out


def test_tp8_by_dp9_stays_inside_the_rack():
    scenario = make_scenario(model("llama2-13b"), "3d", 72, tp=8, dp=9, topology=NVL72, flash_attention=True,
                             sequence_parallel=True)
    result = simulate(scenario)
    assert result.links and all(link["kind"] == "nvlink" for link in result.links)
    two_racks = simulate(make_scenario(model("llama2-13b"), "3d", 144, tp=8, dp=18, topology=NVL72,
                                       flash_attention=True, sequence_parallel=True))
    assert any(link["kind"] == "ib" for link in two_racks.links)


@pytest.mark.parametrize("preset,device", [("dgx-h200", "h200"), ("dgx-b200", "b200")])
def test_dgx_h200_and_b200_presets(preset, device):
    topology = topologies.build(preset, 16)
    assert topology.graph.nodes[topology.gpus[0]]["spec"].name == device
    bf16 = simulate(make_scenario(model("llama2-7b"), "3d", 16, tp=8, topology=preset, flash_attention=True))
    h100 = simulate(make_scenario(model("llama2-7b"), "3d", 16, tp=8, topology="dgx-h100", flash_attention=True))
    assert bf16.step_time_s < h100.step_time_s
