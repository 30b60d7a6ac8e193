"""``with engine.iteration():`` and ``with engine.interrupted():``, closed whatever is raised.

Classes, not generators: one that is garbage collected unfinished closes
nothing, where a generator's finalizer would take the engine's lock wherever
the collector runs, the engine's own code included.  Tested in
``tests/test_interrupt_safety.py`` and ``tests/test_engine_errors.py`` (misuse).
"""

from __future__ import annotations

from typing import Any, Protocol

from .loop_watch import LoopWatch
from .state import IterationState

__all__ = ["IterationScope", "InterruptedScope"]


class ScopedEngine(Protocol):
    """What the scopes use of :class:`~.core.Engine` (named here: core imports this module)."""

    state: IterationState
    watch: LoopWatch

    def begin_iteration(self, opener: object = None) -> None: ...

    def end_iteration(self, aborted: bool = False) -> None: ...

    def _abandon(self) -> None: ...

    def interrupt(self) -> None: ...

    def resume(self) -> None: ...


class IterationScope:
    """``with engine.iteration():`` (a class, not a generator: one that is garbage collected
    unfinished closes nothing, where a generator's finalizer would take the engine's lock
    wherever the collector runs, the engine's own code included)."""

    __slots__ = ("_engine", "_result", "_nested", "__weakref__")

    def __init__(self, engine: ScopedEngine, result: Any):
        self._engine, self._result, self._nested = engine, result, False

    def __enter__(self) -> Any:
        engine = self._engine
        self._nested = engine.state.inside and engine.watch.period is None  # refused below
        try:
            engine.begin_iteration(self)
            return self._result
        except BaseException:
            if not self._nested:
                engine._abandon()
            raise

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        engine = self._engine
        if kind is not None:
            engine._abandon()
            return
        try:
            engine.end_iteration()
        except BaseException:
            engine._abandon()
            raise


class InterruptedScope:
    """``with engine.interrupted():`` (a class, see :class:`IterationScope`)."""

    __slots__ = ("_engine", "_result", "_before")

    def __init__(self, engine: ScopedEngine, result: Any):
        self._engine, self._result, self._before = engine, result, 0

    def __enter__(self) -> Any:
        engine = self._engine
        self._before = engine.state.interrupts
        try:
            engine.interrupt()
            return self._result
        except BaseException:
            if engine.state.interrupts > self._before:
                engine.resume()
            raise

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if self._engine.state.interrupts > self._before:
            self._engine.resume()
