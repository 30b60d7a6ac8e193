"""pgmo: profile-guided GPU memory pool for CuPy and Chainer.

The core (traces, solvers, plans) is pure Python and imports no CuPy; the
pool and testing helpers are loaded on first use so that ``import pgmo`` works
on machines without CuPy.
"""

from __future__ import annotations

from .io import TraceFormatError, read_trace, write_trace
from .plan import Plan, read_plan
from .solver import METHODS, solve
from .trace import Block, Trace
from .validate import PlanError

__version__ = "0.1.0"

__all__ = [
    "Block", "Trace", "Plan", "PlanError", "TraceFormatError", "METHODS",
    "read_trace", "write_trace", "read_plan", "solve",
    "ProfileGuidedMemoryPool", "replay", "__version__",
]

_LAZY = {
    "ProfileGuidedMemoryPool": ("pgmo.pool", "ProfileGuidedMemoryPool"),
    "replay": ("pgmo.testing", "replay"),
}


def __getattr__(name: str):
    """Import CuPy-backed names only when asked for."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pgmo' has no attribute {name!r}")
