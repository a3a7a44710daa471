"""``simpar plot``: draw a saved run (``simpar run --json``) to an image."""

from __future__ import annotations

import json

from simpar.errors import SimparError


def register(sub) -> None:
    from simpar.plots import PANELS

    p = sub.add_parser("plot", help="draw a saved run: timeline, memory, traffic per link, sim vs real",
                       description="Draw what a 'simpar run --json FILE' result holds: the per-rank timeline "
                                   "(needs --op-timeline), memory per rank by category, memory over the step "
                                   "(needs --memory-timeline), traffic per link, and with --compare-real "
                                   "simulated vs measured.")
    p.add_argument("result", help="a JSON file written by 'simpar run --json'")
    p.add_argument("--out", default="simpar-run.png", help="image to write (default simpar-run.png; the "
                                                           "suffix picks the format: png, svg, pdf)")
    p.add_argument("--panels", help=f"comma-separated, from {', '.join(PANELS)} (default: all the file has "
                                    "data for)")
    p.set_defaults(handler=run)


def run(args) -> int:
    from simpar.plots import PANELS, save_figure

    try:
        with open(args.result) as handle:
            result = json.load(handle)
    except OSError as exc:
        raise SimparError(f"result: cannot read {args.result!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SimparError(f"result: {args.result} is not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(result, dict) or not isinstance(result.get("sim"), dict):
        raise SimparError(f"result: {args.result} is not 'simpar run --json' output (no 'sim' part)")
    panels = None
    if args.panels:
        panels = [p.strip().lower() for p in args.panels.split(",") if p.strip()]
        unknown = [p for p in panels if p not in PANELS]
        if unknown:
            raise SimparError(f"--panels: unknown {', '.join(unknown)}; choose from {', '.join(PANELS)}")
    save_figure(result, args.out, panels)
    print(f"figure: {args.out}")
    return 0
