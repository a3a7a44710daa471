"""Lesson 8 - DeepSpeed as it really is: two HF-Trainer templates, simulated and run with DeepSpeed."""

from lessons.source.cells import SETUP, code, md

CELLS = [
    md("""
# Lesson 8 - DeepSpeed as it really is

Most people meet ZeRO through a `ds_config.json`. Here are the two templates the HF Trainer
documentation made famous: ZeRO-2 with the optimizer offloaded to the CPU, and ZeRO-3 with parameters
and optimizer offloaded. We read them the way DeepSpeed does, count the memory DeepSpeed really holds,
simulate a step, then run both with DeepSpeed itself on CPU ranks and explain every difference."""),
    code(SETUP + """
from simpar.deepspeed import filled, read_config
from simpar.memory import largest_module, model_states
from simpar.train import TrainSpec

ZERO2 = {"fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
         "bfloat16": {"enabled": False},  # DeepSpeed's old name for bf16
         "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
         "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                               "allgather_bucket_size": 2e8, "overlap_comm": True, "reduce_bucket_size": 2e8,
                               "contiguous_gradients": True},
         "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
         "train_micro_batch_size_per_gpu": "auto"}
ZERO3 = {"bf16": {"enabled": "auto"},
         "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
         "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"},
                               "overlap_comm": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                               "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                               "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9},
         "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
         "train_micro_batch_size_per_gpu": "auto"}
TEMPLATES = {"ZeRO-2 + CPU offload": ZERO2, "ZeRO-3 + param/optimizer offload": ZERO3}"""),
    md("""
## 1. Reading the configs as DeepSpeed does

Every `"auto"` is filled as the HF Trainer fills it (batch sizes from the command line, bucket sizes
from the hidden size), every key left out takes DeepSpeed's default, and nothing is silently dropped:
keys simpar does not model are listed. Note `fp16: auto` with no `--fp16`: both templates' first one
trains in fp32."""),
    code("""
llama = model("llama2-7b")
for name, config in TEMPLATES.items():
    ds = read_config(config, llama, 16, micro_flag=1)
    print(f"--- {name}")
    for line in ds.report():
        print(line)"""),
    md("""
## 2. What DeepSpeed holds: more than the ZeRO paper's 16 bytes

The ZeRO paper counts 2 + 2 + 12 bytes a parameter. DeepSpeed's optimizers also keep an **fp32 copy of
each gradient partition** for the step (4 more), and ZeRO-3 gathers whole modules to compute (the largest
one, with its gradients, 4 bytes a parameter). Offload moves the optimizer states, the fp32 gradients
and (ZeRO-3's `offload_param`) the 16-bit parameter shards to the host."""),
    code("""
train = TrainSpec(precision="bf16-mixed")
rows = {}
for strategy, params_off in [("zero2", False), ("zero2-offload", False), ("zero3", False),
                             ("zero3-offload", False), ("zero3-offload", True)]:
    paper = model_states(strategy, llama.params, 16, train)
    held = model_states(strategy, llama.params, 16, train, deepspeed_habits=True, offload_params=params_off,
                        largest_module=largest_module(llama))
    label = strategy + (" +params" if params_off else "")
    gpu = lambda m: m.params + m.grads + m.optimizer + m.working  # noqa: E731
    rows[label] = gpu(held) / 2**30
    print(f"{label:>20}: ZeRO paper {units.human_bytes(gpu(paper)):>10} per GPU, DeepSpeed {units.human_bytes(gpu(held)):>10}"
          f"; host per node of 8: {units.human_bytes(8 * held.host)}")
try:
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    _, estimate = estimate_zero2_model_states_mem_needs(llama.params, 8, 2, cpu_offload=False,
                                                        additional_buffer_factor=1.0)
    print(f"DeepSpeed's own estimator, ZeRO-2 on 2 nodes of 8: {units.human_bytes(estimate)} per GPU")
except ImportError:
    print("(pip install 'simpar[deepspeed]' to compare with DeepSpeed's own estimators)")
fig, ax = plt.subplots(figsize=(7, 3))
plots.plot_bars(ax, rows, "GiB per GPU", "LLaMA-2-7B model states on 16 GPUs, as DeepSpeed holds them")"""),
    md("## 3. A simulated step of each template (GPT-2 XL, 8 A100s)"),
    code("""
xl = model("gpt2-xl")
times = {}
for name, config in TEMPLATES.items():
    ds = read_config(config, xl, 8, micro_flag=1)
    result = simulate(make_scenario(xl, ds.strategy, 8, precision=ds.precision, recompute="full",
                                    micro_batch=ds.micro_batch, global_batch=ds.global_batch, **ds.options))
    times[name] = {part: seconds * 1e3 for part, seconds in result.breakdown.items() if seconds}
    print(f"{name}: {ds.strategy}, {ds.precision}, step {units.human_time(result.step_time_s)}: "
          + ", ".join(f"{k} {v:.0f} ms" for k, v in times[name].items()))
fig, axes = plt.subplots(1, 2, figsize=(12, 3))
for ax, (name, parts) in zip(axes, times.items()):
    plots.plot_bars(ax, parts, "ms", name)"""),
    md("""
## 4. DeepSpeed itself, on two CPU ranks

Now the real thing: `deepspeed.initialize` on two gloo processes, the same small GPT (tiny-deep) as
simpar's executor, the same data. Three things are changed so the training can be compared, and
listed: the config's optimizer gives way to simpar's (DeepSpeed runs it as a client optimizer), and
clipping is off. Beside it, the simulation priced **with DeepSpeed's habits**. On the command line:
`simpar run --deepspeed CONFIG --compare-real --engine deepspeed`."""),
    code("""
import importlib.util

from simpar.real.cpu_profile import cpu_topology
from simpar.real.executor import single_process

tiny = model("tiny-deep")
if importlib.util.find_spec("deepspeed") is None:
    print("DeepSpeed is not installed here: pip install 'simpar[deepspeed]' and run this cell again")
else:
    from simpar.real.deepspeed_engine import run_config, run_deepspeed

    for name, config in TEMPLATES.items():
        ds = read_config(config, tiny, 2, micro_flag=1)
        scenario = make_scenario(tiny, ds.strategy, 2, topology="cpu-host", precision=ds.precision,
                                 micro_batch=ds.micro_batch, global_batch=ds.global_batch, **ds.options)
        run, changed = run_config(filled(config, ds))
        real = run_deepspeed(scenario, run, steps=3, seed=0, timeout=300)
        sim = simulate(scenario, topology=cpu_topology(2), serial=True)
        reference = single_process(scenario, 3, 0)["losses"]
        gap = max(abs(a - b) for a, b in zip(real["losses"], reference))
        print(f"--- {name} ({ds.strategy}, {ds.precision})")
        print(f"losses {[round(x, 4) for x in real['losses']]}, one process on the whole batch: "
              f"{[round(x, 4) for x in reference]} (largest difference {gap:.1e})")
        measured, simulated = real["ranks"][0], sim.ranks[0]
        print(f"bytes sent per step: simulated {units.human_bytes(simulated['bytes_sent'])}, DeepSpeed "
              f"{units.human_bytes(measured['bytes_sent'])} (counted at torch.distributed, as ring bytes)")
        for category in ("params", "grads", "optimizer", "host"):
            print(f"  {category:>9}: simulated {units.human_bytes(simulated['memory'][category]):>10}, "
                  f"DeepSpeed holds {units.human_bytes(measured['memory'].get(category, 0)):>10}")
        for line in changed:
            print("  changed:", line)"""),
    md("""
## 5. Every difference, explained

* **Gradients reduced by all-reduce.** DeepSpeed's ZeRO-1/2 all-reduce each bucket and keep their
  partition (`stage_1_and_2.py`, `average_tensor` → `allreduce_and_copy`): twice the bytes of the
  reduce-scatter the ZeRO paper describes. simpar's DeepSpeed pricing does the same; its own executor
  reduce-scatters.
* **fp32 gradient partitions.** The 18 bytes a parameter of DeepSpeed's estimators; with ZeRO-1/2 the
  16-bit partition becomes fp32 inside `step()`, so the two exist together only for a moment (a sampled
  measurement can miss it; the estimator and simpar count both).
* **ZeRO-3 releases everything when a backward ends** (`release_and_reset_all`), whatever
  `stage3_max_reuse_distance` says: each micro-batch gathers the model again, except the small
  parameters (`stage3_param_persistence_threshold`), which stay whole and are gathered once after the
  step. Its first step is different: it records the order modules run in, and without that record it
  neither prefetches nor keeps anything for the backward (bytes are compared from the second step on).
* **ZeRO-3 keeps its 16-bit gradient partition** (`grad_partitions_flat_buffer`, on the GPU or, with
  offload, on the host) beside the fp32 copy it makes for the step: 2 bytes a parameter over N more
  than DeepSpeed's own estimator counts.
* **Offload** puts the optimizer states, fp32 gradients (and with `offload_param` the 16-bit parameter
  shards) in host memory: the GPU keeps almost nothing, PCIe carries every step.
* **Time**: DeepSpeed's per-module hooks and hundreds of small collectives cost Python time on CPU
  ranks; on GPUs the same mechanism shows as launch and latency overhead, which the simulator prices."""),
    md("""
## Takeaway

A DeepSpeed config is a program: its defaults and "auto" values decide buckets, prefetching and
overlap, and DeepSpeed holds more than the ZeRO paper's 16 bytes a parameter (18 with its fp32 gradient
partitions, plus ZeRO-3's working set). Read the config as DeepSpeed does, count what it really holds,
and check against a real run: the bytes and the model states agree; the difference left is time."""),
]
