"""Every error pgmo raises on bad input, and its one warning, in one place.

Each input error is a ``ValueError`` (bad input, not a bug) whose message says
where the problem is: the file, line and field of a trace, the two colliding
blocks of a packing, or why a saved plan was refused.  :class:`DeviceError`
names a CUDA call that failed; :class:`NoGPUError` says that the pool has no
GPU to run on, and why.  :class:`PgmoWarning` tells the user of something
that costs memory or time and that they can fix.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TraceFormatError", "PlanError", "PlanFileError", "UnknownTraceError",
           "DeviceError", "NoGPUError", "PgmoWarning"]


class TraceFormatError(ValueError):
    """A trace or plan file is malformed; says which file, line and field."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None,
                 field: str | None = None):
        self.path, self.line, self.field, self.reason = path, line, field, message
        where = [path or "<trace>"]
        if line is not None:
            where.append(f"line {line}")
        if field:
            where.append(f"field '{field}'")
        super().__init__(f"{', '.join(where)}: {message}")


class PlanError(ValueError):
    """A packing is invalid; the message names the blocks involved."""

    def __init__(self, message: str, blocks: tuple[Any, ...] = ()):
        super().__init__(message)
        self.blocks = blocks


class PlanFileError(ValueError):
    """A saved plan is damaged or does not fit its profile; the message says why."""


class UnknownTraceError(KeyError):
    """No bundled trace has that name; the message names the closest ones.  A ``KeyError``,
    as a lookup by name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NoGPUError(RuntimeError):
    """:class:`~pgmo.ProfileGuidedMemoryPool` found no GPU it can use; the message says
    why (CuPy's own error: no driver, an old driver, no device) and that
    :func:`pgmo.testing.host_pool` runs the same pool on host memory.  The
    CUDA error it comes from, if any, is its ``__context__``."""


class DeviceError(RuntimeError):
    """A CUDA driver or runtime call failed for a reason other than a full device.

    ``call`` names the call (``"cuMemSetAccess"``), ``code`` is its result
    (``801``, CUDA_ERROR_NOT_SUPPORTED, say).  The pool's device layer
    answers it by falling back (a cudaMalloc arena, a cudaMalloc per
    request, a trim skipped) and says why in ``stats().device_reasons``; it
    reaches the user only where nothing can take the failed call's place.
    (A full device is a ``MemoryError``, CuPy's ``OutOfMemoryError`` at the
    request.)
    """

    def __init__(self, call: str, code: int, name: str = ""):
        self.call, self.code, self.name = call, int(code), name
        super().__init__(f"{call} failed: {name or 'error'} ({int(code)})")


class PgmoWarning(UserWarning):
    """Something that costs memory or time and that the user can fix (the pool optimizes
    nothing because no iteration is marked or found, say)."""
