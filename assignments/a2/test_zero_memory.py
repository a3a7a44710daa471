"""Grader for A2 (ZeRO memory). Run: pytest assignments/a2"""

import pytest

from simpar.course.adapter import load_solution
from simpar.memory import model_states as simpar_model_states
from simpar.train import TrainSpec

solution = load_solution(__file__, "zero_memory.py")
STRATEGIES = ["ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload", "zero3-infinity"]
GB = 1e9


@pytest.mark.parametrize("strategy, expected_gb", [("ddp", 120), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9)])
def test_the_zero_paper_figure(strategy, expected_gb):
    """Rajbhandari et al. 2020, Figure 1: 7.5B parameters, 64 GPUs, mixed-precision Adam (K = 12)."""
    got = solution.model_states(7_500_000_000, strategy, 64)
    assert got["gpu"] / GB == pytest.approx(expected_gb, abs=0.05)
    assert got["host"] == got["nvme"] == 0


def test_one_gpu_is_16_bytes_per_parameter():
    for strategy in ["ddp", "zero1", "zero2", "zero3"]:
        assert solution.model_states(1000, strategy, 1)["gpu"] == 16_000


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed", "fp32"])
@pytest.mark.parametrize("optimizer", ["adam", "sgd", "sgd-momentum"])
@pytest.mark.parametrize("gpus", [1, 4, 64])
def test_every_stage_precision_and_optimizer(strategy, precision, optimizer, gpus):
    params = 1_234_567_891
    got = solution.model_states(params, strategy, gpus, precision, optimizer)
    want = simpar_model_states(strategy, params, gpus, TrainSpec(global_batch=gpus, micro_batch=1,
                                                                  precision=precision, optimizer=optimizer))
    assert got["gpu"] == pytest.approx(want.params + want.grads + want.optimizer, rel=1e-12)
    assert got["host"] == pytest.approx(want.host, rel=1e-12, abs=1e-9)
    assert got["nvme"] == pytest.approx(want.nvme, rel=1e-12, abs=1e-9)


def test_offload_moves_bytes_off_the_gpu_without_losing_any():
    """Offloading moves the optimizer states; nothing is lost."""
    params, n = 7_000_000_000, 8
    zero2, offload = solution.model_states(params, "zero2", n), solution.model_states(params, "zero2-offload", n)
    assert offload["gpu"] == 2 * params  # the bf16 parameters only
    assert offload["gpu"] + offload["host"] == pytest.approx(zero2["gpu"])
    infinity = solution.model_states(params, "zero3-infinity", n)
    assert infinity["gpu"] == 0 and infinity["nvme"] == pytest.approx(14 * params / n)
