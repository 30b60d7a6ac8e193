"""A Ctrl-C at a chosen line of the engine: ``KeyboardInterrupt`` raised through ``sys.settrace``.

:class:`Injector` counts the line events of the engine's code (``pgmo/engine``)
and raises :class:`Interrupt` at the ``at``-th one (or, with ``every``, at
every ``every``-th one: a storm).  Destructors are left alone (Python drops
an exception raised in one), as is engine code that the host model of the
device calls on its own behalf (it plays the driver, whose calls are C).

Two kinds of line event are skipped.  A line whose instruction is a ``NOP``
(a ``try:``, a ``pass``: :func:`nops`), where no signal is acted on.  And
the one CPython (3.11 and later) sends again for a ``with`` statement's
line as its body ends, *before* ``__exit__`` is called (:func:`with_exits`).
That point is outside the statement's clean-up, so raising there leaves a
lock taken; but no signal can land there.
CPython runs a signal's handler only where it checks for one (a function's
entry, a backward jump, right after a call returns), and the first such check
after a body ends is after ``__exit__`` has returned (the lock released).  A
Ctrl-C there would be an artefact of the tracer, not one a user can send.
The real signals of :class:`SignalStorm` keep every point they can reach.
Nor is a Ctrl-C raised inside a call that holds one until it ends
(:func:`pgmo.device.whole_calls.whole`, as the page heap's boundary calls
do), unless it is sent as a real signal (``real``), which the hold keeps.
"""

from __future__ import annotations

import dis
import signal
import sys
from functools import lru_cache
from pathlib import Path

import pgmo.engine
from pgmo.device.whole_calls import whole

#: The code of the wrapper :func:`~pgmo.device.whole_calls.whole` puts around a call.
HELD = whole(lambda: None).__code__

__all__ = ["Interrupt", "Injector", "DESTRUCTORS"]

ENGINE = str(Path(pgmo.engine.__file__).resolve().parent)
PACKAGE = Path(pgmo.engine.__file__).resolve().parents[1]
#: The engine's code, and the neutral placement it calls (its arena's gaps, its own heap).
TRACED = (ENGINE, str(PACKAGE / "placement.py"))
#: The host model of the device (pgmo/device/host_*.py): the traced code it calls (its
#: pool's placement) is not interrupted on its behalf.
DEVICE_MODEL = frozenset(str(path) for path in (PACKAGE / "device").glob("host_*.py"))
#: Python drops an exception raised in a destructor ("Exception ignored in..."): an
#: interrupt there is not the engine's to handle (the frees queue themselves in their first
#: line, see "Commits" in pgmo/engine/frees.py).
DESTRUCTORS = {"__del__", "_queue_free"}


class Interrupt(KeyboardInterrupt):
    """The injected Ctrl-C (a KeyboardInterrupt, told apart from a real one)."""


@lru_cache(maxsize=None)
def nops(code) -> frozenset[int]:
    """Offsets in ``code`` of ``NOP`` instructions: a ``try:`` line (or a ``pass``).  No signal
    is acted on there (CPython checks for one at a function's entry, a backward jump and
    after a call), and a ``try:`` line's ``NOP`` lies outside the exception table of the
    ``try`` around it, so an exception the tracer raised there would skip a handler that
    a real Ctrl-C, acted on at the check before, reaches."""
    return frozenset(i.offset for i in dis.get_instructions(code) if i.opname == "NOP")


@lru_cache(maxsize=None)
def with_exits(code) -> frozenset[int]:
    """Offsets in ``code`` of a ``with`` statement's exit machinery before ``__exit__`` runs:
    what CPython (3.11-3.13) attributes to the statement's line after its ``BEFORE_WITH``
    (the ``None`` arguments of a normal exit, the ``SWAP`` of a ``return`` inside, the
    handler's ``PUSH_EXC_INFO`` of an exception's exit)."""
    ins = list(dis.get_instructions(code))
    entered: dict[int, int] = {}  # line -> the first BEFORE_WITH on it
    for i in ins:
        line = i.positions.lineno if i.positions else None
        if i.opname == "BEFORE_WITH" and line is not None:
            entered[line] = min(entered.get(line, i.offset), i.offset)
    return frozenset(i.offset for i in ins if i.positions and i.positions.lineno in entered
                     and i.offset > entered[i.positions.lineno])


class Injector:
    """Counts the engine's line events; raises :class:`Interrupt` at the ``at``-th one, or at
    every ``every``-th one (``at=None, every=None``: only counts, listing the lines).
    ``functions``: only the lines of the engine's functions of these names count.

    ``real``: a real SIGINT is raised there instead, which Python's handler (or whatever
    the code let wait for it) turns into a KeyboardInterrupt."""

    def __init__(self, at: int | None = None, every: int | None = None,
                 traced: tuple[str, ...] = TRACED, real: bool = False,
                 functions: frozenset[str] | None = None):
        self.traced = traced
        self.functions = functions  # only the lines of functions of these names (None: all)
        self.real = real
        self.at = at
        self.every = every
        self.seen = 0
        self.fired = 0
        self.lines: list[tuple[str, int]] = []

    def _due(self) -> bool:
        if self.every is not None:
            return self.seen % self.every == 0
        return self.at is not None and self.seen == self.at

    def _local(self, frame, event, arg):
        if event == "line" and frame.f_lasti not in with_exits(frame.f_code) \
                and frame.f_lasti not in nops(frame.f_code):
            self.seen += 1
            if self.at is None and self.every is None:
                self.lines.append((frame.f_code.co_filename, frame.f_lineno))
            elif self._due():
                self.fired += 1
                if self.real:
                    signal.raise_signal(signal.SIGINT)
                else:
                    raise Interrupt(f"injected at {frame.f_code.co_filename}:{frame.f_lineno}")
        return self._local

    def _global(self, frame, event, arg):
        if frame.f_code.co_filename.startswith(self.traced) \
                and (self.functions is None or frame.f_code.co_name in self.functions) \
                and (self.every is not None or not self.fired) \
                and frame.f_code.co_name not in DESTRUCTORS and not _aside(frame, self.real):
            return self._local
        return None

    def __enter__(self):
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)


def _aside(frame, real: bool = False) -> bool:
    """Whether ``frame`` runs on behalf of the host model of the device (which plays the
    driver, whose calls are C), or (unless ``real``) inside a call that holds a Ctrl-C
    until it ends (:func:`pgmo.device.whole_calls.whole`: a page heap's trim, say), where
    no real Ctrl-C is acted on: a raised one would be the tracer's artefact (a real one
    is still sent, ``real``: the hold is what is tested then).  One walk up the stack."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename in DEVICE_MODEL or (code is HELD and not real):
            return True
        frame = frame.f_back
    return False


def _engine_frame(frame) -> bool:
    return frame is not None and frame.f_code.co_filename.startswith(TRACED) \
        and frame.f_code.co_name not in DESTRUCTORS and not _aside(frame)


class SignalStorm:
    """Real signals, every ``interval`` seconds: each one that lands in the engine's code
    raises :class:`Interrupt` there, as a Ctrl-C does (Python runs a signal's handler between
    two bytecodes of whatever runs then; compiled code takes it at its next Python call)."""

    def __init__(self, interval: float = 0.0003):
        self.interval = interval
        self.fired = 0
        self._old = None

    def _handler(self, signum, frame):
        if _engine_frame(frame):
            self.fired += 1
            raise Interrupt(f"signal at {frame.f_code.co_filename}:{frame.f_lineno}")

    def __enter__(self):
        self._old = signal.signal(signal.SIGALRM, self._handler)
        signal.setitimer(signal.ITIMER_REAL, self.interval, self.interval)
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._old)
