"""Unpickling a file from a stranger without running its code.

A pickle is a small program: its ``GLOBAL``/``STACK_GLOBAL`` opcodes import
any callable (``os.system``...) and ``REDUCE`` calls it.  PyTorch's memory
snapshots hold only dicts, lists, tuples, strings, numbers, booleans and
None, none of which needs an import, so :class:`PlainDataUnpickler` refuses
every import (and every persistent id).  Without an imported callable no
opcode can call anything: what comes out is plain data or an error.
"""

from __future__ import annotations

import io
import pickle

from ..errors import TraceFormatError

__all__ = ["PlainDataUnpickler", "loads_plain_data"]


class _Refused(pickle.UnpicklingError):
    """The pickle asked for something that plain data never needs."""


class PlainDataUnpickler(pickle.Unpickler):
    """An unpickler that builds containers, numbers and strings, and nothing else."""

    def find_class(self, module: str, name: str):  # noqa: D401 - pickle's API
        raise _Refused(f"it asks to import {module}.{name}, which plain data never needs "
                       f"(a pickle that imports can run code; pgmo does not load those)")

    def persistent_load(self, pid):
        raise _Refused("it refers to an external object (persistent id), which plain "
                       "data never does")


def loads_plain_data(data: bytes, path: str | None = None, what: str = "pickle"):
    """Unpickle ``data`` (plain containers and scalars only); errors name ``path``.

    Raises :class:`~pgmo.errors.TraceFormatError` for a refused pickle, a
    damaged one and a truncated one, saying which.
    """
    try:
        return PlainDataUnpickler(io.BytesIO(data)).load()
    except _Refused as exc:
        raise TraceFormatError(f"refused to load this {what}: {exc}", path=path) from None
    except EOFError:
        raise TraceFormatError(f"truncated {what}: the data ends before the pickle does "
                               f"(was the file copied completely?)", path=path) from None
    except (pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, OverflowError, MemoryError, UnicodeDecodeError) as exc:
        text = str(exc)
        if "truncated" in text:
            raise TraceFormatError(f"truncated {what}: {text} (was the file copied "
                                   f"completely?)", path=path) from None
        raise TraceFormatError(f"damaged {what}: {type(exc).__name__}: {text}",
                               path=path) from None
