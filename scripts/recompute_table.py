"""How recomputation and pgmo compose: a Markdown table from DenseNet-BC traces.

Reads the traces that ``python -m scripts.record_traces --densenet B`` writes (one
training iteration of ``examples/densenet.py``'s DenseNet-BC, recomputation
off and on, each recorded under CuPy's stock pool and under pgmo), plans each
one as ``pgmo analyze`` does, and prints one Markdown section: per trace the
lower bound (the most bytes live at once), the peak of the paper's best-fit
plan and of ``--method`` (default ``best``), and what the stock pool
reserved; then, per model and batch size, recomputation off and on side by
side, each saving against its own kind: the stock pool's measured
reservation against its measured reservation without recomputation, pgmo's
plan against its plan without recomputation.  A plan is not a measurement:
no cell compares one with the other, and every plan cell says "plan".  It needs no
GPU: run it where the traces are::

    python -m scripts.recompute_table traces/ -o recompute.md
    python -m scripts.recompute_table traces/densenet-*.json.gz --method bestfit

Traces of a CPU dry run (``"dry_run": true``) are stand-ins: their rows say
``n/a (CPU)`` instead of numbers.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130

import pgmo  # noqa: E402
from pgmo import SolverOptions  # noqa: E402

from .markdown import NA, mib, table  # noqa: E402

log = logging.getLogger("recompute_table")

POOL_LABEL = {"stock": "stock (CuPy)", "pgmo": "pgmo"}
TRACE_COLUMNS = ("model", "batch", "recompute", "recorded under", "requests",
                 "lower bound (MiB)", "best-fit plan (MiB)", "{method} plan (MiB)",
                 "stock pool reserved (MiB)")
COMPOSE_COLUMNS = ("model", "batch", "recompute", "stock pool: reserved, measured (MiB)",
                   "lower bound (MiB)", "pgmo: {method} plan, not measured (MiB)")


def find_traces(paths) -> list[Path]:
    """The DenseNet recompute traces among ``paths`` (files, or folders searched for .json.gz)."""
    found = []
    for path in map(Path, paths):
        candidates = sorted(path.glob("*.json.gz")) if path.is_dir() else [path]
        for candidate in candidates:
            metadata = pgmo.read_trace(candidate).metadata
            if "recompute" in metadata and metadata.get("pool") in POOL_LABEL:
                found.append(candidate)
            elif not path.is_dir():
                raise ValueError(f"{candidate}: not a trace of record_traces.py --densenet "
                                 "(its metadata has no 'recompute' and 'pool')")
    return found


def analyse(paths, method: str = "best", time_limit: float | None = None) -> list[dict]:
    """One entry per trace: its metadata and ``pgmo.analyze``'s numbers, in table order."""
    limit = SolverOptions().time_limit if time_limit is None else time_limit
    entries = []
    for path in paths:
        trace = pgmo.read_trace(path)
        result = pgmo.analyze(trace, method=method, time_limit=limit)
        entries.append({"path": Path(path), "metadata": dict(trace.metadata),
                        "lower_bound": result.lower_bound,
                        "bestfit": result.plans["bestfit"]["peak"],
                        "best": result.plans[method]["peak"],
                        "reserved": result.reserved, "requests": result.requests})
        log.info("%s: lower bound %d, bestfit %d, %s %d", Path(path).name, result.lower_bound,
                 entries[-1]["bestfit"], method, entries[-1]["best"])
    entries.sort(key=_order)
    return entries


def _order(entry) -> tuple:
    m = entry["metadata"]
    return (model_name(m), m.get("batch_size") or 0, bool(m.get("recompute")),
            list(POOL_LABEL).index(m["pool"]))


def model_name(metadata) -> str:
    depth, growth_rate = metadata.get("depth"), metadata.get("growth_rate")
    if depth is None or growth_rate is None:
        return str(metadata.get("model"))
    return f"DenseNet-BC-{depth} (k={growth_rate})"


def _change(value, base, prefix: str = "") -> str:
    """``value`` in MiB with its change against ``base`` (the same kind of figure), if any."""
    if value is None:
        return "-"
    if not base:
        return f"{prefix}{mib(value)}"
    return f"{prefix}{mib(value)} ({100 * (value - base) / base:+.1f} %)"


def trace_rows(entries) -> list[tuple]:
    rows = []
    for e in entries:
        m = e["metadata"]
        head = (model_name(m), m.get("batch_size"), "on" if m["recompute"] else "off",
                POOL_LABEL[m["pool"]])
        if m.get("dry_run"):
            rows.append(head + (NA,) * 5)
            continue
        reserved = mib(e["reserved"]) if m["pool"] == "stock" else "-"
        rows.append(head + (f"{e['requests']:,}", mib(e["lower_bound"]), mib(e["bestfit"]),
                            mib(e["best"]), reserved))
    return rows


def compose_rows(entries) -> list[tuple]:
    """Per model and batch: recomputation off and on, measured against measured, plan against plan.

    The stock pool's reservation (measured) changes against its reservation
    without recomputation; pgmo's plan against its plan without it.  The
    lower bound is the profile's (pgmo's trace when there is one).  A
    combination whose trace is missing reads ``-``.
    """
    groups: dict = {}
    for e in entries:
        m = e["metadata"]
        key = (model_name(m), m.get("batch_size"))
        groups.setdefault(key, {})[(bool(m["recompute"]), m["pool"])] = e
    rows = []
    for (model, batch), group in groups.items():
        dry = any(e["metadata"].get("dry_run") for e in group.values())
        stock_off, ours_off = group.get((False, "stock")), group.get((False, "pgmo"))
        for recompute in (False, True):
            stock, ours = group.get((recompute, "stock")), group.get((recompute, "pgmo"))
            head = (model, batch, "on" if recompute else "off")
            if dry:
                rows.append(head + (NA, NA, NA))
                continue
            profile = ours or stock
            rows.append(head + (
                "-" if stock is None else _change(
                    stock["reserved"], stock_off["reserved"] if recompute and stock_off
                    else None),
                "-" if profile is None else mib(profile["lower_bound"]),
                "-" if ours is None else _change(
                    ours["best"], ours_off["best"] if recompute and ours_off else None,
                    "plan ")))
    return rows


def _distinct(entries, key) -> str:
    values = []
    for e in entries:
        value = e["metadata"].get(key)
        if value is not None and value not in values:
            values.append(value)
    return "; ".join(f"`{v}`" if key == "command" else str(v) for v in values) or "unknown"


def section(entries, method: str = "best", time_limit: float | None = None,
            heading: str = "##") -> str:
    """The Markdown section: provenance, the per-trace table, the combinations."""
    limit = SolverOptions().time_limit if time_limit is None else time_limit
    out = [f"{heading} DenseNet-BC: recomputation and pgmo", ""]
    if not entries:
        return "\n".join(out + ["No DenseNet-BC trace found (record_traces.py --densenet B "
                                "writes them).", ""])
    if any(e["metadata"].get("dry_run") for e in entries):
        out += ["**CPU DRY RUN**: the traces are stand-ins (NumPy arrays, not GPU "
                f"requests); every number reads `{NA}`.", ""]
    recomputed = _distinct([e for e in entries if e["metadata"]["recompute"]], "recomputed")
    out += ["One training iteration of `examples/densenet.py`'s DenseNet-BC "
            "(MomentumSGD), recorded with recomputation off and on "
            f"(recomputed: {recomputed}), each under CuPy's stock pool (a fresh "
            "`cupy.cuda.MemoryPool`, recorded by `pgmo.TraceRecorder` in its second "
            "iteration; *reserved*: what it held) and under pgmo (its profiled iteration).  "
            "Weights and optimizer state live outside both.  Plans as `pgmo analyze` makes "
            f"them: sizes rounded up to 512 B, `{method}` with a time limit of {limit:g} s.",
            "",
            f"- traces: {', '.join(e['path'].name for e in entries)}",
            f"- recorded with: {_distinct(entries, 'command')}",
            f"- device: {_distinct(entries, 'device')}; versions: "
            + ", ".join(f"{k} {_distinct(entries, k)}" for k in
                        ("pgmo", "cupy", "chainer", "numpy", "python")),
            f"- date: {_distinct(entries, 'date')}",
            "", *table([c.format(method=method) for c in TRACE_COLUMNS], trace_rows(entries),
                       4),
            "",
            "Recomputation off and on side by side.  In brackets, each figure's change "
            "against the same kind of figure without recomputation: the stock pool's "
            "measured reservation against its measured reservation, pgmo's plan against "
            "its plan.  A plan is what pgmo would hold for that iteration, not a "
            "measurement of what it held (the GPU memory tables measure that): no cell "
            "compares a plan with a measurement.", "",
            *table([c.format(method=method) for c in COMPOSE_COLUMNS], compose_rows(entries),
                   3),
            ""]
    return "\n".join(out)


def parse_args(argv=None):
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", type=programs.existing_path(),
                        help="trace files, or folders holding them (other traces are skipped)")
    parser.add_argument("--method", default="best", choices=pgmo.METHODS,
                        help="the plan compared with best-fit")
    parser.add_argument("--time-limit", type=programs.non_negative_float,
                        default=SolverOptions().time_limit,
                        help="seconds per plan")
    parser.add_argument("--output", "-o", type=programs.output_file,
                        help="also write the section here")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    try:
        paths = find_traces(args.traces)
    except (OSError, ValueError) as error:
        raise programs.UsageError(str(error)) from error
    if not paths:  # a folder of other files: say so, not an empty report with status 0
        raise programs.UsageError(
            f"no DenseNet-BC trace in {', '.join(map(str, args.traces))} "
            "(python -m scripts.record_traces --densenet B writes them)")
    text = section(analyse(paths, args.method, args.time_limit), args.method, args.time_limit)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
        log.info("wrote %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(programs.run(main))
