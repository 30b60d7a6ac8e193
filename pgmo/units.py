"""Sizes: the allocation unit of the pool, its plans and the trace tools; bytes in reports.

Every report writes bytes through :func:`bytes_text` (exact, then in a unit)
or :func:`format_bytes` (the unit alone), so that one quantity reads the same
in ``pgmo solve``, ``check``, ``analyze``, the demo and the plots.

CuPy rounds every request up to a multiple of 512 bytes (its memory pool's
``ALLOCATION_UNIT_SIZE``); pgmo's pool does the same, so recorded traces and
saved plans hold rounded sizes.
"""

from __future__ import annotations

__all__ = ["ALIGNMENT", "MAX_DEVICE_BYTES", "MAX_TRACE_BYTES", "size_refused", "round_size",
           "byte_unit", "format_bytes", "bytes_text"]

ALIGNMENT = 512

#: 256 TiB: more memory than any device has (the largest GPUs hold a few hundred
#: GB).  The largest size, offset or peak a saved plan may hold, and the largest
#: size of one request in a trace (every reader, :meth:`pgmo.trace.Trace.from_rows`,
#: ``pgmo analyze --granularity``): a file that asks for more was modified or damaged.
MAX_DEVICE_BYTES = 1 << 48

#: 1 EiB (2**60): the most bytes all of a trace's requests may ask for together.
#: Every offset and peak of a packing is at most this total, and the solvers hold
#: them as 64-bit integers (NumPy arrays, CP-SAT and HiGHS bounds) beside sentinels
#: of 2**62 and sums of two of them (an offset plus the exact model's big-M): with
#: each size at most :data:`MAX_DEVICE_BYTES` and the total at most this, no such
#: sum reaches 2**62, far from int64's 2**63.  4096 requests of the largest size fit.
MAX_TRACE_BYTES = 1 << 60


def size_refused(size: int, total: int = 0) -> str:
    """Why a request of ``size`` bytes is refused ("" when it is not): more than
    :data:`MAX_DEVICE_BYTES`, or ``total`` (the sizes so far, this one included) more
    than :data:`MAX_TRACE_BYTES`.  The one rule for every reader of sizes."""
    if size > MAX_DEVICE_BYTES:
        return (f"size {size:,} B is more than any device holds "
                f"({MAX_DEVICE_BYTES:,} B = 256 TiB)")
    if total > MAX_TRACE_BYTES:
        return (f"the sizes so far total {total:,} B, more than pgmo plans for "
                f"({MAX_TRACE_BYTES:,} B = 1 EiB in one trace)")
    return ""


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
