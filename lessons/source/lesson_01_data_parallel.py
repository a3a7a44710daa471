"""Lesson 1 - Data parallelism: Worker-Server vs Ring."""

from lessons.source.cells import SETUP, code, md

CELLS = [
    md("""
# Lesson 1 - Data parallelism: Worker-Server vs Ring

Every data-parallel rank computes gradients on its own micro-batch; before the optimizer step they
must be summed. Two ways:

* **Worker-Server** (parameter server): every worker pushes its Φ gradient bytes to a server, which
  sums and sends Φ back. A worker moves 2Φ, but the server moves **2NΦ**: it is the bottleneck.
* **Ring all-reduce**: a reduce-scatter then an all-gather around a ring. Every rank moves
  **2(N−1)/N·Φ** - independent of N - and no node is special.

We measure both with simpar's simulator, then for real with the reference executor."""),
    code(SETUP + """
from simpar import topologies
from simpar.collective_run import simulate_collective"""),
    md("## Bytes per worker and at the server as N grows"),
    code("""
size = 1e9  # one gigabyte of gradients
ns = [2, 4, 8, 16, 32]
worker, server, ring = [], [], []
for n in ns:
    ps = simulate_collective(topologies.build("star", n, 100e9, 5e-6), "allreduce", "ps", size)
    rg = simulate_collective(topologies.build("ring", n, 100e9, 5e-6), "allreduce", "ring", size)
    worker.append(ps.ranks[0]["bytes_sent"] / 1e9)
    server.append(ps.server["bytes_sent"] / 1e9)
    ring.append(rg.ranks[0]["bytes_sent"] / 1e9)
    print(f"N={n:>2}: worker sends {worker[-1]:.2f} GB, server {server[-1]:.1f} GB (N x size), "
          f"ring rank {ring[-1]:.3f} GB (2(N-1)/N = {2 * (n - 1) / n:.3f})")
fig, ax = plt.subplots(figsize=(7, 4))
plots.plot_series(ax, ns, {"Worker-Server: server": server, "Worker-Server: worker": worker,
                           "ring: every rank": ring}, "ranks N", "GB sent per all-reduce of 1 GB",
                  "who carries the traffic", logy=True)"""),
    md("""
## Try it: ranks, message size and bandwidth

Move the sliders (in JupyterLab: `simpar lessons`). Worker-Server's time grows with N, the ring's
hardly moves; at small messages the ring's 2(N−1) latency steps start to show."""),
    code("""
from ipywidgets import FloatLogSlider, IntSlider, interact


def race(ranks=8, megabytes=256.0, gigabits_per_s=100.0):
    size, rate = megabytes * 1e6, gigabits_per_s * 1e9 / 8
    ps = simulate_collective(topologies.build("star", ranks, rate, 5e-6), "allreduce", "ps", size)
    rg = simulate_collective(topologies.build("ring", ranks, rate, 5e-6), "allreduce", "ring", size)
    print(f"{ranks} ranks, {megabytes:g} MB at {gigabits_per_s:g} Gb/s: Worker-Server {units.human_time(ps.time_s)}, "
          f"ring {units.human_time(rg.time_s)} ({ps.time_s / rg.time_s:.1f}x faster)")
    fig, ax = plt.subplots(figsize=(6, 2.5))
    plots.plot_bars(ax, {"Worker-Server": ps.time_s * 1e3, "ring": rg.time_s * 1e3}, "ms", "one all-reduce")
    plt.show()


interact(race, ranks=IntSlider(value=8, min=2, max=64), megabytes=FloatLogSlider(value=256, base=2, min=-4, max=12),
         gigabits_per_s=FloatLogSlider(value=100, base=10, min=0, max=3));"""),
    md("## Time on PCIe vs NVLink"),
    code("""
times = {}
for name in ["pcie", "nvlink-full"]:
    for algo in ["ps", "ring"]:
        r = simulate_collective(topologies.build(name, 4, None, None), "allreduce", algo, size)
        times[f"{algo} on {name}"] = r.time_s * 1e3
        print(f"{algo:>4} all-reduce of 1 GB on 4 GPUs, {name:<12}: {units.human_time(r.time_s)}")
fig, ax = plt.subplots(figsize=(7, 3.5))
plots.plot_bars(ax, times, "ms", "1 GB all-reduce, 4 GPUs")"""),
    md("""
## For real: the reference executor on 2 and 4 CPU ranks

`run_real` performs the same Plan as the simulator with torch.distributed (gloo), one process per
rank, and counts every byte each rank sends. Worker-Server puts the server on rank 0."""),
    code("""
from simpar.real.compare import run_real
from simpar.real.cpu_profile import cpu_topology

rows = {}
for n in [2, 4]:
    for strategy in ["dp", "ddp"]:
        scenario = make_scenario(model("tiny"), strategy, n, topology="cpu-host", precision="fp32")
        real = run_real(scenario, steps=2)
        sim = simulate(scenario, topology=cpu_topology(n))
        sent = [r["bytes_sent"] for r in real["ranks"]]
        assert sent == [r["bytes_sent"] for r in sim.ranks]  # measured bytes == simulated, rank by rank
        rows[f"{strategy} N={n} rank0"] = sent[0] / 1e3
        rows[f"{strategy} N={n} rank1"] = sent[1] / 1e3
        print(f"{strategy:>3} on {n} ranks: bytes sent per rank {sent} (simulated: the same)")
fig, ax = plt.subplots(figsize=(8, 3.5))
plots.plot_bars(ax, rows, "kB sent per step", "measured: rank 0 (server) vs rank 1")"""),
    md("""
## Takeaway

The ring keeps every rank's traffic at 2(N−1)/N·Φ no matter how many ranks join, while a parameter
server's traffic grows as 2NΦ and caps the whole job at its own link: that is why DDP, NCCL and
every ZeRO stage use ring (or tree) collectives. Fast links (NVLink) shrink the time, but not the
server's N-fold share. The real run moved exactly the bytes the simulator predicted."""),
]
