"""Traces shipped inside the package, for the demo, tests and benchmarks.

Each file in ``pgmo/traces/`` is a compressed pgmo JSON trace whose metadata
says how it was made: ``synthetic: true`` for traces from
:mod:`pgmo.synth`, or the model, batch size and device for traces recorded
by pgmo's profiling mode on a GPU.
"""

from __future__ import annotations

from pathlib import Path

from .formats import read_trace
from .trace import Trace

__all__ = ["names", "path", "load", "TRACE_DIR"]

TRACE_DIR = Path(__file__).parent / "traces"
_SUFFIX = ".json.gz"


def names() -> list[str]:
    """Names of the bundled traces, sorted."""
    return sorted(p.name[: -len(_SUFFIX)] for p in TRACE_DIR.glob(f"*{_SUFFIX}"))


def path(name: str) -> Path:
    candidate = TRACE_DIR / f"{name}{_SUFFIX}"
    if not candidate.is_file():
        raise KeyError(f"no bundled trace {name!r}; available: {', '.join(names())}")
    return candidate


def load(name: str) -> Trace:
    """Read one bundled trace by name (see :func:`names`)."""
    return read_trace(path(name))
