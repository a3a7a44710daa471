"""DeepSpeed itself on gloo ranks, beside the simulation: ``simpar run --deepspeed CFG --compare-real
--engine deepspeed``.

Each rank builds the same GPT as simpar's executor (``build_model`` from the ModelSpec and seed),
takes the same rows of the same synthetic batches, and trains it with ``deepspeed.initialize`` on the
config (its "auto" values filled as simpar resolved them). Three things are changed so that the losses
can be held to simpar's executor, and each is reported: the config's optimizer and scheduler give way to
simpar's optimizer (a torch optimizer DeepSpeed runs as a client optimizer), and gradient clipping is off.

Measured per rank: the wall time of each step; the bytes DeepSpeed's collectives move, counted at
``torch.distributed`` (every call's tensor, as the bytes a ring algorithm sends for it: an all-reduce
of S bytes sends 2(N-1)/N S, a reduce-scatter or all-gather (N-1)/N S); and memory per category from
the tensors DeepSpeed's engine and optimizer hold, sampled after each backward and inside the
optimizer's step (where the fp32 gradient partitions exist).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from simpar.errors import SimparError
from simpar.real.model import build_model, synthetic_batch
from simpar.real.states import make_optimizer
from simpar.scenario import Scenario

INSTALL = "pip install 'simpar[deepspeed]' (in a checkout: pip install -e '.[deepspeed]')"
# torch.distributed calls DeepSpeed's TorchBackend makes -> the ring bytes a rank sends for a tensor of S bytes
RING_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter_tensor": lambda n: (n - 1) / n,
               "all_gather_into_tensor": lambda n: (n - 1) / n, "broadcast": lambda n: (n - 1) / n,
               "all_to_all_single": lambda n: (n - 1) / n, "reduce": lambda n: (n - 1) / n}
SIZE_ARG = {"reduce_scatter_tensor": 1, "all_gather_into_tensor": 0, "all_to_all_single": 1}  # which tensor is S


def require() -> None:
    """One clear line when DeepSpeed is missing."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        raise SimparError(f"--engine: deepspeed is not installed; {INSTALL}")


def run_config(config: dict) -> tuple[dict, list[str]]:
    """The filled config as this run gives it to DeepSpeed, and what was changed (to list, not hide)."""
    out, changed = dict(config), []
    if out.pop("optimizer", None) is not None:
        changed.append("optimizer: the config's replaced by simpar's optimizer (a torch client optimizer), so the "
                       "losses can be held to simpar's")
    if out.pop("scheduler", None) is not None:
        changed.append("scheduler: left out (simpar's optimizer keeps a constant learning rate)")
    if out.get("gradient_clipping"):
        changed.append("gradient_clipping: off (simpar's executor does not clip)")
    out.update(gradient_clipping=0.0, steps_per_print=10**9, wall_clock_breakdown=False,
               zero_allow_untested_optimizer=True, zero_force_ds_cpu_optimizer=False)
    return out, changed


class _CountingCalls:
    """Counts the ring bytes of every torch.distributed collective while ``active``."""

    def __init__(self, world: int):
        self.world, self.active, self.sent, self.calls = world, False, 0.0, {}
        self._saved = {}
        for name in RING_FACTOR:
            if hasattr(dist, name):
                self._saved[name] = getattr(dist, name)
                setattr(dist, name, self._wrap(name, self._saved[name]))

    def _wrap(self, name, original):
        def counted(*args, **kwargs):
            if self.active:
                tensors = list(args) + list(kwargs.values())
                tensor = [t for t in tensors if isinstance(t, torch.Tensor)]
                if tensor:
                    t = tensor[min(SIZE_ARG.get(name, 0), len(tensor) - 1)]
                    ring = RING_FACTOR[name](self.world) * t.numel() * t.element_size()
                    self.sent += ring
                    count, total = self.calls.get(name, (0, 0.0))
                    self.calls[name] = (count + 1, total + ring)
            return original(*args, **kwargs)
        return counted

    def restore(self) -> None:
        for name, original in self._saved.items():
            setattr(dist, name, original)


def _bytes(tensors) -> int:
    """Bytes of distinct tensors, a view counted for its own elements: DeepSpeed's partitions are views
    into flat buffers larger than them (unlike instrument.storage_bytes, which counts whole storages)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def held(engine, stage: int) -> dict[str, int]:
    """Bytes DeepSpeed holds now, by the Plan's categories (host: what it keeps offloaded)."""
    opt = engine.optimizer
    params = list(engine.module.parameters())
    inner = getattr(opt, "optimizer", None)
    states = [t for state in (inner.state.values() if inner is not None else ()) for t in state.values()
              if isinstance(t, torch.Tensor) and t.dim() > 0]
    if stage == 3:
        masters = list(getattr(opt, "fp32_partitioned_groups_flat", []))
        partitions = [p.ds_tensor for p in params]
        # stage3.py keeps this rank's gradient partitions in one flat buffer
        grads = [getattr(opt, "grad_partitions_flat_buffer", None)]
        grads += [t for group in (getattr(opt, "averaged_gradients", None) or {}).values() for t in (group or [])]
    else:
        masters = list(getattr(opt, "single_partition_of_fp32_groups", []))
        partitions = params
        grads = [t for group in getattr(opt, "averaged_gradients", {}).values() for t in (group or [])]
        grads += [p.grad for p in params]
    grads += [m.grad for m in masters]
    out = {"params": _bytes(partitions), "grads": _bytes(grads), "optimizer": _bytes(states + masters), "host": 0}
    if getattr(opt, "cpu_offload", False) or getattr(opt, "offload_optimizer", False):
        out["host"] = out.pop("optimizer") + out.pop("grads")
        out.update(optimizer=0, grads=0)
    if getattr(opt, "offload_param", False):
        out["host"] += out["params"]
        out["params"] = 0
    return out


def deepspeed_rank(ctx, scenario: Scenario, config: dict, steps: int, seed: int) -> dict:
    os.environ.update(LOCAL_RANK=str(ctx.rank), RANK=str(ctx.rank), WORLD_SIZE=str(ctx.world))
    import deepspeed

    spec, train = scenario.model, scenario.train
    m, b = scenario.microbatches, train.micro_batch
    stage = int((config.get("zero_optimization") or {}).get("stage", 0))
    model = build_model(spec, seed)
    if train.mixed:
        model = model.to(torch.bfloat16)  # DeepSpeed's bf16 engine trains 16-bit weights with fp32 masters
    counting = _CountingCalls(ctx.world)
    engine, *_ = deepspeed.initialize(model=model, optimizer=make_optimizer(train.optimizer, model.parameters()),
                                      config=config, dist_init_required=False)
    peak: dict[str, int] = {}

    def sample():
        for category, nbytes in held(engine, stage).items():
            peak[category] = max(peak.get(category, 0), nbytes)

    base = getattr(engine.optimizer, "optimizer", None)
    if base is not None:  # inside the step the fp32 gradient partitions exist
        original = base.step

        def step_and_sample(*args, **kwargs):
            sample()
            return original(*args, **kwargs)
        base.step = step_and_sample
    losses, times = [], []
    for step in range(steps):
        # bytes from the second step on: the first records ZeRO-3's module trace (partitioned_param_coordinator),
        # without which DeepSpeed neither prefetches nor keeps what the backward reuses
        counting.active = step > 0 or steps == 1
        ids, targets = synthetic_batch(spec, train.global_batch, step, seed)
        started, total = time.perf_counter(), 0.0
        for mb in range(m):
            rows = slice((ctx.rank * m + mb) * b, (ctx.rank * m + mb + 1) * b)
            logits = engine(ids[rows])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                     targets[rows].reshape(-1))
            engine.backward(loss)
            sample()
            engine.step()
            total += float(loss.detach()) / m
        times.append(time.perf_counter() - started)
        losses.append(total)
        ctx.step_done()
    counting.active = False
    counting.restore()
    counted = steps - 1 if steps > 1 else 1
    return {"losses": losses, "step_times": times, "bytes_sent": counting.sent / counted, "calls": counting.calls,
            "memory": peak}


def run_deepspeed(scenario: Scenario, config: dict, steps: int, seed: int, timeout: float, progress=None) -> dict:
    from simpar.real.compare import measured_step_time
    from simpar.real.launch import launch

    require()
    if scenario.strategy.pp > 1 or scenario.strategy.tp > 1:
        raise SimparError("--engine: simpar runs DeepSpeed's ZeRO data parallelism only (no pipeline or tensor "
                          "parallelism)")
    world = scenario.strategy.dp
    ranks = launch(deepspeed_rank, world, (scenario, config, steps, seed), timeout=timeout, progress=progress)
    losses = [sum(r["losses"][i] for r in ranks) / world for i in range(steps)]
    return {"step_time_s": measured_step_time([r["step_times"] for r in ranks]), "losses": losses,
            "ranks": [{"rank": i, "bytes_sent": r["bytes_sent"], "memory": r["memory"], "calls": r["calls"]}
                      for i, r in enumerate(ranks)]}
