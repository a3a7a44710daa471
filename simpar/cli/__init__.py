"""The ``simpar`` command: one sub-command per module, every user error a single line + exit 2."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from simpar.errors import SimparError, Terminated


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag raises SimparError so it prints as one line, never a usage dump."""

    def error(self, message: str):
        raise SimparError(f"{message} (see '{self.prog} --help')")


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
