"""The ``pgmo`` command: solve, check, plot and analyze traces; run the demo.

Every command that takes a trace reads every format pgmo knows (see
:mod:`pgmo.formats`), recognised by content.  The solver flags come from
:class:`~pgmo.solver.options.SolverOptions`, so they and their defaults are
the API's.  Errors are one line on stderr and a non-zero exit (2 for bad
input, 1 for a plan that fails ``check``), Ctrl-C one line and 130; no
tracebacks unless ``PGMO_DEBUG=1`` (:mod:`pgmo.programs`, as every pgmo
program).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import textwrap
from pathlib import Path
from typing import Sequence

from . import __version__, bundled, programs
from .demo import DEFAULT_TRACE, DEMO_TIME_LIMIT, info_lines
from .errors import TraceFormatError
from .formats import FORMATS, ReadOptions, load
from .plan import Plan
from .solver import solve
from .solver import options as solver_options
from .trace import Trace
from .units import ALIGNMENT, bytes_text
from .validate import find_conflict

log = logging.getLogger("pgmo")


class CliError(programs.UsageError):
    """A user-facing problem: printed as one line, exit status 2."""


def _stream(text: str) -> str:
    """A stream as the log writes it; each reader reads it its own way (RMM: hexadecimal)."""
    return text.strip()


def _add_input_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=sorted(FORMATS), default=None,
                   help="trace format (default: recognised from the file's content)")
    p.add_argument("--inclusive", action="store_true",
                   help="lifetimes include 'upper' (IREE files); converted to half-open")
    p.add_argument("--device", type=int, default=None, metavar="N",
                   help="device of a multi-device log (default: the one with the most events)")
    p.add_argument("--stream", type=_stream, default=None, metavar="S",
                   help="read one stream of a log (default: all streams of the device)")


def _read_options(args) -> ReadOptions:
    return ReadOptions(inclusive=args.inclusive, device=getattr(args, "device", None),
                       stream=getattr(args, "stream", None))


def _add_progress_option(p: argparse.ArgumentParser, what: str = "long solves") -> None:
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help=f"progress bar on {what} (default: when stderr is a terminal)")


def _read(path: str, args) -> tuple[Trace, list[int] | None]:
    loaded = load(_trace_file(path), args.format, _read_options(args))
    return loaded.trace, loaded.offsets


def _trace_file(text: str) -> str:
    """A file, or the name of a bundled trace (``pgmo traces`` lists them)."""
    found = bundled.resolve(text)
    if not os.path.exists(found):
        close = programs.candidates(os.path.basename(text), bundled.names())
        hint = ("; did you mean the bundled trace " + " or ".join(map(repr, close)) + "?"
                if close else "")
        raise TraceFormatError("no such file, and no bundled trace of that name"
                               f"{hint} (`pgmo traces` lists them)", path=text)
    return found


def _bundled_name(text: str) -> str:
    """An argparse ``type``: the name of a bundled trace (the closest one suggested)."""
    if text not in bundled.names():
        raise argparse.ArgumentTypeError(
            str(programs.unknown_name("bundled trace", text, bundled.names(), "`pgmo traces`")))
    return text


def _options(args) -> solver_options.SolverOptions:
    progress = sys.stderr.isatty() if getattr(args, "progress", None) is None else args.progress
    return solver_options.from_arguments(args, progress=progress)


def _report(plan: Plan, verbose: bool, out=None) -> None:
    out = out or sys.stdout
    status = "optimal" if plan.optimal else "feasible"
    print(f"n           {len(plan.trace)}", file=out)
    print(f"lower bound {bytes_text(plan.lower_bound)}", file=out)
    print(f"peak        {bytes_text(plan.peak)}  ({status})", file=out)
    print(f"peak/LB     {plan.ratio:.4f}", file=out)
    print(f"time        {plan.seconds:.3f} s  ({plan.method})", file=out)
    if verbose:
        for line in info_lines(plan):
            print(line, file=out)


def cmd_solve(args) -> int:
    trace, _ = _read(args.file, args)
    plan = solve(trace, _options(args))
    _report(plan, args.verbose)
    if args.output:
        plan.write(args.output)
        print(f"wrote       {args.output}")
    return 0


def _same_blocks(trace: Trace, plan_trace: Trace) -> str | None:
    if len(trace) != len(plan_trace):
        return (f"the plan has {_count(len(plan_trace), 'block')}, the trace "
                f"{_count(len(trace), 'block')}")
    for a, b in zip(trace.blocks, plan_trace.blocks):
        if a != b:
            return f"block id={a.id} differs: trace has {a}, plan has {b}"
    return None


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _plan_for(trace: Trace, args) -> tuple[Trace, list[int]]:
    """Read ``args.plan``: it places the trace's closed blocks (a pool's saved plan) or all
    of them, open ones live to the end (what ``pgmo solve -o`` writes)."""
    plan_trace, offsets = _read(args.plan, args)
    if offsets is None:
        raise CliError(f"{args.plan}: no offsets: not a plan")
    placed = plan_trace.without_open()
    candidates = (trace.without_open(), trace.closed())
    for planned in candidates:
        if _same_blocks(planned, placed) is None:
            return planned, offsets
    nearest = next((c for c in candidates if len(c) == len(placed)), candidates[0])
    raise CliError(f"{args.plan} does not belong to {args.file}: "
                   f"{_same_blocks(nearest, placed)}")


def cmd_check(args) -> int:
    trace, _ = _read(args.file, args)
    planned, offsets = _plan_for(trace, args)
    why = find_conflict(planned.blocks, offsets)
    if why is not None:
        print(f"pgmo: invalid plan {args.plan}: {why}", file=sys.stderr)
        return 1
    plan = Plan(planned, tuple(offsets), method="file")
    print(f"valid: {len(planned)} blocks, peak {bytes_text(plan.peak)}, lower bound "
          f"{bytes_text(plan.lower_bound)}, peak/LB {plan.ratio:.4f}")
    return 0


def cmd_plot(args) -> int:
    from .measure.plot import plot_plan

    trace, _ = _read(args.file, args)
    if args.plan:
        planned, offsets = _plan_for(trace, args)
        why = find_conflict(planned.blocks, offsets)
        if why is not None:
            raise CliError(f"invalid plan {args.plan}: {why}")
        plan = Plan(planned, tuple(offsets), method=f"plan {Path(args.plan).name}")
    else:
        plan = solve(trace, _options(args))
    out = plot_plan(plan, args.output)
    print(f"wrote {out} ({plan.method}, peak/LB {plan.ratio:.4f})")
    return 0


def cmd_analyze(args) -> int:
    from .measure.analysis import analyze

    _trace_file(args.file)  # a file, or a bundled trace: analyze reads either by its name
    result = analyze(args.file, format=args.format, device=args.device, stream=args.stream,
                     inclusive=args.inclusive, reserved=args.reserved,
                     granularity=args.granularity, options=_options(args))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.format_table())
    if args.plot:
        said = sys.stderr if args.json else sys.stdout  # --json keeps stdout pure JSON
        if result.plan is None:
            print("pgmo: no picture: the trace has no requests to plan", file=said)
        else:
            from .measure.plot import plot_plan

            out = plot_plan(result.plan, args.plot)
            print(f"wrote {out} ({result.plan.method} plan)", file=said)
    return 0


def cmd_traces(args) -> int:
    from .demo import list_traces

    return list_traces(verbose=args.verbose)


def cmd_cache(args) -> int:
    from . import plan_cache

    if args.clear and args.action == "list":
        raise CliError("cache: 'list' and --clear contradict each other: give one")
    folder = plan_cache.cache_dir()
    if folder.exists() and not folder.is_dir():
        came = f" (${plan_cache.ENV})" if os.environ.get(plan_cache.ENV) else ""
        raise CliError(f"{folder}{came} is not a folder: the plan cache must be one")
    if args.clear or args.action == "clear":
        removed = plan_cache.clear(folder)
        print(f"removed {removed} cached plan{'s' if removed != 1 else ''} from {folder}")
        return 0
    found = plan_cache.entries(folder)
    if not found:
        print(f"no cached plans in {folder}")
        return 0
    print(f"{len(found)} cached plan{'s' if len(found) != 1 else ''} in {folder} "
          f"(newest first):")
    for e in found:
        if e.error:
            print(f"  {e.path.name}: unusable ({e.error})")
            continue
        first = ", ".join(bytes_text(s) for s in e.first_sizes[:3])
        more = ", ..." if len(e.first_sizes) > 3 else ""
        print(f"  {e.device}; first requests {first}{more}; peak {bytes_text(e.peak)}; "
              f"{e.warmup_plans} warm-up plan{'s' if e.warmup_plans != 1 else ''}; "
              f"{bytes_text(e.bytes)} on disk; {_age(e.age)} old")
    return 0


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f} {unit}"
    return f"{seconds:.0f} s"


def cmd_demo(args) -> int:
    from .demo import run_demo

    progress = sys.stderr.isatty() if args.progress is None else args.progress
    return run_demo(trace_name=args.trace, output=args.output, time_limit=args.time_limit,
                    list_only=args.list, progress=progress, verbose=args.verbose,
                    budget=args.budget)


def _paragraph(text: str) -> str:
    return textwrap.fill(text, 79)


def build_parser() -> argparse.ArgumentParser:
    parser = programs.ArgumentParser(
        prog="pgmo", description="Profile-guided memory optimization: plan GPU memory offline.",
        epilog="Bundled traces: `pgmo traces` lists them, real (recorded on a GPU) and "
               "synthetic; every command takes a bundled trace's name in place of a file, "
               "e.g. `pgmo solve h100-alexnet-train-b32`.")
    parser.add_argument("--version", action="version", version=f"pgmo {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log what the solvers do and print their report")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # -v works after the command too ("pgmo solve trace.csv -v").
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="log what the solvers do and print their report (search "
                              "steps, restarts, proven bound, gap)")
    trace_help = ("trace: MiniMalloc CSV, pgmo JSON, a pool's saved plan, a PyTorch memory "
                  "snapshot or an RMM log (format recognised from the content), or the name "
                  "of a bundled trace (see `pgmo traces`)")

    p = sub.add_parser("solve", parents=[verbose],
                       help="pack a trace and print the plan against the lower bound")
    p.add_argument("file", help=trace_help)
    solver_options.add_arguments(p)
    _add_input_options(p)
    p.add_argument("-o", "--output", type=programs.output_file,
                   help="write id,lower,upper,size,offset CSV (or .json)")
    _add_progress_option(p)
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser("check", help="verify that a plan is a valid packing of a trace",
                       description=_paragraph(
                           "Verify that a plan is a valid packing of a trace: no two blocks "
                           "live at once share a byte.  Exit status 0: valid; 1: invalid, "
                           "with the first collision."))
    p.add_argument("file", help=trace_help)
    p.add_argument("plan", help="a plan: a trace with an offset column, or a saved pool plan")
    _add_input_options(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("plot", parents=[verbose],
                       help="draw blocks over time x address, like the paper's Figure 1")
    p.add_argument("file", help=trace_help)
    p.add_argument("--plan", help="plan to draw (default: solve with the solver options)")
    p.add_argument("-o", "--output", required=True, type=programs.picture_file,
                   help="picture to write, e.g. plan.png")
    solver_options.add_arguments(p)
    _add_input_options(p)
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("analyze", parents=[verbose],
                       help="will pgmo save me memory? plan a recorded trace and "
                            "compare with what its allocator reserved")
    p.add_argument("file", help=trace_help)
    p.add_argument("--reserved", default=None, metavar="BYTES|FILE",
                   help="what the recording allocator reserved, for a file that does not say "
                        "(an RMM log): bytes ('8GiB' too), or a log of the memory under a pool "
                        "(e.g. an RMM log of the pool's upstream); refused for a file that "
                        "records its own (a PyTorch snapshot)")
    p.add_argument("--granularity", type=programs.byte_count, default=ALIGNMENT, metavar="B",
                   help=f"round each size up to a multiple of B bytes (default: {ALIGNMENT}, "
                        f"as pgmo's pool does; 1: as requested)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--plot", metavar="FILE", default=None, type=programs.picture_file,
                   help="draw the plan (time x address), e.g. plan.png")
    _add_progress_option(p)
    solver_options.add_arguments(p)
    _add_input_options(p)
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("traces",
                       help="list the bundled traces: real (recorded on a GPU) or synthetic, "
                            "and where each comes from")
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="also each trace's file, checksum and recorded metadata")
    p.set_defaults(func=cmd_traces)

    p = sub.add_parser("cache", help="list or clear the plans pools keep between runs",
                       description=_paragraph(
                           "List the plans that pools kept in the plan cache (each: its "
                           "device, its first requests, its peak, its size and age), or "
                           "clear them.  The cache is $PGMO_CACHE_DIR, else the platform's "
                           "cache folder followed by pgmo/plans; a pool made with "
                           "plan_cache=False neither reads nor writes it."))
    p.add_argument("action", nargs="?", choices=("list", "clear"), default=None,
                   help="list the entries (default) or clear them")
    p.add_argument("--clear", action="store_true", help="remove every entry (as `clear`)")
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("demo",
                       help="solve a bundled trace, compare with the paper's method, "
                            "draw it, and replay it through the pool",
                       description=_paragraph(
                           "The whole pipeline on a bundled trace, on any machine: solve it "
                           "with the paper's best-fit and with pgmo's 'best', print both "
                           "against the lower bound, draw the plan, and replay the trace "
                           "through the pool on host memory, checking every byte.  No GPU "
                           "needed; the default trace takes about 10 s and 2.4 GB of "
                           "memory."))
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="also print what each solver's search did and the pool's memory "
                        "summary after the replay (with --list: each trace's details)")
    _add_progress_option(p, "the solves and the replay")
    p.add_argument("--trace", default=None, type=_bundled_name, metavar="NAME",
                   help=f"bundled trace to use (--list lists them; default: {DEFAULT_TRACE})")
    p.add_argument("--list", action="store_true",
                   help="list the bundled traces (as `pgmo traces`)")
    p.add_argument("-o", "--output", default="pgmo-demo.png", type=programs.picture_file,
                   help="picture to write")
    p.add_argument("--time-limit", type=solver_options.argument_type("time_limit"),
                   default=DEMO_TIME_LIMIT, metavar="S",
                   help=f"seconds for the 'best' method ('none': no limit; 'best' then "
                        f"needs a budget) (default: {DEMO_TIME_LIMIT:g})")
    p.add_argument("--budget", type=solver_options.argument_type("budget"), default=None,
                   metavar="N", help="search steps for the 'best' method: the same plan on "
                                     "every machine (default: none, only the time limit)")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``pgmo`` command; returns its exit status."""
    return programs.run(lambda: _main(argv), name="pgmo",
                        errors=(ValueError, OSError, ImportError, KeyError))


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    try:
        return args.func(args)
    except RecursionError as exc:  # a reader that let one through: still one line
        raise CliError("input nested too deeply (more levels than Python's recursion "
                       "limit)") from exc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
