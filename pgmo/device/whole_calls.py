"""A Ctrl-C waits for the device layer's call to end: :func:`whole`.

(The page heap's boundary calls, :meth:`pgmo.engine.page_heap.PageHeap.trim` and
``tidy``, use it too: each drops mappings and gives pages back in steps that
must not part, and runs once per boundary, where its cost does not count.)

A range's call (:class:`~pgmo.device.cuda.CudaRange`) is a driver call and the
books that say what it did.  Python raises KeyboardInterrupt between any two
bytecodes, so a Ctrl-C could land after ``cuMemUnmap`` returned and before
the books took the mapping off: the engine would then hand out addresses the
driver no longer maps (or, the other way round, never give back memory the
books call gone).  The engine's own code copes with a Ctrl-C at any line
around such a call (``tests/test_interrupt_safety.py``); it relies on the call
being whole.

So the call runs with SIGINT held: a Ctrl-C that arrives meanwhile is kept
and handed to the handler that was there before, once, as the call ends
(with its default handler: KeyboardInterrupt, raised where the call
returns; several presses during one call count as one).  The hold lasts the
whole method: a growth maps its pieces, a ``close`` waits for the device and
unmaps everything, before a Ctrl-C is acted on.  Python runs signal handlers
in the main thread only, so other threads' calls need nothing; neither does
a process whose SIGINT handler was not installed from Python
(:func:`signal.getsignal` says None: it cannot be put back).  The cost is
about 4-7 us a call (a ``getsignal`` and two ``signal.signal``), against the
15-55 us of each driver call it wraps (``pgmo/device/params.py``).

Tested by ``tests/test_whole_calls.py`` (the handler's part) and
``tests/test_cuda_device.py`` (a real SIGINT at every line of each range
call, against the driver stand-in).
"""

from __future__ import annotations

import functools
import signal
import threading
from typing import Any, Callable, TypeVar

__all__ = ["whole"]

F = TypeVar("F", bound=Callable[..., Any])

_MAIN = threading.main_thread().ident


def whole(call: F) -> F:
    """``call`` (a method of the device layer, or a page heap's trim or tidy) ends before a
    Ctrl-C is acted on."""

    @functools.wraps(call)
    def held(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != _MAIN:
            return call(*args, **kwargs)  # no signal handler runs in this thread
        kept: list[Any] = []
        try:
            before = signal.getsignal(signal.SIGINT)
            if before is not None:  # None: installed from C, it could not be put back
                signal.signal(signal.SIGINT, lambda signum, frame: kept.append(frame))
        except (ValueError, TypeError):  # not the main interpreter; or shutting down
            before = None
        if before is None:
            return call(*args, **kwargs)
        try:
            return call(*args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, before)
            if kept:
                _deliver(before, kept[0])

    return held  # type: ignore[return-value]


def _deliver(handler: Any, frame: Any) -> None:
    """The held Ctrl-C, to the handler that was there when the call began."""
    if handler is signal.SIG_IGN:
        return
    if handler is signal.SIG_DFL:
        signal.raise_signal(signal.SIGINT)  # the process ends, as it would have
        return
    handler(signal.SIGINT, frame)
