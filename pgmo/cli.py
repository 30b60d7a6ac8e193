"""The ``pgmo`` command: solve, check and plot traces; run the demo.

Errors are one line on stderr and a non-zero exit (2 for bad input, 1 for a
plan that fails ``check``); no tracebacks unless ``PGMO_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from . import __version__
from .io import TraceFormatError, read_trace, read_trace_and_offsets
from .plan import Plan
from .solver import METHODS, solve
from .trace import Trace
from .validate import PlanError, find_conflict

log = logging.getLogger("pgmo")


class CliError(Exception):
    """A user-facing problem: printed as one line, exit status 2."""


def _add_solver_options(p: argparse.ArgumentParser, default_method: str = "best") -> None:
    p.add_argument("--method", choices=METHODS, default=default_method,
                   help=f"packing method (default: {default_method})")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="seconds for 'best' and 'exact' (default: 10)")
    p.add_argument("--inclusive", action="store_true",
                   help="lifetimes include 'upper' (IREE files); converted to half-open")


def _progress_default() -> bool:
    return sys.stderr.isatty()


def _report(plan: Plan, out=None) -> None:
    out = out or sys.stdout
    status = "optimal" if plan.optimal else "feasible"
    print(f"n           {len(plan.trace)}", file=out)
    print(f"lower bound {plan.lower_bound}", file=out)
    print(f"peak        {plan.peak}  ({status})", file=out)
    print(f"peak/LB     {plan.ratio:.4f}", file=out)
    print(f"time        {plan.seconds:.3f} s  ({plan.method})", file=out)


def cmd_solve(args) -> int:
    trace = read_trace(args.file, inclusive=args.inclusive)
    plan = solve(trace, method=args.method, time_limit=args.time_limit,
                 progress=_progress_default() if args.progress is None else args.progress)
    _report(plan)
    if args.output:
        plan.write(args.output)
        print(f"wrote       {args.output}")
    return 0


def _same_blocks(trace: Trace, plan_trace: Trace) -> str | None:
    if len(trace) != len(plan_trace):
        return f"the plan has {len(plan_trace)} blocks, the trace {len(trace)}"
    for a, b in zip(trace.blocks, plan_trace.blocks):
        if a != b:
            return f"block id={a.id} differs: trace has {a}, plan has {b}"
    return None


def cmd_check(args) -> int:
    trace = read_trace(args.file, inclusive=args.inclusive)
    plan_trace, offsets = read_trace_and_offsets(args.plan, inclusive=args.inclusive)
    if offsets is None:
        raise CliError(f"{args.plan}: no 'offset' column: not a plan")
    mismatch = _same_blocks(trace, plan_trace)
    if mismatch:
        raise CliError(f"{args.plan} does not belong to {args.file}: {mismatch}")
    why = find_conflict(trace.blocks, offsets)
    if why is not None:
        print(f"pgmo: invalid plan {args.plan}: {why}", file=sys.stderr)
        return 1
    plan = Plan(trace, tuple(offsets), method="file")
    print(f"valid: {len(trace)} blocks, peak {plan.peak}, lower bound {plan.lower_bound}, "
          f"peak/LB {plan.ratio:.4f}")
    return 0


def cmd_plot(args) -> int:
    from .plot import plot_plan

    trace = read_trace(args.file, inclusive=args.inclusive)
    if args.plan:
        plan_trace, offsets = read_trace_and_offsets(args.plan, inclusive=args.inclusive)
        mismatch = _same_blocks(trace, plan_trace) if offsets is not None else "no offset column"
        if mismatch:
            raise CliError(f"{args.plan}: cannot plot with {args.file}: {mismatch}")
        plan = Plan(trace, tuple(offsets), method=f"plan {Path(args.plan).name}").validate()
    else:
        plan = solve(trace, method=args.method, time_limit=args.time_limit,
                     progress=_progress_default())
    out = plot_plan(plan, args.output)
    print(f"wrote {out} ({plan.method}, peak/LB {plan.ratio:.4f})")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(trace_name=args.trace, output=args.output, time_limit=args.time_limit,
                    list_only=args.list)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgmo", description="Profile-guided memory optimization: plan GPU memory offline.")
    parser.add_argument("--version", action="version", version=f"pgmo {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the solvers do")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("solve", help="pack a trace and print the plan against the lower bound")
    p.add_argument("file", help="trace: MiniMalloc CSV (id,lower,upper,size) or pgmo JSON")
    _add_solver_options(p)
    p.add_argument("-o", "--output", help="write id,lower,upper,size,offset CSV (or .json)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: when stderr is a terminal)")
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser("check", help="verify that a plan is a valid packing of a trace")
    p.add_argument("file", help="the trace")
    p.add_argument("plan", help="CSV or JSON with an offset column")
    p.add_argument("--inclusive", action="store_true", help="lifetimes include 'upper'")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("plot", help="draw blocks over time x address, like the paper's Figure 1")
    p.add_argument("file", help="the trace")
    p.add_argument("--plan", help="plan CSV to draw (default: solve with --method)")
    p.add_argument("-o", "--output", required=True, help="picture to write, e.g. plan.png")
    _add_solver_options(p, default_method="bestfit")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("demo", help="solve a bundled trace, compare with the paper's method, "
                                    "draw it, and replay it through the pool")
    p.add_argument("--trace", default=None, help="bundled trace name (see --list)")
    p.add_argument("--list", action="store_true", help="list the bundled traces")
    p.add_argument("-o", "--output", default="pgmo-demo.png", help="picture to write")
    p.add_argument("--time-limit", type=float, default=5.0, metavar="S",
                   help="seconds for the 'best' method (default: 5)")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    try:
        return args.func(args)
    except (TraceFormatError, PlanError, CliError, ValueError, OSError, ImportError,
            KeyError) as exc:
        if os.environ.get("PGMO_DEBUG"):
            raise
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"pgmo: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pgmo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
