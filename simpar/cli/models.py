"""``simpar models`` and ``simpar memory``: model presets and memory per GPU by strategy."""

from __future__ import annotations

from dataclasses import replace

from simpar import units
from simpar.cli.common import add_json_flag, write_json
from simpar.errors import SimparError
from simpar.memory import SHARDING, largest_module, model_states
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
    p.add_argument("--strategy", help=f"one of {', '.join(SHARDING)} (default ddp)")
    p.add_argument("--deepspeed", metavar="DS_CONFIG",
                   help="count what DeepSpeed holds for this config (its strategy, precision and offload): the fp32 "
                        "gradient partitions, ZeRO-3's largest module gathered, host memory per node; equal to "
                        "DeepSpeed's estimate_zero2/3_model_states_mem_needs")
    p.add_argument("--gpus-per-node", help="with --deepspeed: GPUs per node, for host memory per node (default 8)")
    p.add_argument("--gpus", default="8", help="data-parallel ranks sharing the model states (default 8)")
    p.add_argument("--micro-batch", default="1", help="sequences per micro-batch, for activations (default 1)")
    p.add_argument("--recompute", default="none", help="activation recomputation: none, selective, full")
    p.add_argument("--flash-attention", action="store_true", help="attention scores are never stored")
    p.add_argument("--precision", help=f"one of {', '.join(PRECISIONS)} (default bf16-mixed; with --deepspeed "
                                       "the config's, '\"auto\"' taking this flag)")
    p.add_argument("--optimizer", default="adam", help=f"one of {', '.join(OPTIMIZERS)}")
    add_json_flag(p)
    p.set_defaults(handler=show_memory)


def list_models(args) -> int:
    rows = [{"name": m.name, "params": m.params, "active_params": m.active_params, "experts": m.experts,
             "top_k": m.top_k if m.experts else 0} for m in PRESETS.values()]
    if args.json and write_json(rows, args.json):
        return 0
    print(f"  {'name':<17}{'params':>18}{'active':>18}{'layers':>7}{'hidden':>7}{'heads':>6}{'kv':>4}{'ffn':>7}"
          f"{'experts':>9}{'vocab':>8}{'seq':>6}")
    for m in PRESETS.values():
        experts = f"{m.top_k}/{m.experts}" if m.experts else "-"
        print(f"  {m.name:<17}{m.params:>18,}{m.active_params:>18,}{m.layers:>7}{m.hidden:>7}{m.heads:>6}"
              f"{m.n_kv_heads:>4}{m.expert_width if m.experts else m.ffn:>7}{experts:>9}{m.vocab:>8}{m.seq:>6}")
    return 0


def show_memory(args) -> int:
    gpus = units.positive_int(args.gpus, "--gpus")
    micro_batch = units.positive_int(args.micro_batch, "--micro-batch")
    if args.deepspeed:
        return show_deepspeed_memory(args, gpus)
    if args.gpus_per_node is not None:
        raise SimparError("--gpus-per-node: only with --deepspeed")
    args.strategy = args.strategy or "ddp"
    train = TrainSpec(precision=args.precision or "bf16-mixed", optimizer=args.optimizer)
    if train.fp8:  # its FP8 weight copies and FP8 activations are the Megatron plan's (strategies/megatron.py)
        raise SimparError("--precision: fp8-mixed memory is priced by the simulated step in Megatron's layouts: "
                          "simpar run --precision fp8-mixed --strategy 3d ... (per rank, per category)")
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
        dense = (spec.layers - spec.moe_layers) * spec.layer_activation_bytes(micro_batch, args.recompute,
                                                                               args.flash_attention)
        if spec.experts:  # MoE layers: strategies/experts.py's count (uniform routing, 16-bit)
            from types import SimpleNamespace

            from simpar.strategies.experts import moe_activation_bytes

            how = SimpleNamespace(recompute=args.recompute, flash_attention=args.flash_attention, expert_imbalance=1.0)
            dense += spec.moe_layers * moe_activation_bytes(spec, micro_batch, how, 2, 1.0)[0]
        memory = replace(memory, activations=dense)
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


def show_deepspeed_memory(args, gpus: int) -> int:
    """Model states as DeepSpeed holds them for a config (simpar.memory, deepspeed_habits and friends)."""
    from simpar.deepspeed import load, read_config

    if args.params is not None or args.strategy is not None:
        raise SimparError("--deepspeed: the config gives the strategy and the model comes from --model; leave "
                          f"{'--params' if args.params is not None else '--strategy'} out")
    per_node = units.positive_int(args.gpus_per_node or str(min(gpus, 8)), "--gpus-per-node")
    if gpus % per_node:
        raise SimparError(f"--gpus-per-node: {gpus} GPUs are not whole nodes of {per_node}")
    spec = model(args.model or "gpt2")
    ds = read_config(load(args.deepspeed), spec, gpus, args.precision)
    train = TrainSpec(precision=ds.precision, optimizer=ds.optimizer or args.optimizer)
    states = model_states(ds.strategy, spec.params, gpus, train, ds.options.get("deepspeed_habits", False),
                          ds.options.get("offload_params", False), largest_module(spec))
    gpu = states.params + states.grads + states.optimizer + states.working
    result = {"model": spec.name, "params": spec.params, "strategy": ds.strategy, "gpus": gpus, "gpus_per_node": per_node,
              "precision": ds.precision, "per_gpu": states.to_json(), "model_states_per_gpu": gpu,
              "host_per_node": states.host * per_node, "largest_module_params": largest_module(spec)}
    if args.json and write_json(result, args.json):
        return 0
    for line in ds.report():
        print(line)
    print(f"{spec.name} on {gpus} GPUs ({gpus // per_node} node(s) of {per_node}), {ds.strategy}, {ds.precision}, as "
          "DeepSpeed holds it")
    for label, value in (("params", states.params), ("grads", states.grads), ("optimizer", states.optimizer),
                         ("working", states.working)):
        print(f"  {label:<12}{units.human_bytes(value):>12}  ({value:,.0f} B)")
    print(f"  {'GPU total':<12}{units.human_bytes(gpu):>12}  ({gpu:,.0f} B): model states per GPU")
    if states.host:
        print(f"  {'host/node':<12}{units.human_bytes(states.host * per_node):>12}  ({states.host * per_node:,.0f} B)")
    print("  grads include DeepSpeed's fp32 gradient partition; working is ZeRO-3's largest module "
          f"({largest_module(spec):,} parameters) gathered with its gradients, in 16 bits")
    return 0
