"""Lesson 9 - Mixture-of-Experts and expert parallelism."""

from lessons.source.cells import SETUP, code, md

CELLS = [
    md("""
# Lesson 9 - Mixture-of-Experts: why all-to-all

An MoE layer replaces the MLP by E experts and a router; each token goes to its top-k experts.
Mixtral-8x7B holds **46.7 B** parameters but a token runs through **12.9 B** of them: memory counts
every expert, FLOPs only the active ones.

Expert parallelism (`--ep E`) puts each rank's share of the experts on it. A token's hidden state must
travel to the rank holding its expert and back: an **all-to-all** after the router (dispatch) and after
the experts (combine), and both again in backward. Per rank and direction it moves

  tokens × top-k × hidden × bytes × f × (ep−1)/ep,

with f the capacity factor (buffers are padded to a capacity; tokens beyond it are dropped) or, routing
without dropping, the busiest expert's load over the mean (the buffer is sized to it)."""),
    code(SETUP + """
from simpar.models.moe import buffer_rows, dropped_share
from simpar.plan import Collective
from simpar.strategies import build_plan

m = model("mixtral-8x7b")
print(f"{m.name}: {m.params / 1e9:.1f} B parameters, {m.active_params / 1e9:.1f} B active per token")
print(f"model FLOPs of a MoE layer vs a dense one of the same MLP: "
      f"{m.layer_forward_flops(1, 'moe') / m.layer_forward_flops(1):.2f}x (top-2, not 8x)")"""),
    md("## Bytes of the all-to-alls, counted in the Plan"),
    code("""
for ep in (2, 4, 8):
    scenario = make_scenario(m, "zero2", 64, ep=ep, recompute="full")
    calls = [op for op in build_plan(scenario).programs[0].ops if isinstance(op, Collective) and op.op == "alltoall"]
    per_rank = sum(c.nbytes for c in calls) * (ep - 1) / ep
    print(f"ep {ep}: {len(calls)} all-to-alls a step (dispatch, combine and their gradients, and the recomputed forward's), "
          f"{units.human_bytes(per_rank)} sent per rank")"""),
    md("""
## Inside a node or across nodes

DeepSeek-MoE-16B has 64 fine-grained experts, so its expert-parallel group can stay inside one DGX
node (ep 8, NVSwitch) or span 2 and 4 nodes (ep 16, 32): across nodes each rank's 200 Gb/s NIC
carries what NVLink carried at 300 GB/s."""),
    code("""
deepseek = model("deepseek-moe-16b")
times, traffic = {}, {}
for ep in (1, 8, 16, 32):
    scenario = make_scenario(deepseek, "zero2", 64, ep=ep, micro_batch=2, recompute="full")
    result = simulate(scenario)
    times[f"ep {ep}"] = result.step_time_s
    traffic[f"ep {ep}"] = result.ranks[0]["bytes_sent"] / 2**30
    print(f"ep {ep:>2} on 64 GPUs: step {units.human_time(result.step_time_s)}, "
          f"{units.human_bytes(result.ranks[0]['bytes_sent'])} sent per rank, "
          f"params {units.human_bytes(result.ranks[0]['memory']['params'])} per rank")
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
plots.plot_bars(axes[0], times, "s", "DeepSeek-MoE-16B step, 64 A100s")
plots.plot_bars(axes[1], traffic, "GiB", "sent per rank per step")"""),
    md("""
## Capacity and imbalance

A router rarely spreads tokens evenly. With a capacity factor the buffers stay the same size and the
busiest expert's overflow is dropped; without one the buffer (and the all-to-all) grows with the
imbalance."""),
    code("""
import dataclasses

loads = [1.0, 1.25, 1.5, 2.0, 3.0]
capped = dataclasses.replace(m, capacity_factor=1.25)
rows_dropless = [buffer_rows(m, 1, x) / (m.seq * m.top_k) for x in loads]
dropped = [100 * dropped_share(capped, x) for x in loads]
for x, r, d in zip(loads, rows_dropless, dropped):
    print(f"busiest expert at {x:.2f}x the mean: dropless buffer {r:.2f}x the tokens' copies, "
          f"capacity 1.25 drops {d:.1f} % of them")
fig, ax = plt.subplots(figsize=(7, 3.5))
plots.plot_series(ax, loads, {"dropless: all-to-all bytes (x uniform)": rows_dropless,
                              "capacity 1.25: % copies dropped": dropped}, "busiest expert's load / mean", "",
                  "imbalance costs bytes or tokens")"""),
    md("## For real: experts on two ranks, gloo"),
    code("""
from simpar.real.compare import run_real
from simpar.real.cpu_profile import cpu_topology

scenario = make_scenario(model("tiny-moe"), "ddp", 2, ep=2, topology="cpu-host", precision="fp32")
real, sim = run_real(scenario, steps=2), simulate(scenario, topology=cpu_topology(2))
print("measured bytes per rank:", [r["bytes_sent"] for r in real["ranks"]])
print("simulated bytes per rank:", [r["bytes_sent"] for r in sim.ranks])"""),
    md("""
## Takeaway

MoE buys parameters without FLOPs, and pays in memory (every expert is stored) and in all-to-all
traffic that sits on the critical path of every MoE layer, four times a step. Keep expert parallelism
inside a node when the experts fit; across nodes the all-to-all runs at the NIC's speed. Imbalance
either drops tokens (capacity) or inflates the buffers (dropless). The executor's experts exchange
exactly the simulated bytes."""),
]
