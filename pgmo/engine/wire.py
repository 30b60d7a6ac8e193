"""The worker's wire format: length-prefixed pickles of plain data over a pipe.

Only pgmo's own processes are at either end (the planner and the worker it
started), so pickle is safe here.

Tested in ``tests/test_planner.py`` (through the worker).
"""

from __future__ import annotations

import pickle
import struct
from typing import IO, Any

__all__ = ["send", "receive"]

_HEADER = struct.Struct("<Q")


def send(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def receive(stream: IO[bytes]) -> Any:
    """The next message, or None when the stream ended."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (length,) = _HEADER.unpack(header)
    data = stream.read(length)
    if len(data) < length:
        return None
    return pickle.loads(data)
