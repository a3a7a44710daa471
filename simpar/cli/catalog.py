"""``simpar devices`` and ``simpar topologies``: what the presets are."""

from __future__ import annotations

from dataclasses import asdict

from simpar import devices, topologies, units
from simpar.cli.common import add_json_flag, write_json
from simpar.errors import SimparError
from simpar.topologies.cluster_file import dump, parse

GiB = 2**30


def register(sub) -> None:
    p = sub.add_parser("devices", help="list GPU, host and NVMe presets",
                       description="List the device presets (datasheet numbers; dense FLOP/s).")
    add_json_flag(p, "the presets")
    p.set_defaults(handler=list_devices)
    p = sub.add_parser("topologies", help="list topology presets; --show one as a cluster file",
                       description="List the topology presets usable with --topology; --show NAME prints one as "
                                   "a cluster file (YAML) to edit and pass back with --cluster.")
    p.add_argument("--show", metavar="NAME", help="print this preset as a cluster file")
    p.add_argument("--gpus", default="8", help="with --show: GPUs to size the preset for (default 8)")
    p.add_argument("--device", help="with --show: the GPU preset to put in it")
    p.add_argument("--bandwidth", help="with --show, ring/star only: link bandwidth, e.g. 100GB/s")
    p.add_argument("--latency", help="with --show, ring/star only: per-hop latency in seconds")
    add_json_flag(p, "the presets (with --show: the cluster)")
    p.set_defaults(handler=list_topologies)


def _tflops(value) -> str:
    return "-" if value is None else f"{value / 1e12:g}"


def list_devices(args) -> int:
    if args.json and write_json({kind: [asdict(s) for s in table.values()]
                                 for kind, table in devices.presets.KINDS.items()}, args.json):
        return 0
    print("GPUs (dense peak TFLOP/s; achievable = peak x fraction)")
    print(f"  {'name':<12}{'fp32':>7}{'tf32':>7}{'fp16':>7}{'bf16':>7}{'frac':>6}{'memory':>10}{'HBM GB/s':>10}")
    for g in devices.GPUS.values():
        print(f"  {g.name:<12}{_tflops(g.fp32_flops):>7}{_tflops(g.tf32_flops):>7}{_tflops(g.fp16_flops):>7}"
              f"{_tflops(g.bf16_flops):>7}{g.achievable_fraction:>6g}{g.memory_bytes / GiB:>7.4g} GiB"
              f"{g.memory_bandwidth / 1e9:>10g}")
    print("\nHosts")
    print(f"  {'name':<20}{'cores':>6}{'DRAM':>10}{'DRAM GB/s':>11}{'CPU-Adam params/s':>19}")
    for h in devices.HOSTS.values():
        print(f"  {h.name:<20}{h.cores:>6}{h.memory_bytes / GiB:>6g} GiB{h.memory_bandwidth / 1e9:>11g}"
              f"{h.adam_params_per_s:>19.3g}")
    print("\nNVMe")
    print(f"  {'name':<16}{'capacity':>10}{'read GB/s':>11}{'write GB/s':>12}")
    for n in devices.NVMES.values():
        print(f"  {n.name:<16}{n.capacity_bytes / 1e12:>7g} TB{n.read_bandwidth / 1e9:>11g}{n.write_bandwidth / 1e9:>12g}")
    return 0


def list_topologies(args) -> int:
    if args.show:
        return show_topology(args)
    for flag in ("device", "bandwidth", "latency"):
        if getattr(args, flag) is not None:
            raise SimparError(f"--{flag}: only with --show NAME")
    rows = [{"name": p.name, "max_gpus": p.max_gpus, "description": p.description,
             "takes_bandwidth_latency": p.takes_link} for p in topologies.PRESETS.values()]
    if args.json and write_json(rows, args.json):
        return 0
    print(f"  {'name':<13}{'max gpus':>9}  description")
    for row in rows:
        print(f"  {row['name']:<13}{row['max_gpus']:>9}  {row['description']}")
    return 0


def show_topology(args) -> int:
    """A preset as a cluster file; parsed back before printing, so what is shown is what --cluster reads."""
    gpus = units.positive_int(args.gpus, "--gpus")
    bandwidth = None if args.bandwidth is None else units.positive(args.bandwidth, "--bandwidth")
    latency = None if args.latency is None else units.non_negative(args.latency, "--latency")
    raw = topologies.preset_cluster(args.show, gpus, bandwidth, latency, args.device)
    parse(raw, f"preset {args.show}").build(gpus)
    if args.json and write_json(raw, args.json):
        return 0
    print(f"# simpar cluster file: preset {args.show.strip().lower()} for {gpus} GPUs (schema: docs/clusters.md)")
    print("# use it with: simpar run --cluster FILE ...")
    print(dump(raw), end="")
    return 0
