"""What every packing method returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Packing"]


@dataclass
class Packing:
    """Offsets in block order, whether they are proven optimal, and a report.

    ``optimal`` is True only when proven (None: unknown).  ``info`` says what
    the method did: its strategy, search steps, restarts, the bound it proved.
    """

    offsets: list[int]
    optimal: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)
