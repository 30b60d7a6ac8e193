"""Chainer trainer extension: one training update = one profiled pgmo iteration.

Usage::

    from pgmo.chainer import ProfileGuidedMemory
    trainer.extend(ProfileGuidedMemory())        # or ProfileGuidedMemory(pool)
    trainer.extend(extensions.PrintReport(['iteration', 'pgmo/arena_bytes']))

Importing this module first applies :mod:`pgmo._chainer_compat`, so Chainer
7.8.1 imports on NumPy 2 and Python >= 3.12 without the user patching anything.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Iterable

import numpy

from . import _chainer_compat

_chainer_compat.apply()

try:
    import chainer
    from chainer import training
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pgmo.chainer needs Chainer 7.8.1; install it with "
        "PIP_CONSTRAINT=constraints-chainer.txt PIP_BUILD_CONSTRAINT=constraints-chainer.txt "
        "pip install 'pgmo[chainer]'") from error

if TYPE_CHECKING:
    from .pool import ProfileGuidedMemoryPool

__all__ = ["ProfileGuidedMemory"]

logger = logging.getLogger(__name__)

#: Name of the serialized pool state inside the extension's snapshot group.
STATE_KEY = "pool_state"


def _reportable(keys: Iterable[str]) -> tuple[str, ...]:
    """``keys`` if each names an integer of :class:`pgmo.PoolStats` (what LogReport can
    average); else a ValueError naming the first that does not, at once rather than in
    the first update."""
    from .arguments import closest
    from .stats import ALIASES, PoolStats

    numbers = [f.name for f in dataclasses.fields(PoolStats) if f.type in ("int", int)]
    numbers += [old for old, new in ALIASES.items() if new in numbers]
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    for key in keys:
        if key not in numbers:
            guess = closest(key, numbers)
            raise ValueError(f"keys: {key!r} is not an integer of pgmo.PoolStats"
                             + (f"; did you mean {guess!r}?" if guess else "")
                             + " (ProfileGuidedMemory reports only numbers)")
    return keys


class ProfileGuidedMemory(training.Extension):
    """Run every ``updater.update()`` as one :meth:`pool.iteration() <pgmo.ProfileGuidedMemoryPool.iteration>`.

    ``initialize`` wraps the updater's ``update`` and the first update installs
    the pool as CuPy's allocator, so the pool sees the same request sequence
    every iteration while other extensions (evaluators, snapshots) allocate
    between iterations, outside the plan.  The pool's integer stats are
    reported from inside the wrapped update, i.e. in the trainer's reporter
    scope, so LogReport/PrintReport show them as ``pgmo/<stat>`` in the same
    iteration.  ``finalize`` restores the allocator and the original
    ``update``, also when training fails.  ``serialize`` stores the pool's
    profile and plan, so a trainer resumed from a snapshot keeps the plan
    instead of profiling again; a snapshot taken without this extension (or
    whose pool state is damaged) resumes too, the pool profiling as in a new
    run.

    ``pool``
        a :class:`pgmo.ProfileGuidedMemoryPool`; by default a new one is
        made (on first use) with ``pool_options``.
    ``keys``
        which integer ``pool.stats()`` entries to report (a ValueError names one
        that is none); default: every integer.
    ``prefix``
        prefix of the reported keys.
    ``pool_options``
        keyword arguments for the default pool (``warmup``,
        ``method``, ``time_limit``, ``plan_path``...).
    """

    trigger = 1, "iteration"
    # Initializers run by descending priority, outside the trainer's try/finally:
    # the lowest priority wraps the update only once every other one has worked.
    priority = 0
    default_name = "ProfileGuidedMemory"

    def __init__(self, pool: ProfileGuidedMemoryPool | None = None, *,
                 keys: Iterable[str] | None = None, prefix: str = "pgmo/", **pool_options: Any):
        if pool is not None and pool_options:
            raise TypeError("give either a pool or options for a new pool, not both: "
                            f"got a pool and {sorted(pool_options)}")
        self._pool = pool
        self._pool_options = pool_options
        self._keys = None if keys is None else _reportable(keys)
        self._prefix = prefix
        self._updater: Any = None  # Chainer's updater, while its update is wrapped
        self._installed = False
        self._had_own_update = False
        self._own_update: Any = None

    @property
    def pool(self) -> ProfileGuidedMemoryPool:
        """The pool in use; the default one is created here on first access."""
        if self._pool is None:
            from .pool import ProfileGuidedMemoryPool

            self._pool = ProfileGuidedMemoryPool(**self._pool_options)
        return self._pool

    def initialize(self, trainer: training.Trainer) -> None:
        """Wrap ``updater.update`` so that each update is one pool iteration.

        The pool becomes CuPy's allocator at the first update, inside the
        trainer's ``try``/``finally`` that calls :meth:`finalize`: a trainer
        that fails before its loop (an extension's ``initialize`` or a
        before-training call) leaves CuPy's allocator alone.
        """
        if self._updater is not None:  # a run that failed before training: start afresh
            self.finalize()
        updater = trainer.updater
        pool = self.pool
        self._had_own_update = "update" in vars(updater)
        self._own_update = vars(updater).get("update")
        original_update = updater.update

        def update() -> None:
            if not self._installed:
                pool.install()
                self._installed = True
            with pool.iteration():
                original_update()
            self._report()

        updater.update = update
        self._updater = updater
        logger.debug("%s.update wrapped in pgmo iterations", type(updater).__name__)

    def _report(self) -> None:
        """Report the pool's stats into the current (trainer's) reporter scope."""
        stats = self.pool.stats()
        values = stats.numbers() if self._keys is None else \
            {k: getattr(stats, k) for k in self._keys}
        chainer.report({self._prefix + k: v for k, v in values.items()})

    def __call__(self, trainer: training.Trainer) -> None:
        """Nothing to do per iteration: the work happens in the wrapped update."""

    def finalize(self, trainer: training.Trainer | None = None) -> None:
        """Restore the updater's own ``update`` and the previous allocator."""
        updater, self._updater = self._updater, None
        if updater is None:
            return
        if self._had_own_update:
            updater.update = self._own_update
        else:
            del updater.update
        self._own_update = None
        if self._installed:
            self._installed = False
            self.pool.uninstall()
        logger.debug("%s.update restored, pgmo pool uninstalled", type(updater).__name__)

    def serialize(self, serializer: chainer.serializer.AbstractSerializer) -> None:
        """Save or load the pool's profile and plan as a uint8 array."""
        if isinstance(serializer, chainer.serializer.Serializer):
            # Before the first plan (warm-up, profiling) there is nothing to keep.
            data = self.pool.state_bytes() if self.pool.plan is not None else b""
            serializer(STATE_KEY, numpy.frombuffer(data, dtype=numpy.uint8))
            return
        try:
            state = serializer(STATE_KEY, None)
        except KeyError:  # a snapshot taken without this extension: nothing to resume
            logger.info("pgmo: the snapshot has no pool state (taken without the "
                        "ProfileGuidedMemory extension); the pool profiles as in a new run")
            return
        if state is None or len(state) == 0:
            return
        from .pool import PlanFileError

        try:
            self.pool.load_state_bytes(numpy.asarray(state, dtype=numpy.uint8).tobytes())
        except PlanFileError as error:
            logger.warning("pgmo: the snapshot's pool state is unusable (%s); "
                           "the pool profiles again", error)
