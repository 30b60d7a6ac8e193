"""Every error pgmo raises on bad input, in one place.

Each one is a ``ValueError`` (bad input, not a bug) whose message says where
the problem is: the file, line and field of a trace, the two colliding blocks
of a packing, or why a saved plan was refused.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TraceFormatError", "PlanError", "PlanFileError"]


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
