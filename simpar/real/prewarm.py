"""Imported by the ranks' fork server only (launch.py), so that every forked rank inherits what each would
otherwise pay on its own (16 ranks' worth on 2 cores: seconds a launch): the modules of simpar's rank workers,
and what a process sets up lazily on its first autograd pass (a backward given its output's gradient imports
torch.fx's symbolic shapes: 0.3-0.8 s of CPU), done once here by one small forward and backward. On one
thread, so no thread pool exists to be inherited: a rank sizes its own (launch._entry)."""

import torch
import torch.nn.functional as F

import simpar.calibrate  # noqa: F401  (the calibration's workers)
import simpar.real.executor  # noqa: F401  (the executor's rank: run_rank)

torch.set_num_threads(1)


def _pass() -> None:
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    weight = torch.randn(8, 8, requires_grad=True)
    h = F.layer_norm(x @ weight, (8,))
    out = F.gelu(F.scaled_dot_product_attention(h, h, h, is_causal=True))
    out.backward(torch.ones_like(out))


_pass()
