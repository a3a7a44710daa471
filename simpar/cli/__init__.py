"""The ``simpar`` command: one sub-command per module, every user error a single line + exit 2."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from simpar.errors import SimparError, Terminated


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag raises SimparError so it prints as one line, never a usage dump."""

    def error(self, message: str):
        raise SimparError(f"{message} (see '{self.prog} --help')")


def add_json_flag(parser: argparse.ArgumentParser, what: str = "the result") -> None:
    parser.add_argument("--json", metavar="PATH|-", help=f"write {what} as JSON ('-': stdout, nothing else)")


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", metavar="PATH",
                        help="a cluster file (YAML or JSON, docs/clusters.md) instead of --topology; 'simpar "
                             "topologies --show NAME' prints a preset as one to start from")
    parser.add_argument("--device", help="swap the topology's GPU for this preset (see 'simpar devices'), e.g. h200")


def cluster_choice(args, default_topology: str, default_gpus: int) -> tuple[str, int]:
    """(preset name or cluster file, GPUs) from --topology, --cluster and --gpus; with a cluster file
    --gpus defaults to all of its GPUs."""
    from simpar import units
    from simpar.topologies.cluster_file import is_cluster_file, load

    cluster = getattr(args, "cluster", None)
    if cluster is not None and getattr(args, "topology", None) is not None:
        raise SimparError("--cluster: a cluster file is the whole topology; leave --topology out")
    if cluster is not None:
        gpus = load(cluster).gpus if args.gpus is None else units.positive_int(args.gpus, "--gpus")
        return cluster, gpus
    topology = (args.topology or default_topology).strip()
    return topology if is_cluster_file(topology) else topology.lower(), \
        units.positive_int(default_gpus if args.gpus is None else args.gpus, "--gpus")


def write_json(data, destination: str) -> bool:
    """``-`` prints to stdout; anything else is a file path. Returns True when the JSON went to
    stdout, i.e. the command should print nothing more."""
    text = json.dumps(data, indent=2)
    if destination == "-":
        print(text)
        return True
    try:
        with open(destination, "w") as handle:
            handle.write(text + "\n")
    except OSError as exc:
        raise SimparError(f"--json: cannot write {destination!r}: {exc.strerror}") from None
    return False


def build_parser() -> argparse.ArgumentParser:
    from simpar.cli import calibrate, catalog, collective, lessons, models, plot, run, search, validate

    from simpar import __version__

    parser = _Parser(prog="simpar", description="Simulate, run for real and teach distributed training.")
    parser.add_argument("--version", action="version", version=f"simpar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run.register(sub)
    collective.register(sub)
    catalog.register(sub)
    models.register(sub)
    calibrate.register(sub)
    validate.register(sub)
    plot.register(sub)
    search.register(sub)
    lessons.register(sub)
    return parser


_HANDLER_PID: list[int] = []  # the process that installed _terminate


def _terminate(signum, frame):
    if _HANDLER_PID and os.getpid() != _HANDLER_PID[-1]:
        # a forked helper (search's worker pool) inherited the handler: die as the signal says, quietly
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Terminated(signum)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # SIGTERM and SIGHUP unwind like Ctrl-C, so real runs stop their ranks on the way out
    signals = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    in_main = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = {sig: signal.signal(sig, _terminate) for sig in signals} if in_main else {}
    _HANDLER_PID.append(os.getpid())
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        return args.handler(args) or 0
    except SimparError as exc:
        print(f"simpar: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("simpar: interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"simpar: terminated by {signal.Signals(exc.signum).name} (rank processes, if any, stopped)",
              file=sys.stderr)
        return 128 + exc.signum
    finally:
        _HANDLER_PID.pop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
