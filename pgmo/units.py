"""The allocation unit shared by the pool, its saved plans and the trace tools.

CuPy rounds every request up to a multiple of 512 bytes (its memory pool's
``ALLOCATION_UNIT_SIZE``); pgmo's pool does the same, so recorded traces and
saved plans hold rounded sizes.
"""

from __future__ import annotations

__all__ = ["ALIGNMENT", "round_size"]

ALIGNMENT = 512


def round_size(size: int) -> int:
    """``size`` rounded up to the allocation unit (0 stays 0)."""
    return (size + ALIGNMENT - 1) & -ALIGNMENT
