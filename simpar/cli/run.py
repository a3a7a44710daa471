"""``simpar run``: simulate one training step of a strategy and show where the time and memory go."""

from __future__ import annotations

import os

from simpar import units
from simpar.cli.moe_flags import add_moe_flags, moe_model, moe_options
from simpar.cli.common import (add_cluster_flags, add_json_flag, add_seq_flag, cluster_choice, is_gpu_profile,
                               scenario_json, with_seq, write_figures, write_json)
from simpar.errors import SimparError
from simpar.deepspeed import load as load_deepspeed
from simpar.deepspeed import read_config
from simpar.models import resolve_model
from simpar.scenario import (
    RECOMPUTE,
    SCHEDULES,
    STRATEGY_NAMES,
    Scenario,
    make_scenario,
)
from simpar.sim import PARTS, SimResult, build_topology, simulate
from simpar.topologies import PRESETS as TOPOLOGIES
from simpar.train import OPTIMIZERS, PRECISIONS


def register(sub) -> None:
    p = sub.add_parser("run", help="simulate one training step of a strategy (--compare-real: and run it)",
                       description="Simulate one training step: step time with a breakdown (compute, exposed "
                                   "communication, pipeline bubble, offload), traffic and memory per rank. "
                                   "Every flag has a default, so a bare 'simpar run' works.")
    p.add_argument("--strategy", help=f"one of {', '.join(STRATEGY_NAMES)} (default ddp)")
    p.add_argument("--gpus", help="number of GPUs (default 8; all of a --cluster's)")
    p.add_argument("--model", help="model preset, see 'simpar models', or a Hugging Face config.json (GPT-2 or "
                                    "LLaMA style) (default gpt2; tiny-deep with --compare-real)")
    add_seq_flag(p)
    p.add_argument("--deepspeed", metavar="DS_CONFIG",
                   help="a DeepSpeed config (ds_config.json): ZeRO stage, offload, batch sizes, fp16/bf16, buckets, "
                        "overlap_comm, prefetch; 'auto' values are resolved and shown, unmodelled keys listed")
    p.add_argument("--topology", help=f"one of {', '.join(TOPOLOGIES)} (default dgx-a100; --compare-real "
                                      "simulates the machine it runs on instead)")
    add_cluster_flags(p)
    p.add_argument("--hardware", metavar="PATH",
                   help="a hardware profile from 'simpar calibrate': simulate the calibrated machine (one rank "
                        "per process) instead of --topology; a GPU profile (calibrate --backend nccl) prices "
                        "--topology's GPUs with what was measured instead")
    p.add_argument("--bandwidth", help="link bandwidth for the ring/star topologies, e.g. 100GB/s")
    p.add_argument("--latency", help="per-hop latency for the ring/star topologies, in seconds")
    p.add_argument("--micro-batch", help="sequences per micro-batch per rank (default 1)")
    p.add_argument("--global-batch", help="sequences per step (default micro-batch x dp x micro-batches)")
    p.add_argument("--microbatches", help="micro-batches per step per rank: gradient accumulation, or the "
                                          "pipeline's m (default 1; 4 x pp with a pipeline)")
    p.add_argument("--precision", help=f"one of {', '.join(PRECISIONS)} (default bf16-mixed; fp32 with "
                                       "--compare-real on CPU)")
    p.add_argument("--optimizer", default="adam", help=f"one of {', '.join(OPTIMIZERS)}")
    p.add_argument("--dp", help="data-parallel degree (pp/tp/3d; default: what the other degrees leave)")
    p.add_argument("--pp", help="pipeline stages (default: all GPUs for --strategy pp, else 1)")
    p.add_argument("--tp", help="tensor-parallel degree (default: all GPUs for --strategy tp, else 1)")
    p.add_argument("--cp", default="1", help="context-parallel degree: each sequence split over this many ranks "
                                            "(pp/tp/3d; default 1)")
    p.add_argument("--cp-algo", default="ring", help="context-parallel attention: ring (key/value blocks passed "
                                                     "round, zig-zag) or ulysses (all-to-alls to heads); default ring")
    p.add_argument("--schedule", default="1f1b", help=f"pipeline schedule: {', '.join(SCHEDULES)} (default 1f1b; "
                                                     "zb-h1 and zb-v split the backward into input and weight "
                                                     "gradients to fill the bubbles)")
    p.add_argument("--virtual-stages", default="1", help="model chunks per rank, interleaved schedule (default 1)")
    p.add_argument("--algo", help="collective algorithm for data-parallel traffic: ring, ps, tree, hierarchical "
                                  "(default ring; dp is always ps)")
    p.add_argument("--bucket", default="25MiB", help="DDP / ZeRO gradient bucket size (default 25MiB)")
    p.add_argument("--prefetch", default="1", help="ZeRO-3: units gathered ahead of compute (default 1)")
    p.add_argument("--gather-granularity", help="ZeRO-3: all-gather the parameters a module at a time (module, "
                                                "DeepSpeed's way and the default for zero3) or a layer at a time "
                                                "(layer: the ZeRO paper's count, FSDP's usual wrapping)")
    p.add_argument("--max-reuse-distance", default="0",
                   help="ZeRO-3 by module: keep a gathered module if it runs again within this many parameters "
                        "(DeepSpeed's stage3_max_reuse_distance; default 0: release after every use)")
    p.add_argument("--recompute", default="none", help=f"activation recomputation: {', '.join(RECOMPUTE)}")
    p.add_argument("--flash-attention", action="store_true", help="attention scores are never stored")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="tp/3d: Megatron sequence parallelism (Korthikanti et al. 2022): each TP all-reduce becomes a "
                        "reduce-scatter + all-gather, norms and dropouts split over the TP ranks")
    p.add_argument("--tp-comm-overlap", action="store_true",
                   help="tp/3d: Megatron's async TP communication: the backward's input-gradient all-reduce "
                        "(reduce-scatter with --sequence-parallel) overlaps the weight-gradient GEMM")
    mcore = p.add_argument_group("Megatron-Core's overlaps (pp/tp/3d)")
    mcore.add_argument("--overlap-grad-reduce", action="store_true",
                       help="each gradient bucket's reduce-scatter starts as the last micro-batch's backward "
                            "finishes it")
    mcore.add_argument("--overlap-param-gather", action="store_true",
                       help="the parameters' all-gather runs bucket by bucket under the next step's first forward")
    mcore.add_argument("--tp-comm-userbuffers", action="store_true",
                       help="with --sequence-parallel: the forward's TP all-gathers and reduce-scatters, and the "
                            "backward's output-gradient all-gathers, stream under the GEMMs they feed and follow "
                            "(Transformer Engine userbuffers, Megatron-Core's --tp-comm-overlap; implies "
                            "--tp-comm-overlap)")
    p.add_argument("--grad-accum-dtype", help="dtype of the main gradients: fp32 (Megatron; 18 bytes per parameter "
                                              "with mixed-precision Adam), bf16 or fp16 (default: the weights')")
    p.add_argument("--exact", action="store_true",
                   help="simulate every op as events, links shared under contention, every micro-batch. Without it "
                        "pipeline and tensor-parallel plans (pp, tp, 3d) are priced on the fast path: every op at a "
                        "fixed duration, each network op once on an idle network, a long pipeline from two short "
                        "ones (seconds instead of minutes at thousands of GPUs; tests hold it to this)")
    p.add_argument("--no-replay", action="store_true",
                   help="simulate every collective in full, even when a recorded one could be replayed")
    p.add_argument("--memory-timeline", action="store_true",
                   help="add sim.memory_timeline to the JSON: GPU bytes in use over the step, per program")
    p.add_argument("--op-timeline", action="store_true",
                   help="add sim.op_timeline to the JSON: every op's stream, class, start and end, per program "
                        "(with --compare-real, real.op_timeline holds the measured ones, per rank, alike)")
    p.add_argument("--trace", metavar="PATH",
                   help="write a Chrome trace-event JSON (Perfetto, chrome://tracing): a process per rank, a thread "
                        "per stream, link utilisation counters; with --compare-real the real run beside it")
    p.add_argument("--plot", metavar="PATH", help="draw the run (timeline, memory per rank and over time, traffic "
                                                  "per link; with --compare-real simulated vs measured) to an image")
    real = p.add_argument_group("running it for real (--compare-real)")
    real.add_argument("--compare-real", action="store_true",
                      help="also perform the step for real, one process per rank with torch.distributed, "
                           "and show simulated and measured figures side by side")
    real.add_argument("--steps", default="auto",
                      help="training steps to run for real; the first is a warm-up, left out of the step time "
                           "(default auto: about 3 s of steps at the simulated step time, 3 to 200; 3 beside "
                           "--engine deepspeed)")
    real.add_argument("--backend", default="gloo", help="torch.distributed backend: gloo (CPU, default) or nccl")
    real.add_argument("--timeout", default="600", help="seconds before a hung run is aborted (default 600)")
    real.add_argument("--seed", default="0", help="seed of the model's weights and the token batches")
    real.add_argument("--collectives", default="explicit",
                      help="explicit (default): the Plan's algorithm (ring, Worker-Server) as counted point-to-point "
                           "sends; native: the backend's own collectives, timed but their traffic not counted")
    real.add_argument("--engine", default="simpar",
                      help="simpar (default): simpar's executor performs the Plan; deepspeed: also train the same "
                           "model with DeepSpeed itself on the --deepspeed config, a third column (needs "
                           "pip install 'simpar[deepspeed]')")
    add_moe_flags(p)
    add_json_flag(p, "{scenario, sim} (with --compare-real also real and comparison)")
    p.set_defaults(handler=run)


def _optional_int(value, flag):
    return None if value is None else units.positive_int(value, flag)


def scenario_and_notes(args) -> tuple[Scenario, list[str]]:
    """The Scenario the flags describe, and notes on what was read from files (ignored keys,
    resolved "auto" values)."""
    cpu_hardware = getattr(args, "hardware", None) is not None and not is_gpu_profile(args.hardware)
    compare = getattr(args, "compare_real", False) or cpu_hardware
    for flag, value in (("--topology", args.topology), ("--cluster", args.cluster), ("--device", args.device)):
        if cpu_hardware and value is not None:
            raise SimparError(f"{flag}: --hardware gives the machine to simulate; leave {flag} out")
        if compare and value is not None:
            raise SimparError(f"{flag}: --compare-real simulates the machine the ranks really run on "
                              f"(a built-in CPU-host profile); leave {flag} out")
    spec, notes = resolve_model(args.model or ("tiny-deep" if compare else "gpt2"))
    spec = with_seq(args, spec)
    spec = moe_model(args, spec)
    topology, gpus = cluster_choice(args, "dgx-a100", 8)
    micro_batch = _optional_int(args.micro_batch, "--micro-batch")
    global_batch = _optional_int(args.global_batch, "--global-batch")
    microbatches = _optional_int(args.microbatches, "--microbatches")
    strategy, precision, optimizer, options = args.strategy or "ddp", args.precision, args.optimizer, {}
    if getattr(args, "deepspeed", None):
        for flag, value in (("--strategy", args.strategy), ("--microbatches", args.microbatches),
                            ("--dp", args.dp), ("--pp", args.pp), ("--tp", args.tp)):
            if value is not None:
                raise SimparError(f"{flag}: --deepspeed gives the strategy and batch; leave {flag} out")
        ds = read_config(load_deepspeed(args.deepspeed), spec, gpus, precision, micro_batch, global_batch)
        strategy, precision, micro_batch, global_batch = ds.strategy, ds.precision, ds.micro_batch, ds.global_batch
        microbatches, optimizer, options = ds.microbatches, ds.optimizer or optimizer, ds.options
        notes += ds.report()
        if compare and options.get("offload_params") and getattr(args, "engine", "simpar") != "deepspeed":
            raise SimparError("--compare-real: offload_param (parameters in host memory) is simulated, but "
                              "simpar's executor does not perform it yet; run it with --engine deepspeed, or "
                              "drop it from the config")
        if compare and (options.pop("deepspeed_habits", False) | bool(options.pop("param_persistence_threshold", 0))):
            notes.append("deepspeed: --compare-real runs simpar's executor, which keeps the ZeRO paper's model states "
                         "and gathers every module; DeepSpeed's fp32 gradient partitions and persistent small "
                         "parameters are left out of this simulation")
    options = {"bucket_bytes": units.whole_bytes(args.bucket, "--bucket"),
               "prefetch": units.positive_int(args.prefetch, "--prefetch", minimum=0),
               "grad_accum_dtype": args.grad_accum_dtype.strip().lower() if args.grad_accum_dtype else None,
               "gather_granularity": args.gather_granularity.strip().lower() if args.gather_granularity else None,
               "max_reuse_distance": units.positive_int(args.max_reuse_distance, "--max-reuse-distance", minimum=0),
               **moe_options(args), **options}
    scenario = make_scenario(
        spec, strategy, gpus, topology="cpu-host" if compare else topology, device=args.device,
        micro_batch=micro_batch or 1, global_batch=global_batch, microbatches=microbatches,
        precision=precision or ("fp32" if compare else "bf16-mixed"), optimizer=optimizer,
        dp=_optional_int(args.dp, "--dp"), pp=_optional_int(args.pp, "--pp"), tp=_optional_int(args.tp, "--tp"),
        bandwidth=None if args.bandwidth is None else units.positive(args.bandwidth, "--bandwidth"),
        latency=None if args.latency is None else units.non_negative(args.latency, "--latency"),
        algo=args.algo.strip().lower() if args.algo else None,
        schedule=args.schedule.strip().lower(),
        virtual_stages=units.positive_int(args.virtual_stages, "--virtual-stages"),
        cp=units.positive_int(args.cp, "--cp"), cp_algo=args.cp_algo.strip().lower(),
        recompute=args.recompute.strip().lower(), flash_attention=args.flash_attention,
        sequence_parallel=args.sequence_parallel, tp_comm_overlap=args.tp_comm_overlap,
        overlap_grad_reduce=args.overlap_grad_reduce, overlap_param_gather=args.overlap_param_gather,
        tp_comm_userbuffers=args.tp_comm_userbuffers, **options)
    return scenario, notes


def _check_writable(path: str | None, flag: str) -> None:
    """Fail before a long run, not after it, when an output cannot be written."""
    if path and path != "-" and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise SimparError(f"{flag}: cannot write {path!r}: its folder does not exist")


def run(args) -> int:
    for path, flag in ((args.trace, "--trace"), (args.plot, "--plot"), (args.json, "--json")):
        _check_writable(path, flag)
    engine = args.engine.strip().lower()
    if engine not in ("simpar", "deepspeed"):
        raise SimparError(f"--engine: must be simpar or deepspeed, got {args.engine!r}")
    if engine == "deepspeed":
        if not args.compare_real or not args.deepspeed:
            raise SimparError("--engine: deepspeed trains a --deepspeed config for real beside the simulation; give "
                              "--deepspeed CONFIG and --compare-real")
        from simpar.real.deepspeed_engine import require

        require()
    scenario, notes = scenario_and_notes(args)
    if args.compare_real:
        from simpar.cli.run_compare import run_and_compare  # imports torch: only when asked

        return run_and_compare(args, scenario, notes)
    topology = None
    if args.hardware:
        from simpar.calibrate.profile import HardwareProfile

        profile = HardwareProfile.load(args.hardware)
        if is_gpu_profile(args.hardware):  # measured kernel constants for the simulated cluster's GPUs
            topology = build_topology(scenario)
            profile.apply(topology)
        else:
            topology = profile.topology(scenario.cluster.gpus, scenario.train.precision)
    quick = on_fast_path(scenario, topology) and not (args.exact or args.trace or args.no_replay)
    result = simulate(scenario, topology=topology, replay=not args.no_replay, record_links=bool(args.trace),
                      progress=True, fast=quick, extrapolate=quick)
    wrote = write_figures(args, scenario, {"scenario": scenario_json(scenario),
                                           "sim": result.to_json(timeline=True, ops=True, links=True)}) \
        if args.trace or args.plot else []
    if args.json and write_json({"scenario": scenario_json(scenario), "inputs": notes,
                                "sim": result.to_json(timeline=args.memory_timeline, ops=args.op_timeline)},
                               args.json):
        return 0
    for note in notes:
        print(note)
    print_result(scenario, result)
    if scenario.train.fp8:
        from simpar.cli.fp8_gain import as_bf16, print_fp8_gain

        on = topology or build_topology(scenario)
        base = simulate(as_bf16(scenario), topology=on, fast=quick, extrapolate=quick)
        print_fp8_gain(scenario, result, base, on.graph.nodes[on.gpus[0]]["spec"])
    for line in wrote:
        print(line)
    return 0


FAST_STRATEGIES = ("pp", "tp", "3d")  # Megatron-style plans: tests/test_fast_path.py holds them to the events


def on_fast_path(scenario: Scenario, topology) -> bool:
    """Whether ``simpar run`` prices the scenario on the fast path by default: a pipeline or tensor-parallel plan
    on GPUs (CPU ranks sharing cores need the events: sim/cores.py)."""
    return scenario.strategy.name in FAST_STRATEGIES and (topology is None or topology.core_slowdown is None)


def print_result(scenario: Scenario, result: SimResult) -> None:
    s, t, c = scenario.strategy, scenario.train, scenario.cluster
    tokens = t.global_batch * scenario.model.seq
    where = c.topology + (f", GPUs swapped for {c.device}" if c.device else "")
    print(f"{s.name} on {c.gpus} GPUs ({where}): {scenario.model.name}, {t.precision}, {t.optimizer}")
    ep = f" (ep {s.ep})" if s.ep > 1 else ""
    cp = f" x cp {s.cp} ({s.cp_algo})" if s.cp > 1 else ""
    print(f"  layout dp {s.dp}{cp} x pp {s.pp} x tp {s.tp}{ep}; global batch {t.global_batch} = micro-batch "
          f"{t.micro_batch} x dp {s.dp} x {scenario.microbatches} micro-batch(es)")
    if scenario.model.experts:
        print_moe(scenario)
    print(f"\nstep time {units.human_time(result.step_time_s)}  "
          f"({t.global_batch / result.step_time_s:,.1f} samples/s, {tokens / result.step_time_s:,.0f} tokens/s)")
    if result.flops:
        f = result.flops
        fp8 = f" of the bf16 peak, {100 * f['mfu_fp8']:.1f} % of the FP8 peak" if "mfu_fp8" in f else ""
        print(f"  model FLOP/s per GPU {f['model_flops_per_gpu_s'] / 1e12:.1f} T, MFU {100 * f['mfu']:.1f} %{fp8}, "
              f"HFU {100 * f['hfu']:.1f} % (with recomputation)")
    for part in PARTS:
        seconds = result.breakdown[part]
        if seconds > 0 or part == "compute":
            print(f"  {part:<14}{units.human_time(seconds):>12}  {100 * seconds / result.step_time_s:5.1f} %")
    print("\nper rank (identical ranks grouped; memory is the peak of each category):")
    header = ("ranks", "sent", "received", "offload", "params", "grads", "optimizer", "activations", "buffers",
              "peak")
    print("  " + "".join(f"{h:>12}" for h in header))
    for label, row in _grouped(result.ranks):
        m = row["memory"]
        cells = [row["bytes_sent"], row["bytes_received"], row["offload_bytes"], m["params"], m["grads"],
                 m["optimizer"], m["activations"], m["buffers"], m["peak"]]
        print(f"  {label:>12}" + "".join(f"{units.human_bytes(v):>12}" for v in cells))
    host = max(r["memory"]["host"] for r in result.ranks)
    nvme = max(r["memory"]["nvme"] for r in result.ranks)
    if host or nvme:
        print(f"  per rank off the GPU: host {units.human_bytes(host)}, NVMe {units.human_bytes(nvme)}")
    if result.server:
        print(f"  server: sent {units.human_bytes(result.server['bytes_sent'])}, "
              f"received {units.human_bytes(result.server['bytes_received'])}")
    if result.links:
        print("\nbusiest links:")
        for link in result.links[:4]:
            print(f"  {link['name']:<36}{link['kind']:<8}{units.human_bytes(link['bytes']):>12}")
    for note in result.notes:
        print(f"note: {note}")


def print_moe(scenario: Scenario) -> None:
    from simpar.models.moe import step_summary

    moe = step_summary(scenario)
    cap = moe["capacity_factor"]
    rule = f"capacity factor {cap:g}" if cap is not None else "no capacity (buffers sized to the busiest expert)"
    print(f"  MoE: top-{moe['top_k']} of {moe['experts']} experts, ep {moe['ep']}, {rule}, busiest expert "
          f"{moe['imbalance']:g}x the mean: {moe['slots_per_sequence']} slots an expert a sequence"
          + (f" (the 1/{moe['tp']} of it a TP rank routes)" if moe["tp"] > 1 else "") + "; "
          f"{moe['dropped_copies_per_step']:,} of {moe['token_copies_per_step']:,} token copies dropped a step "
          f"({100 * moe['dropped_share']:.1f} %)")


def _grouped(ranks: list[dict]):
    """Consecutive ranks with identical numbers collapse into one row labelled with their range."""
    def key(r):
        return (r["bytes_sent"], r["bytes_received"], r["offload_bytes"], tuple(r["memory"].values()))
    groups: list[list[dict]] = []
    for r in ranks:
        if groups and key(groups[-1][-1]) == key(r) and groups[-1][-1]["rank"] + 1 == r["rank"]:
            groups[-1].append(r)
        else:
            groups.append([r])
    for g in groups:
        label = str(g[0]["rank"]) if len(g) == 1 else f"{g[0]['rank']}-{g[-1]['rank']}"
        yield label, g[0]

