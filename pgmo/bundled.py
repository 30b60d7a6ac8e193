"""Traces shipped inside the package, for the demo, tests and benchmarks.

Each file in ``pgmo/traces/`` is a compressed pgmo JSON trace whose metadata
says how it was made, so that nobody takes a generated trace for a
measurement or a measurement without its conditions: see
:func:`provenance_problems` for what each kind must record.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, Mapping

from .formats import read_trace
from .trace import Trace

__all__ = ["names", "path", "load", "provenance_problems", "SYNTHETIC_FIELDS",
           "RECORDED_FIELDS", "TRACE_DIR"]

TRACE_DIR = Path(__file__).parent / "traces"
_SUFFIX = ".json.gz"

#: What a generated trace records: how it was made, and the arguments that
#: let :mod:`pgmo.synth` make it again.
SYNTHETIC_FIELDS = {
    "recorded_by": "how it was generated (e.g. 'pgmo.synth (generator, not a measurement)')",
    "model": "the model whose layers it mimics",
    "batch_size": "the batch size",
    "kind": "the task: training or inference",
}
#: What a trace recorded on a GPU records: the workload, how, where, with what.
RECORDED_FIELDS = {
    "model": "the model (e.g. resnet50)",
    "batch_size": "the batch size",
    "kind": "the task: training or inference",
    "command": "the command line that recorded it",
    "device": "the GPU's name",
    "cupy": "CuPy's version",
    "numpy": "NumPy's version",
    "python": "Python's version",
    "chainer": "Chainer's version",
    "pgmo": "pgmo's version",
    "date": "when it was recorded (ISO 8601)",
}
KINDS = ("training", "inference")


def names() -> list[str]:
    """Names of the bundled traces, sorted."""
    return sorted(p.name[: -len(_SUFFIX)] for p in TRACE_DIR.glob(f"*{_SUFFIX}"))


def path(name: str) -> Path:
    candidate = TRACE_DIR / f"{name}{_SUFFIX}"
    if not candidate.is_file():
        raise KeyError(f"no bundled trace {name!r}; available: {', '.join(names())}")
    return candidate


def load(name: str) -> Trace:
    """Read one bundled trace by name (see :func:`names`)."""
    return read_trace(path(name))


def provenance_problems(metadata: Mapping[str, Any]) -> list[str]:
    """Why a trace with this metadata may not be bundled; empty when it may.

    A generated trace says ``synthetic: true`` and the :data:`SYNTHETIC_FIELDS`
    (that :mod:`pgmo.synth` reproduces it exactly is checked by the tests).  A
    recorded trace says ``synthetic: false`` and the :data:`RECORDED_FIELDS`.
    A CPU dry run of ``scripts/record_traces.py`` (``dry_run: true``) records
    nothing and is reported as such, besides any field it lacks.
    """
    if not isinstance(metadata, Mapping):
        raise TypeError(f"trace metadata must be a mapping, got {type(metadata).__name__}")
    problems = []
    synthetic = metadata.get("synthetic")
    dry_run = bool(metadata.get("dry_run"))
    if dry_run:
        problems.append("a CPU dry run (dry_run: true), not a recording")
    if not isinstance(synthetic, bool):
        problems.append("'synthetic' must be true (generated) or false (recorded on a GPU), "
                        f"got {synthetic!r}")
    elif synthetic and not dry_run:
        problems += _missing(metadata, SYNTHETIC_FIELDS, "a synthetic trace")
    else:
        problems += _missing(metadata, RECORDED_FIELDS, "a recorded trace")
    return problems


def _missing(metadata: Mapping[str, Any], fields: dict[str, str], what: str) -> list[str]:
    """A problem for each field not recorded, then for each recorded value that is wrong."""
    problems, present = [], {}
    for key, meaning in fields.items():
        value = metadata.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            problems.append(f"{what} must record {key!r}: {meaning}")
        else:
            present[key] = value
    batch = present.get("batch_size")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)
                              or batch < 1):
        problems.append(f"'batch_size' must be an integer >= 1, got {batch!r}")
    if "kind" in present and present["kind"] not in KINDS:
        problems.append(f"'kind' must be one of {', '.join(KINDS)}, got {present['kind']!r}")
    if "date" in present and not _is_iso_date(present["date"]):
        problems.append("'date' must be ISO 8601 (e.g. 2025-01-31T12:00:00+00:00), "
                        f"got {present['date']!r}")
    return problems


def _is_iso_date(value: Any) -> bool:
    try:
        datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return False
    return True
