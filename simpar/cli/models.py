"""``simpar models`` and ``simpar memory``: model presets and memory per GPU by strategy."""

from __future__ import annotations

from dataclasses import replace

from simpar import units
from simpar.cli import add_json_flag, write_json
from simpar.errors import SimparError
from simpar.memory import SHARDING, model_states
from simpar.models import PRESETS, model
from simpar.train import OPTIMIZERS, PRECISIONS, TrainSpec


def register(sub) -> None:
    p = sub.add_parser("models", help="list model presets with exact parameter counts",
                       description="List the model presets and their exact parameter counts.")
    add_json_flag(p, "[{name, params}]")
    p.set_defaults(handler=list_models)

    p = sub.add_parser("memory", help="memory per GPU of a strategy (model states, activations)",
                       description="Memory per GPU: model states by ZeRO stage, plus activations "
                                   "when a model preset is given (model states only with --params).")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model", help="model preset (default gpt2 unless --params is given)")
    source.add_argument("--params", help="a generic model of N parameters, e.g. 7.5e9 (model states only)")
    p.add_argument("--strategy", default="ddp", help=f"one of {', '.join(SHARDING)} (default ddp)")
    p.add_argument("--gpus", default="8", help="data-parallel ranks sharing the model states (default 8)")
    p.add_argument("--micro-batch", default="1", help="sequences per micro-batch, for activations (default 1)")
    p.add_argument("--recompute", default="none", help="activation recomputation: none, selective, full")
    p.add_argument("--flash-attention", action="store_true", help="attention scores are never stored")
    p.add_argument("--precision", default="bf16-mixed", help=f"one of {', '.join(PRECISIONS)}")
    p.add_argument("--optimizer", default="adam", help=f"one of {', '.join(OPTIMIZERS)}")
    add_json_flag(p)
    p.set_defaults(handler=show_memory)


def list_models(args) -> int:
    rows = [{"name": m.name, "params": m.params} for m in PRESETS.values()]
    if args.json and write_json(rows, args.json):
        return 0
    print(f"  {'name':<13}{'params':>17}{'layers':>8}{'hidden':>8}{'heads':>7}{'kv':>5}{'ffn':>7}{'vocab':>8}{'seq':>6}")
    for m in PRESETS.values():
        print(f"  {m.name:<13}{m.params:>17,}{m.layers:>8}{m.hidden:>8}{m.heads:>7}{m.n_kv_heads:>5}"
              f"{m.ffn:>7}{m.vocab:>8}{m.seq:>6}")
    return 0


def show_memory(args) -> int:
    train = TrainSpec(precision=args.precision, optimizer=args.optimizer)
    gpus = units.positive_int(args.gpus, "--gpus")
    micro_batch = units.positive_int(args.micro_batch, "--micro-batch")
    if args.params is not None:
        value = units.positive(args.params, "--params")
        if value != int(value):
            raise SimparError(f"--params: must be a whole number, got {args.params!r}")
        name, params, spec = f"{int(value):,} parameters", int(value), None
    else:
        spec = model(args.model or "gpt2")
        name, params = spec.name, spec.params
    memory = model_states(args.strategy.strip().lower(), params, gpus, train)
    if spec is not None:
        memory = replace(memory, activations=spec.layers * spec.layer_activation_bytes(
            micro_batch, args.recompute, args.flash_attention))
    result = {"model": name, "params": params, "strategy": args.strategy, "gpus": gpus, "per_gpu": memory.to_json()}
    if args.json and write_json(result, args.json):
        return 0
    print(f"{name} with {args.strategy} on {gpus} GPUs ({train.precision}, {train.optimizer}: "
          f"{train.weight_bytes}+{train.weight_bytes}+{train.optimizer_bytes} bytes per parameter)")
    for label, value in (("params", memory.params), ("grads", memory.grads), ("optimizer", memory.optimizer),
                         ("activations", memory.activations), ("total", memory.total)):
        print(f"  {label:<12}{units.human_bytes(value):>12}  ({value:,.0f} B)")
    if memory.host:
        print(f"  {'on host':<12}{units.human_bytes(memory.host):>12}  (optimizer states, gradient shard: offloaded)")
    if memory.nvme:
        print(f"  {'on NVMe':<12}{units.human_bytes(memory.nvme):>12}  (parameters and optimizer states)")
    if spec is None:
        print("  (activations need a model shape: use --model for them)")
    return 0
