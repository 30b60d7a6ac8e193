"""The allocation unit shared by the pool, its saved plans and the trace tools.

CuPy rounds every request up to a multiple of 512 bytes (its memory pool's
``ALLOCATION_UNIT_SIZE``); pgmo's pool does the same, so recorded traces and
saved plans hold rounded sizes.
"""

from __future__ import annotations

__all__ = ["ALIGNMENT", "MAX_DEVICE_BYTES", "round_size", "byte_unit", "format_bytes"]

ALIGNMENT = 512

#: 256 TiB: more memory than any device has (the largest GPUs hold a few hundred
#: GB); a saved plan that needs more was modified or damaged.
MAX_DEVICE_BYTES = 1 << 48


def round_size(size: int) -> int:
    """``size`` rounded up to the allocation unit (0 stays 0)."""
    return (size + ALIGNMENT - 1) & -ALIGNMENT


def byte_unit(nbytes: int) -> tuple[float, str]:
    """The largest binary unit that shows ``nbytes`` as at least 4: (scale, name)."""
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= 4 * scale:
            return float(scale), name
    return 1.0, "B"


def format_bytes(nbytes: int) -> str:
    """``nbytes`` for a person: ``"812 B"``, ``"3.25 MiB"``."""
    scale, unit = byte_unit(nbytes)
    return f"{nbytes:,} B" if unit == "B" else f"{nbytes / scale:,.2f} {unit}"
