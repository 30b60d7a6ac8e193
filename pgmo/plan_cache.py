"""The plan cache: plans that outlive the process, so a run planned before starts on its plan.

A pool (``plan_cache=True``, the default, unless ``plan_path`` is given)
keeps each plan it installs in a folder of the user's cache, and a later
process on the same device starts from it, warm-up included, instead of
profiling.  A cached plan is a hint, never a promise: the engine checks every
request against it as the iteration runs (a request that differs departs,
and a plan that departs before an iteration has held on it is replaced by a
fresh profile, unless a steady iteration departed needing about what its arena
holds; see :mod:`pgmo.engine.hinted`), so a stale, foreign or
damaged entry costs at most the profiling it replaces.

Where: ``$PGMO_CACHE_DIR`` when set, else the platform's cache folder
(``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux, ``~/Library/Caches`` on macOS,
``%LOCALAPPDATA%`` on Windows) followed by ``pgmo/plans`` (see
:func:`cache_dir`).

What identifies a workload (the key):

* the device (:class:`DeviceKey`: its name and memory size, the CuPy version,
  pgmo's plan-file version), a folder of its own whose name is their hash, so
  a plan is never offered to another device or version;
* the first :data:`KEY_SIZES` request sizes of the first iteration a pool
  sees (the warm-up's), in the entry's file name: the first one in clear, all
  of them hashed.

How a starting pool finds its entry: it lists its device's folder when it is
made (the folder is the index: no index file to keep consistent between
processes).  The first iteration's first request then picks the newest entry
whose first size is that request's (as a recurring shape's plan is chosen by
its first request, :mod:`pgmo.engine.shapes`); only that file is read and
checked.

An entry holds the steady plan and one plan per warm-up iteration (its
long-lived blocks, parameters and optimizer state, kept apart as the steady
plan's survivors are; planned by :func:`warmup_plan`, or given the steady
plan's offsets where it repeats the steady iteration and they hold less:
:func:`steady_plan_for`), each a pgmo plan file
(:mod:`pgmo.formats.planfile`, with its own checksum).  With background
re-planning the entry is made in the planner's worker process
(:func:`keep_from_request`), so that its planning and encoding never take
the training process's interpreter.  Writes go to a
temporary file in the same folder and replace the entry in one step
(``os.replace``): data-parallel ranks that write the same key at once leave
one whole file.  A damaged entry is ignored
with one log line.

Core module: no CuPy.  Tested in ``tests/test_plan_cache.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from .errors import PlanFileError, TraceFormatError
from .formats import planfile
from .formats.files import read_bytes, write_bytes_atomically
from .plan import Plan
from .solver import SolverOptions, solve
from .trace import Trace
from .validate import find_conflict

__all__ = ["ENV", "KEY_SIZES", "FORMAT", "VERSION", "DeviceKey", "CachedPlan", "Entry",
           "cache_dir", "entry_name", "dumps", "loads", "PlanCache", "attach", "entries", "clear",
           "keep_from_request", "searched_plan", "steady_plan_for", "warmup_plan"]

log = logging.getLogger("pgmo.cache")

#: The environment variable that names the cache folder (tests point it at a tmp dir).
ENV = "PGMO_CACHE_DIR"
#: Request sizes of the first iteration that name a workload.
KEY_SIZES = 16
FORMAT = "pgmo-plan-cache"
VERSION = 1
_SUFFIX = ".plan.json"


def cache_dir() -> Path:
    """The folder of cached plans: ``$PGMO_CACHE_DIR``, else the platform's cache folder
    followed by ``pgmo/plans``."""
    chosen = os.environ.get(ENV)
    if chosen:
        return Path(chosen)
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "pgmo" / "plans"


@dataclass(frozen=True)
class DeviceKey:
    """The device and versions a plan was made for: ``device`` (the GPU's name, or the
    host backend's class), its ``memory`` in bytes, the ``cupy`` version (None on host
    memory) and pgmo's plan-file version."""

    device: str
    memory: int
    cupy: str | None
    plan_format: int = planfile.VERSION

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "memory": self.memory, "cupy": self.cupy,
                "plan_format": self.plan_format}

    @property
    def folder(self) -> str:
        """The name of this device's folder in the cache: a hash of the key."""
        canon = json.dumps(self.as_dict(), sort_keys=True)
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    def summary(self) -> str:
        gib = self.memory / 2 ** 30
        cupy = f"CuPy {self.cupy}" if self.cupy else "no CuPy"
        return f"{self.device}, {gib:.1f} GiB, {cupy}"


def entry_name(first_sizes: Sequence[int]) -> str:
    """An entry's file name: the first size in clear (a starting pool chooses by it), then a
    hash of the first :data:`KEY_SIZES` sizes."""
    sizes = [int(s) for s in first_sizes[:KEY_SIZES]]
    digest = hashlib.sha256(json.dumps(sizes).encode()).hexdigest()[:16]
    return f"{sizes[0] if sizes else 0}-{digest}{_SUFFIX}"


class CachedPlan(NamedTuple):
    """A cache entry, read and checked: the steady plan and its profile, one
    ``(profile, plan)`` per warm-up iteration, the key's first sizes."""

    profile: Trace
    plan: Plan
    warmup: tuple[tuple[Trace, Plan], ...]
    first_sizes: tuple[int, ...]
    device: dict


def _document(profile: Trace, plan: Plan) -> Any:
    return json.loads(planfile.dumps(profile, plan.offsets, plan.method))


def dumps(device: DeviceKey, first_sizes: Sequence[int], profile: Trace, plan: Plan,
          warmup: Sequence[tuple[Trace, Plan]] = ()) -> bytes:
    """An entry's bytes: the key, the steady plan, the warm-up plans (each a plan file)."""
    doc = {"format": FORMAT, "version": VERSION, "device": device.as_dict(),
           "first_sizes": [int(s) for s in first_sizes[:KEY_SIZES]],
           "created": time.time(), "peak": plan.peak,
           "plan": _document(profile, plan),
           "warmup": [_document(p, q) for p, q in warmup]}
    return json.dumps(doc, separators=(",", ":")).encode()


def _plan_of(doc: Any, source: str) -> tuple[Trace, Plan]:
    saved = planfile.loads(json.dumps(doc).encode(), source)
    return saved.profile, Plan(saved.profile.without_open(), tuple(saved.offsets),
                               method=saved.method)


def loads(data: bytes, source: str = "<bytes>") -> CachedPlan:
    """Parse and check an entry; :class:`~pgmo.errors.PlanFileError` naming ``source`` and
    the reason when it is damaged (each plan in it is checked as a plan file is)."""
    doc = planfile.read_document(data, source, FORMAT, VERSION, "plan cache entry")
    sizes, warmup, device = doc.get("first_sizes"), doc.get("warmup"), doc.get("device")
    if not isinstance(sizes, list) or not all(isinstance(s, int) for s in sizes) \
            or not isinstance(warmup, list) or not isinstance(device, dict):
        raise PlanFileError(f"{source}: plan cache entry has no valid key")
    profile, plan = _plan_of(doc.get("plan"), f"{source} (steady plan)")
    opening = tuple(_plan_of(w, f"{source} (warm-up plan {k})") for k, w in enumerate(warmup))
    return CachedPlan(profile, plan, opening, tuple(sizes), device)


class PlanCache:
    """One device's entries, as a pool uses them: listed when it starts, one read when the
    first iteration's first request names it, written when a plan is installed."""

    def __init__(self, device: DeviceKey, folder: Path | None = None):
        self.device = device
        self.folder = (folder if folder is not None else cache_dir()) / device.folder
        self._warmup_plans: dict[tuple, Plan] = {}  # a warm-up's blocks -> its plan
        self._searched: tuple | None = None  # the last plan kept: blocks, offsets, searched
        self._by_first: dict[int, list[Path]] = {}
        try:
            files = [p for p in self.folder.iterdir()
                     if p.name.endswith(_SUFFIX) and not p.name.startswith(".")]
        except OSError:  # no folder yet (or none to be had): no entries
            files = []
        stamped = []
        for path in files:
            try:
                stamped.append((path.stat().st_mtime, path))
            except OSError:
                continue  # removed meanwhile
        for _, path in sorted(stamped, reverse=True):  # the newest first
            head = path.name.split("-", 1)[0]
            if head.isdigit():
                self._by_first.setdefault(int(head), []).append(path)

    def __len__(self) -> int:
        return sum(map(len, self._by_first.values()))

    def find(self, first_size: int) -> CachedPlan | None:
        """The newest intact entry whose first request was ``first_size`` bytes (None: none).
        A damaged one is ignored with one log line."""
        for path in self._by_first.get(first_size, ()):
            try:
                return loads(read_bytes(path), str(path))
            except (PlanFileError, TraceFormatError, OSError) as e:
                log.warning("ignoring cached plan, profiling instead: %s", e)
        return None

    def store(self, first_sizes: Sequence[int], profile: Trace, plan: Plan,
              warmup: Sequence[tuple[Trace, Plan]] = ()) -> Path | None:
        """Write (atomically) the entry for ``first_sizes``; its path, or None when the
        folder cannot be written (one log line)."""
        if not first_sizes:
            return None
        path = self.folder / entry_name(first_sizes)
        try:
            write_bytes_atomically(path, dumps(self.device, first_sizes, profile, plan,
                                               warmup))
        except OSError as e:
            log.warning("cannot keep the plan in the plan cache (%s): %s", self.folder, e)
            return None
        return path


    def searched(self, plan: Plan) -> Plan:
        """:func:`searched_plan`, once per plan (the same plan installed again is not searched
        again; only the last is remembered, so a long run's worker does not grow)."""
        known = self._searched
        if known is None or known[0] != plan.trace.blocks or known[1] != plan.offsets:
            known = self._searched = (plan.trace.blocks, plan.offsets, searched_plan(plan))
        return known[2]

    def keep(self, profile: Trace, plan: Plan,
             openings: Sequence[tuple[Trace, Plan | None]] = ()) -> Path | None:
        """Store an installed plan with the warm-up iterations' profiles (``openings``), each
        planned where it has no plan yet (:func:`warmup_plan`; once per profile); the key's
        first sizes are the first iteration's (the warm-up's, else the steady profile's)."""
        warmup = []
        for opening, opening_plan in openings:
            if opening_plan is None:
                known = self._warmup_plans.get(opening.blocks)
                if known is None:
                    known = self._warmup_plans[opening.blocks] = warmup_plan(opening)
                opening_plan = known
                borrowed = steady_plan_for(opening, plan)
                if borrowed is not None and borrowed.peak < opening_plan.peak:
                    opening_plan = borrowed
            warmup.append((opening, opening_plan))
        first = openings[0][0] if openings else profile
        return self.store([b.size for b in first.blocks[:KEY_SIZES]], profile, plan, warmup)


    def keep_request(self, profile: Trace, plan: Plan,
                     openings: Sequence[tuple[Trace, Plan | None]] = ()) -> dict[str, Any]:
        """What :func:`keep_from_request` needs to do :meth:`keep` in another process (plain
        data): background planning keeps its plans from its worker process, so that the
        warm-up plans and the file's encoding never take the training process's
        interpreter."""
        return {"root": str(self.folder.parent), "device": self.device.as_dict(),
                "profile": _raw(profile), "offsets": list(plan.offsets),
                "method": plan.method,
                "openings": [(_raw(o), None if p is None else (list(p.offsets), p.method))
                             for o, p in openings]}


def _raw(trace: Trace) -> tuple[list, list, list, dict]:
    """A trace as plain data: lowers, uppers (None: open), sizes, metadata."""
    return (*trace.log_columns(), dict(trace.metadata))


def _trace(raw: Sequence) -> Trace:
    lowers, uppers, sizes, metadata = raw
    return Trace.from_columns(lowers, uppers, sizes, metadata)


def keep_from_request(request: dict[str, Any], caches: dict[tuple, "PlanCache"]) -> Path | None:
    """:meth:`PlanCache.keep` of a :meth:`PlanCache.keep_request`, in the process that got it
    (``caches``: this process's caches, kept between requests so that each warm-up is
    planned once)."""
    device = DeviceKey(**request["device"])
    root = Path(request["root"])
    cache = caches.get((root, device))
    if cache is None:
        cache = caches[(root, device)] = PlanCache(device, root)
    profile = _trace(request["profile"])
    plan = Plan(profile.without_open(), tuple(request["offsets"]), method=request["method"])
    plan = cache.searched(plan)
    openings = []
    for raw, given in request["openings"]:
        opening = _trace(raw)
        openings.append((opening, None if given is None else
                         Plan(opening.without_open(), tuple(given[0]), method=given[1])))
    return cache.keep(profile, plan, openings)


#: Warm-up profiles up to this many requests are planned with the full method (``best``) for
#: at most :data:`WARMUP_SEARCH` seconds, larger ones with the paper's best-fit: a warm-up
#: plan is made once per run, off the training loop, and a small iteration's best-fit
#: packing can hold far more than its lower bound (ResNet-50 inference at batch 32: 1.29x,
#: where ``best`` reaches the bound in 30 ms).
WARMUP_SEARCH_BLOCKS = 256
WARMUP_SEARCH = 0.05


#: A plan kept from the worker process that is best-fit's (``method="bestfit"``, or
#: background planning's first plan where the worker's had not landed) and above its lower
#: bound is searched with the full method for up to this many seconds before it is written:
#: a later run then starts on the better plan (serving's best-fit plan holds 1.23x its
#: bound).  It costs the training process nothing; a plan the worker is asked for meanwhile
#: waits for it (one second at most).
CACHE_SEARCH = 1.0


def searched_plan(plan: Plan, seconds: float = CACHE_SEARCH) -> Plan:
    """``plan``, or the full method's plan of the same profile where it holds less (see
    :data:`CACHE_SEARCH`)."""
    arena = plan.trace
    if plan.method != "bestfit" or plan.peak <= arena.lower_bound():
        return plan
    searched = solve(arena, SolverOptions(method="best", time_limit=seconds, seed=0))
    return searched if searched.peak < plan.peak else plan


def warmup_plan(opening: Trace) -> Plan:
    """A warm-up iteration's plan (its long-lived blocks kept out: they are placed apart):
    never above best-fit's (the full method under so short a limit, on a loaded machine,
    may return its plan of last resort, one size per lane)."""
    closed = opening.without_open()
    plan = solve(closed, SolverOptions(method="bestfit"))
    if len(closed.blocks) <= WARMUP_SEARCH_BLOCKS and plan.peak > closed.lower_bound():
        searched = solve(closed, SolverOptions(method="best", time_limit=WARMUP_SEARCH, seed=0))
        if searched.peak < plan.peak:
            plan = searched
    return plan


def steady_plan_for(opening: Trace, plan: Plan) -> Plan | None:
    """The steady ``plan``'s offsets as a warm-up iteration's plan, where its requests are
    the steady profile's (same sizes, in the same order) and the offsets pack them validly
    (None otherwise): a warm-up is often the steady iteration once more (serving's first
    requests at one batch size), and the steady plan may be the full method's, found
    after the warm-up's own short search."""
    closed = opening.without_open()
    blocks = plan.trace.blocks
    if len(closed.blocks) != len(blocks) \
            or any(a.size != b.size for a, b in zip(closed.blocks, blocks)):
        return None
    if find_conflict(closed.blocks, plan.offsets) is not None:
        return None
    return Plan(closed, plan.offsets, method=f"{plan.method} (the steady plan's)",
                optimal=None)


def attach(engine: Any, device: DeviceKey) -> PlanCache:
    """Give ``engine`` (a :class:`~pgmo.engine.Engine`) the cache of ``device`` as its
    hints (:mod:`pgmo.engine.hinted`); the caller stores each installed plan with
    :meth:`PlanCache.keep`."""
    cache = PlanCache(device)
    if len(cache):
        engine.hints = cache.find
    return cache


class Entry(NamedTuple):
    """One entry as ``pgmo cache`` lists it; ``error`` says why it cannot be used."""

    path: Path
    bytes: int
    age: float  # seconds since it was written
    device: str
    first_sizes: tuple[int, ...]
    peak: int
    warmup_plans: int
    error: str


def entries(folder: Path | None = None) -> list[Entry]:
    """Every entry in the cache (all devices), newest first; damaged ones say why."""
    root = folder if folder is not None else cache_dir()
    found: list[Entry] = []
    now = time.time()
    for path in sorted(root.glob(f"*/*{_SUFFIX}")):
        if path.name.startswith("."):
            continue
        try:
            stat = path.stat()
            data = read_bytes(path)
        except (OSError, TraceFormatError):
            continue
        age = max(0.0, now - stat.st_mtime)
        try:
            cached = loads(data, str(path))
        except PlanFileError as e:
            found.append(Entry(path, stat.st_size, age, "?", (), 0, 0, str(e)))
            continue
        d = cached.device
        summary = DeviceKey(str(d.get("device")), int(d.get("memory") or 0),
                            d.get("cupy")).summary()
        found.append(Entry(path, stat.st_size, age, summary, cached.first_sizes,
                           cached.plan.peak, len(cached.warmup), ""))
    return sorted(found, key=lambda e: e.age)


def clear(folder: Path | None = None) -> int:
    """Remove every entry (and what a writer left half-made); the number of entries removed."""
    root = folder if folder is not None else cache_dir()
    removed = 0
    for path in root.glob("*/*"):
        if path.is_file() and (path.name.endswith(_SUFFIX) or path.name.startswith(".")):
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            removed += not path.name.startswith(".")
    for sub in root.glob("*"):
        if sub.is_dir():
            try:
                sub.rmdir()
            except OSError:
                pass  # not empty: files of another kind, left alone
    return removed
