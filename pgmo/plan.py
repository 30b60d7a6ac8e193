"""A plan: one offset per request, the peak it needs, and how it was found.

The pool answers request ``i`` of an iteration with ``offsets[i]`` into one
arena of ``peak`` bytes.  The peak is always recomputed from the offsets, so a
plan can never claim less memory than its placements use.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import PlanError, TraceFormatError
from .formats import load, write_trace
from .trace import Trace, packing_peak
from .validate import check_offsets, find_conflict

__all__ = ["Plan", "read_plan"]


@dataclass(frozen=True)
class Plan:
    """Offsets (in block order) for a trace of closed blocks, with the peak and solve facts.

    ``info`` is the solver's report (strategy, nodes, restarts, proof, gap...).
    """

    trace: Trace
    offsets: tuple[int, ...]
    method: str = "given"
    seconds: float = 0.0  # wall time the solver spent
    optimal: bool | None = None  # True when proven optimal, None when unknown
    info: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        try:  # operator.index accepts ints and NumPy integers, never floats
            offsets = tuple(operator.index(o) for o in self.offsets)
        except TypeError:
            bad = next(o for o in self.offsets if not hasattr(o, "__index__"))
            raise ValueError(f"offsets must be integers, got {bad!r}") from None
        if len(offsets) != len(self.trace):
            raise ValueError(f"{len(offsets)} offsets for {len(self.trace)} blocks")
        if self.trace.open_ids:
            raise ValueError("a plan places blocks with a lifetime: close the open blocks "
                             "(trace.closed()) or leave them out (trace.without_open())")
        object.__setattr__(self, "offsets", offsets)
        if self.optimal is None and self.peak == self.lower_bound:
            object.__setattr__(self, "optimal", True)

    @property
    def peak(self) -> int:
        """Bytes the arena needs: the highest ``offset + size``."""
        cached = self.__dict__.get("_peak")
        if cached is None:
            cached = packing_peak(self.offsets, self.trace.log_columns()[2])
            object.__setattr__(self, "_peak", cached)
        return cached

    @property
    def lower_bound(self) -> int:
        return self.trace.lower_bound()

    @property
    def ratio(self) -> float:
        """peak / lower bound (1.0 is optimal)."""
        return self.peak / self.lower_bound if self.lower_bound else 1.0

    def is_valid(self) -> bool:
        return find_conflict(self.trace.blocks, self.offsets) is None

    def validate(self) -> "Plan":
        """Raise :class:`~pgmo.errors.PlanError` if two live blocks share an address."""
        check_offsets(self.trace.blocks, self.offsets)
        return self

    def check_fits(self, profile: Trace) -> "Plan":
        """Raise PlanError unless this plan places exactly ``profile``'s closed blocks, validly."""
        expected = profile.without_open().blocks
        mine = self.trace.blocks
        if len(mine) != len(expected):
            raise PlanError(f"the plan places {len(mine)} blocks, the profile has "
                            f"{len(expected)} closed ones")
        for a, b in zip(expected, mine):
            if a != b:
                raise PlanError(f"block id={a.id} differs: the profile has {a}, the plan {b}")
        return self.validate()

    def write(self, path: str | os.PathLike) -> None:
        """Write ``id,lower,upper,size,offset`` CSV, or JSON with solve facts."""
        write_trace(self.trace, path, offsets=self.offsets,
                    extra_metadata={"plan": self.summary()})

    def summary(self) -> dict[str, Any]:
        return {"method": self.method, "n": len(self.trace), "lower_bound": self.lower_bound,
                "peak": self.peak, "ratio": round(self.ratio, 6), "seconds": round(self.seconds, 4),
                "optimal": self.optimal}

    def __repr__(self) -> str:
        return (f"Plan(n={len(self.trace)}, method={self.method!r}, peak={self.peak}, "
                f"lower_bound={self.lower_bound}, ratio={self.ratio:.4f}, "
                f"seconds={self.seconds:.3f})")


def read_plan(path: str | os.PathLike, inclusive: bool = False, validate: bool = True,
              format: str | None = None) -> Plan:
    """Read a plan: a CSV/JSON trace with an ``offset`` column, or a pool's saved plan.

    By default an invalid packing is rejected (naming the two blocks).
    """
    from .formats import ReadOptions

    trace, offsets = load(path, format, ReadOptions(inclusive=inclusive))
    if offsets is None:
        raise TraceFormatError("missing column: a plan needs offsets", path=str(path),
                               line=1, field="offset")
    plan = Plan(trace.without_open(), tuple(offsets), method="file")
    if validate:
        plan.validate()
    return plan
