"""``pgmo demo``: the whole pipeline on a bundled trace, on any machine.

Solves the trace with the paper's best-fit and with pgmo's default method,
prints both against the lower bound and against no reuse at all, draws the
plan, and (when CuPy is installed) replays the trace through the pool on
host memory, checking every byte.
"""

from __future__ import annotations

import logging

from . import bundled
from .solver import solve

log = logging.getLogger(__name__)

DEFAULT_TRACE = "synthetic-resnet50-train-b32"


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


def _list() -> int:
    print(f"{'name':42} {'blocks':>7} {'lower bound':>14}  origin")
    for name in bundled.names():
        trace = bundled.load(name)
        origin = "synthetic (pgmo.synth)" if trace.metadata.get("synthetic") else \
            f"recorded on {trace.metadata.get('device', 'a GPU')}"
        print(f"{name:42} {len(trace):7d} {_mib(trace.lower_bound()):>14}  {origin}")
        for problem in bundled.provenance_problems(trace.metadata):
            print(f"{'':42}   provenance: {problem}")
    return 0


#: Seconds for 'best' in the demo: short, as the demo is a first look.
DEMO_TIME_LIMIT = 5.0


def _replay_on_host(trace, time_limit: float) -> None:
    try:
        from .testing import host_pool, replay
    except ImportError as exc:
        print(f"\npool replay skipped: {exc} (install pgmo[cuda13] or pgmo[cuda12])")
        return
    pool = host_pool(method="best", time_limit=time_limit)
    result = replay([trace] * 4, pool)
    stats = result["stats"]
    print("\npool replay on host memory (4 iterations: warm-up, profile, 2 optimized):")
    print(f"  corrupted blocks   {result['corrupted']}")
    for key in ("mode", "arena_bytes", "planned_peak", "lower_bound", "peak_used_bytes",
                "fallback_requests", "reoptimizations"):
        print(f"  {key:18} {getattr(stats, key)}")


def run_demo(trace_name: str | None = None, output: str = "pgmo-demo.png",
             time_limit: float = DEMO_TIME_LIMIT, list_only: bool = False) -> int:
    if list_only:
        return _list()
    name = trace_name or DEFAULT_TRACE
    trace = bundled.load(name)
    label = "synthetic, made by pgmo.synth" if trace.metadata.get("synthetic") else "recorded"
    print(f"trace {name} ({label}): {len(trace)} blocks, "
          f"lower bound {trace.lower_bound():,} B ({_mib(trace.lower_bound())})\n")
    print(f"| {'method':12} | {'peak':>16} | {'peak/LB':>8} | {'time':>8} |")
    print(f"|{'-' * 14}|{'-' * 18}|{'-' * 10}|{'-' * 10}|")
    print(f"| {'no reuse':12} | {trace.total_bytes:16,} | "
          f"{trace.total_bytes / trace.lower_bound():8.3f} | {'':>8} |")
    plans = {}
    for method in ("bestfit", "best"):
        plan = solve(trace, method=method, time_limit=time_limit)
        plans[method] = plan
        print(f"| {method:12} | {plan.peak:16,} | {plan.ratio:8.4f} | {plan.seconds:7.3f}s |")
    try:
        from .plot import plot_plan

        plot_plan(plans["best"], output, title=f"{name}: best, peak/LB = "
                                                 f"{plans['best'].ratio:.4f}")
        print(f"\nwrote {output}")
    except ImportError as exc:
        print(f"\npicture skipped: {exc}")
    _replay_on_host(trace, time_limit)
    return 0
