"""The DSA instances ``bench_solver`` solves: instance files, their best known peaks, random traces.

The public instances are kept in the repository, in ``tests/data/dsa-benchmarks``
(``PROVENANCE.md`` there says where each comes from).  Best known peaks come
from CSVs (``instance,peak``; the bundled ``scripts/best_known_peaks.csv`` and
any given) and from MiniMalloc-style ``solutions/NAME.peakN.csv`` files next
to the instances; the lowest of them counts.  Random traces have fixed seeds,
so rows are comparable between runs and machines.
"""

from __future__ import annotations

import csv
import random
import re
from pathlib import Path

import pgmo
from pgmo import programs

BUNDLED_BEST_KNOWN = Path(__file__).with_name("best_known_peaks.csv")
#: The public DSA instances kept in the repository (licenses and provenance beside them).
PUBLIC_INSTANCES = Path(__file__).resolve().parents[1] / "tests" / "data" / "dsa-benchmarks"
SOLUTION_NAME = re.compile(r"^(?P<stem>.+)\.peak(?P<peak>\d+)\.csv$")

#: Random lifetimes: ``short`` (many small, local problems: the common real-trace shape)
#: and ``long`` (most blocks live long and overlap; the hard case for the fit query).
DISTRIBUTIONS = ("short", "long")
MAX_SHORT_LIFETIME = 50
MAX_SIZE = 1024


def find_instances(inputs: list[str]) -> list[Path]:
    """CSV files given or found under the given folders, skipping ``solutions/``."""
    found = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            for csv_path in sorted(path.rglob("*.csv")):
                if "solutions" not in csv_path.relative_to(path).parts[:-1]:
                    found.append(csv_path)
        elif path.is_file():
            found.append(path)
        else:
            raise SystemExit(f"bench_solver: no such file or folder: {item}")
    return found


def read_best_known(paths: list[Path]) -> dict[str, int]:
    """``instance -> peak`` from CSVs with columns ``instance,peak``."""
    known: dict[str, int] = {}
    for path in paths:
        try:
            with open(path, newline="", encoding="utf-8") as f:
                rows = csv.DictReader(f)
                if not {"instance", "peak"} <= set(rows.fieldnames or ()):
                    raise programs.UsageError(f"{path}: not a best-known file (needs a "
                                              f"header 'instance,peak')")
                for row in rows:
                    name, peak = (row.get("instance") or "").strip(), row.get("peak")
                    try:
                        value = int(peak or "")
                    except ValueError:
                        value = 0
                    if not name or value < 1:
                        raise programs.UsageError(f"{path}, line {rows.line_num}: expected "
                                                  f"an instance and a positive peak, got "
                                                  f"{name!r},{peak!r}")
                    known[name.removesuffix(".csv")] = value
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise programs.UsageError(f"{path}: cannot be read as a best-known CSV "
                                      f"({exc})") from None
    return known


def solution_peaks(instance: Path) -> dict[str, int]:
    """Peaks named by ``solutions/*.peakN.csv`` beside the instance (or its folder)."""
    peaks = {}
    for folder in (instance.parent / "solutions", instance.parent.parent / "solutions"):
        if folder.is_dir():
            for sol in folder.glob("*.peak*.csv"):
                m = SOLUTION_NAME.match(sol.name)
                if m:
                    peaks[m["stem"]] = int(m["peak"])
    return peaks


def best_known_for(instance: Path, known: dict[str, int]) -> int | None:
    """The lowest peak known: from a ``solutions/`` file name or a best-known CSV."""
    stem = instance.name.removesuffix(".csv")
    peaks = [solution_peaks(instance).get(stem)]
    key_path = instance.as_posix().removesuffix(".csv")
    matches = [k for k in known if key_path == k or key_path.endswith("/" + k)]
    if matches:
        peaks.append(known[max(matches, key=len)])
    peaks = [p for p in peaks if p is not None]
    return min(peaks) if peaks else None


def random_trace(n: int, dist: str, seed: int) -> tuple[list[int], list[int], list[int]]:
    """``(lowers, uppers, sizes)`` of ``n`` random blocks over a horizon of 2n ticks.

    ``short``: lifetime uniform in 1..50, lower uniform in [0, 2n - lifetime].
    ``long``: two distinct ticks uniform in [0, 2n]; the smaller is lower.
    Sizes are uniform in 1..1024.
    """
    rng = random.Random(seed)
    horizon = 2 * n
    lowers, uppers, sizes = [], [], []
    for _ in range(n):
        if dist == "short":
            life = rng.randint(1, MAX_SHORT_LIFETIME)
            lo = rng.randint(0, max(0, horizon - life))
            up = lo + life
        elif dist == "long":
            a, b = rng.randint(0, horizon), rng.randint(0, horizon)
            while a == b:
                b = rng.randint(0, horizon)
            lo, up = min(a, b), max(a, b)
        else:
            raise ValueError(f"unknown distribution {dist!r}")
        lowers.append(lo)
        uppers.append(up)
        sizes.append(rng.randint(1, MAX_SIZE))
    return lowers, uppers, sizes


def random_traces(n: int) -> list[tuple[str, pgmo.Trace]]:
    """Two random traces of ``n`` blocks for the solver table: ``long`` and ``short``."""
    return [(f"random-{dist}-{n}", pgmo.Trace.from_columns(*random_trace(n, dist, n + k)))
            for k, dist in enumerate(("long", "short"))]
