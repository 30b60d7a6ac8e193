"""pgmo: profile-guided GPU memory pool for CuPy and Chainer.

The core (traces, formats, solvers, plans) is pure Python and imports no
CuPy.  Everything else is reachable from the package too, loaded on first
use: ``pgmo.ProfileGuidedMemoryPool``, ``pgmo.TraceRecorder`` and
``pgmo.testing`` import CuPy only when asked for, ``pgmo.chainer`` imports
Chainer, ``pgmo.chainermn`` ChainerMN and MPI.

``pgmo.bundled`` holds the traces shipped with pgmo (real ones recorded on a
GPU, synthetic ones generated): ``pgmo.bundled.names()`` lists them, and
``pgmo.read_trace``, ``pgmo.analyze`` and every ``pgmo`` command take their
names in place of a file.
"""

import importlib as _importlib
import typing as _typing

from .bundled import read_trace  # a file, or the name of a trace bundled with pgmo
from .errors import (DeviceError, NoGPUError, PgmoWarning, PlanError, PlanFileError,
                     TraceFormatError, UnknownTraceError)
from .formats import write_trace
from .plan import Plan, read_plan
from .solver import METHODS, SolverOptions, solve
from .trace import Block, Trace

__version__ = "0.2.0"

__all__ = [
    "Block", "Trace", "Plan", "PlanError", "PlanFileError", "TraceFormatError", "DeviceError",
    "NoGPUError", "UnknownTraceError", "METHODS", "SolverOptions", "read_trace",
    "write_trace", "read_plan", "solve",
    "ProfileGuidedMemoryPool", "PoolStats", "replay", "host_pool", "__version__",
    "analyze", "Analysis", "TraceRecorder", "PgmoWarning", "bundled",
]

#: Names loaded on first use: (module, attribute or None for the module itself).
_LAZY = {
    "ProfileGuidedMemoryPool": ("pgmo.pool", "ProfileGuidedMemoryPool"),
    "PoolStats": ("pgmo.stats", "PoolStats"),
    "replay": ("pgmo.testing", "replay"),
    "host_pool": ("pgmo.testing", "host_pool"),
    "testing": ("pgmo.testing", None),
    "pool": ("pgmo.pool", None),
    "chainer": ("pgmo.chainer", None),
    "chainermn": ("pgmo.chainermn", None),
    "synth": ("pgmo.synth", None),
    "workloads": ("pgmo.workloads", None),
    "formats": ("pgmo.formats", None),
    "engine": ("pgmo.engine", None),
    "analyze": ("pgmo.analysis", "analyze"),
    "Analysis": ("pgmo.analysis", "Analysis"),
    "TraceRecorder": ("pgmo.trace_recorder", "TraceRecorder"),
}


def __getattr__(name: str) -> _typing.Any:
    """Import the names that need CuPy or Chainer (and big modules) only when asked for."""
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = _importlib.import_module(module)
        if attr is not None:
            value = getattr(value, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pgmo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
