"""What every reader returns, and the options readers share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

from ..errors import TraceFormatError
from ..trace import Block, Trace

__all__ = ["Loaded", "ReadOptions", "offsets_for_closed"]


class Loaded(NamedTuple):
    """A trace and, for files that hold a plan, the offsets of its closed blocks.

    ``offsets[k]`` places the k-th block of ``trace.without_open()``: an open
    block (never freed while recorded) has no planned place.
    """

    trace: Trace
    offsets: list[int] | None = None


@dataclass(frozen=True)
class ReadOptions:
    """Options of the readers; each format uses those that concern it.

    ``inclusive``: lifetimes include ``upper`` (IREE's CSV files).
    ``device``/``stream``: which device and stream of a multi-device log to read
    (default: the device with the most events, and all its streams).  A
    stream is a number (CUDA stream handle) or, in logs that name streams
    otherwise, the name as written.
    """

    inclusive: bool = False
    device: int | None = None
    stream: int | str | None = None


def offsets_for_closed(blocks: Sequence[Block], offsets: Sequence[int | None]) -> list[int]:
    """Keep the offsets of closed blocks; an open block must have none, a closed one one."""
    out = []
    for b, o in zip(blocks, offsets):
        if b.upper is None:
            if o is not None:
                raise TraceFormatError(f"block id={b.id} is open (never freed) but has an "
                                       f"offset", field="offset")
        elif o is None:
            raise TraceFormatError(f"block id={b.id} is freed but has no offset",
                                   field="offset")
        else:
            out.append(o)
    return out
