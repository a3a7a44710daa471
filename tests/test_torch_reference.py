"""Cross-check: simpar's executor and PyTorch's own DDP, ZeroRedundancyOptimizer and FSDP2
(fully_shard), on gloo with the same model, seed and batches, end with the same parameters.

Tolerance as for Adam elsewhere (1e-4 after 3 steps; in practice ~3e-6): the two sum gradients
in different orders (PyTorch's buckets and gloo's all-reduce vs simpar's ring chunks)."""

import pytest
import torch

from simpar.models import model
from simpar.real.executor import run_rank
from simpar.real.launch import launch
from simpar.real.torch_reference import torch_worker
from simpar.scenario import make_scenario

pytestmark = pytest.mark.slow
STEPS = 3


@pytest.mark.parametrize("strategy,implementation", [("ddp", "DistributedDataParallel"),
                                                     ("zero1", "ZeroRedundancyOptimizer"),
                                                     ("zero3", "FSDP2 fully_shard")])
def test_executor_matches_pytorchs_own_implementation(strategy, implementation):
    scenario = make_scenario(model("tiny"), strategy, 2, micro_batch=2, microbatches=2, precision="fp32",
                             optimizer="adam", topology="pcie")
    theirs = launch(torch_worker, 2, (scenario, strategy, STEPS, 0), timeout=240)
    ours = launch(run_rank, 2, (scenario, STEPS, 0), timeout=240)
    for mine, reference in zip(ours, theirs):
        assert mine["losses"] == pytest.approx(reference["losses"], rel=1e-5)
        assert set(mine["params"]) == set(reference["params"])
        for unit, params in mine["params"].items():
            assert torch.allclose(params, reference["params"][unit], rtol=0, atol=1e-4), (implementation, unit)
