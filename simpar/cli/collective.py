"""``simpar collective``: time one collective on a topology, nccl-tests style."""

from __future__ import annotations

from simpar import topologies, units
from simpar.cli.common import add_cluster_flags, add_json_flag, cluster_choice, write_json
from simpar.collective_run import CollectiveResult, simulate_collective
from simpar.collectives import OPS, normalize
from simpar.errors import SimparError

RANK_ROWS = 16  # more ranks than this are summarised; --json has them all
LINK_ROWS = 8


def register(sub) -> None:
    p = sub.add_parser(
        "collective", help="simulate one collective (all-reduce, all-gather, ...) on a topology",
        description="Simulate one collective on a topology and print time, algbw and busbw "
                    "(nccl-tests definitions), bytes per rank and per link.")
    algos = sorted({a for table in OPS.values() for a in table})
    p.add_argument("--op", default="allreduce", help=f"collective: {', '.join(OPS)} (default allreduce)")
    p.add_argument("--algo", default=None,
                   help=f"algorithm: {', '.join(algos)}; ps = Worker-Server (default ring; p2p: direct; "
                        "alltoall: pairwise)")
    p.add_argument("--gpus", help="number of ranks, one per GPU (default 8; all of a --cluster's)")
    p.add_argument("--bytes", default="1e9", help="message size S in bytes, e.g. 1e9 or 256MiB (default 1e9); "
                   "for all-gather the gathered size, for reduce-scatter the input size")
    p.add_argument("--topology", help="topology preset (see 'simpar topologies'; default ring)")
    add_cluster_flags(p)
    p.add_argument("--bandwidth", default=None, help="ring/star only: link bandwidth per direction, bytes/s")
    p.add_argument("--latency", default=None, help="ring/star only: latency per link hop, seconds")
    p.add_argument("--root", default="0", help="root rank of broadcast/reduce, sender of p2p (default 0)")
    p.add_argument("--peer", default="-1", help="receiver rank of p2p (default: the last rank)")
    p.add_argument("--sweep", action="store_true",
                   help="time every power-of-two size from --min-bytes up to --bytes")
    p.add_argument("--min-bytes", default="1KiB", help="smallest size of --sweep (default 1KiB)")
    add_json_flag(p)
    p.set_defaults(handler=run)


def _int(text: str, field: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise SimparError(f"{field}: expected a whole number, got {text!r}") from None


def sweep_sizes(smallest: int, largest: int) -> list[int]:
    if smallest > largest:
        raise SimparError(f"--min-bytes: {smallest} is larger than --bytes {largest}")
    sizes = []
    size = smallest
    while size < largest:
        sizes.append(size)
        size *= 2
    return sizes + [largest]


def run(args) -> int:
    op, algo = normalize(args.op, args.algo)
    topology_name, gpus = cluster_choice(args, "ring", 8)
    if gpus < 2:
        raise SimparError(f"--gpus: a collective needs at least 2 ranks, got {gpus}")
    nbytes = units.whole_bytes(args.bytes, "--bytes")
    bandwidth = None if args.bandwidth is None else units.positive(args.bandwidth, "--bandwidth")
    latency = None if args.latency is None else units.non_negative(args.latency, "--latency")
    root, peer = _int(args.root, "--root"), _int(args.peer, "--peer")
    topology = topologies.build(topology_name, gpus, bandwidth, latency, args.device)

    if args.sweep:
        smallest = units.whole_bytes(args.min_bytes, "--min-bytes")
        results = [simulate_collective(topology, op, algo, size, root, peer)
                   for size in sweep_sizes(smallest, nbytes)]
        sweep = {"op": op, "algo": algo, "topology": topology.name, "gpus": gpus,
                 "sweep": [{"bytes": r.bytes, "time_s": r.time_s, "algbw_Bps": r.algbw_Bps,
                            "busbw_Bps": r.busbw_Bps} for r in results]}
        if args.json and write_json(sweep, args.json):
            return 0
        print_sweep(results, topology.description)
        return 0

    result = simulate_collective(topology, op, algo, nbytes, root, peer)
    if args.json and write_json(result.to_json(), args.json):
        return 0
    print_result(result, topology.description)
    return 0


def print_sweep(results: list[CollectiveResult], description: str) -> None:
    first = results[0]
    print(f"# {first.op} ({first.algo}) over {first.gpus} ranks on {first.topology}: {description}")
    print(f"# {'size (B)':>14}{'time (us)':>14}{'algbw (GB/s)':>14}{'busbw (GB/s)':>14}")
    for r in results:
        print(f"  {r.bytes:>14,}{r.time_s * 1e6:>14.2f}{r.algbw_Bps / 1e9:>14.3f}{r.busbw_Bps / 1e9:>14.3f}")


def print_result(r: CollectiveResult, description: str) -> None:
    print(f"{r.op} ({r.algo}) of {r.bytes:,} B over {r.gpus} ranks on {r.topology}: {description}")
    print(f"  time   {units.human_time(r.time_s)}")
    print(f"  algbw  {units.human_rate(r.algbw_Bps)}   (S / time)")
    print(f"  busbw  {units.human_rate(r.busbw_Bps)}   (algbw x the op's nccl-tests factor)")
    pairs = {(row["bytes_sent"], row["bytes_received"]) for row in r.ranks}
    if len(pairs) == 1:
        sent, received = pairs.pop()
        print(f"Bytes per rank: every rank sent {sent:,} B and received {received:,} B")
    else:
        print("Bytes per rank:")
        print(f"  {'rank':>6}{'sent (B)':>18}{'received (B)':>18}")
        for row in r.ranks[:RANK_ROWS]:
            print(f"  {row['rank']:>6}{row['bytes_sent']:>18,}{row['bytes_received']:>18,}")
        if len(r.ranks) > RANK_ROWS:
            print(f"  ... {len(r.ranks) - RANK_ROWS} more ranks (see --json)")
    if r.server is not None:
        print(f"Server: sent {r.server['bytes_sent']:,} B, received {r.server['bytes_received']:,} B")
    print(f"Busiest links ({min(LINK_ROWS, len(r.links))} of {len(r.links)} carrying traffic, per direction):")
    for link in r.links[:LINK_ROWS]:
        print(f"  {link['name']:<34}{link['kind']:<8}{link['bytes']:>18,} B")
