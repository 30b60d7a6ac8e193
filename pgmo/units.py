"""Sizes: the allocation unit of the pool, its plans and the trace tools; bytes in reports.

Every report writes bytes through :func:`bytes_text` (exact, then in a unit)
or :func:`format_bytes` (the unit alone), so that one quantity reads the same
in ``pgmo solve``, ``check``, ``analyze``, the demo and the plots.

CuPy rounds every request up to a multiple of 512 bytes (its memory pool's
``ALLOCATION_UNIT_SIZE``); pgmo's pool does the same, so recorded traces and
saved plans hold rounded sizes.
"""

from __future__ import annotations

__all__ = ["ALIGNMENT", "MAX_DEVICE_BYTES", "round_size", "byte_unit", "format_bytes",
           "bytes_text"]

ALIGNMENT = 512

#: 256 TiB: more memory than any device has (the largest GPUs hold a few hundred
#: GB); a saved plan that needs more was modified or damaged.
MAX_DEVICE_BYTES = 1 << 48


def round_size(size: int) -> int:
    """``size`` rounded up to the allocation unit (0 stays 0)."""
    return (size + ALIGNMENT - 1) & -ALIGNMENT


def byte_unit(nbytes: int) -> tuple[float, str]:
    """The largest binary unit that shows ``nbytes`` as at least 4: (scale, name) (axes)."""
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= 4 * scale:
            return float(scale), name
    return 1.0, "B"


def format_bytes(nbytes: int) -> str:
    """``nbytes`` for a person, in the largest unit it fills: ``"812 B"``, ``"966.91 MiB"``."""
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:,.2f} {unit}"
    return f"{nbytes:,} B"


def bytes_text(nbytes: int) -> str:
    """Exact, then for a person, as every report prints bytes:
    ``"1,013,874,176 B (966.91 MiB)"`` (``"812 B"`` below 1 KiB)."""
    person = format_bytes(nbytes)
    return person if person.endswith(" B") else f"{nbytes:,} B ({person})"
