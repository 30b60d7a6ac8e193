"""Fit the host model's device parameters to a quick GPU check, and write them where the model reads them.

::

    python -m scripts.fit_host_model quick-check/quick-check.json   # updates pgmo/device/params.py
    python -m scripts.fit_host_model quick-check.json --check       # says what would change

**One source of truth**: the parameters live in ``pgmo/device/params.py``, a
module this script writes whole (``PARAMS``, and ``SOURCE``: where they come
from) and nobody edits by hand.  The host model's page and its
stream-ordered pool's chunk (``pgmo.device.host_memory.DRIVER_PAGE`` and
``pgmo.device.host_async_pool.DRIVER_POOL_CHUNK``) are ``PARAMS["page"]``
and ``PARAMS["pool_chunk"]`` (a test holds them equal), so a GPU run
updates the model in one command, and ``git diff pgmo/device/params.py``
shows what the device changed.

What is fitted, from the quick check's steps (``python -m scripts.gpu_quick_check``):

* ``page``: the driver's page and mapping granule, from
  ``cuMemGetAllocationGranularity`` (step ``costs``), checked against the
  growth of the device's used bytes after each held cudaMalloc (step
  ``driver-pool``: the greatest common divisor of the growths);
* ``pool_chunk``: the step the stream-ordered pool grows in: the greatest
  common divisor of ``ReservedMemCurrent`` after one request of 512 B,
  1 MiB, 3 MiB and 40 MiB, each on a fresh pool;
* ``pool_trim_step``: what a trim keeps reserved per growth that still
  holds a live block (step ``driver-pool``, one live block per growth):
  ``pool_chunk`` when trims release whole growth steps only, as the model
  assumes (the model has one step for both: a smaller one is reported, for
  the model to be changed);
* ``call_us``: per call (``cudaMalloc``, ``cudaFree``, the pool's and the
  virtual-memory calls) a line ``fixed + per_gib x size`` through its idle
  times (least squares over the sizes measured; where that line is not a cost,
  a negative fixed part or slope, the cheapest call as a fixed cost), and whether it waits for
  kernels queued on its stream (``waits``) or on another one
  (``waits_other``).

A parameter the file does not measure keeps its value, and the script says
so.  A dry run's file (stand-ins, not a GPU) is refused unless ``--out``
names another file than the package's.  Exit status: 0 written (or, with
``--check``, nothing would change), 1 with ``--check`` when something would
change, 2 for a file that is missing or not a quick check's.
"""

from __future__ import annotations

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130

import ast  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pprint  # noqa: E402
import sys  # noqa: E402
from functools import reduce  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PARAMS_FILE = ROOT / "pgmo" / "device" / "params.py"
GiB = 2**30
HEADER = '''"""The host model's device parameters, fitted to a GPU: generated, do not edit.

Written whole by ``python -m scripts.fit_host_model quick-check.json`` (the
quick GPU check's results).  ``page`` and ``pool_chunk`` are the host
model's ``pgmo.device.host_memory.DRIVER_PAGE`` and
``pgmo.device.host_async_pool.DRIVER_POOL_CHUNK``;
``pool_trim_step`` is what a trim keeps per live block of the driver's pool,
``call_us`` each call's cost (microseconds: ``fixed + per_gib x size``) and
whether it waits for queued kernels.  ``SOURCE`` says where the values come
from.
"""

from typing import Any

'''


class FitError(ValueError):
    """The file cannot be fitted (missing, not JSON, not a quick check's results)."""


# ------------------------------------------------------------------ reading
def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FitError(f"{path}: no such file (the quick check writes quick-check.json "
                       "into its --out folder)") from None
    except IsADirectoryError:
        raise FitError(f"{path} is a folder: give the quick-check.json in it (the quick "
                       "check writes it into its --out folder)") from None
    except json.JSONDecodeError as error:
        raise FitError(f"{path}: not JSON (line {error.lineno}: {error.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise FitError(f"{path}: no \"results\" field: not the quick-check.json of "
                       "python -m scripts.gpu_quick_check")
    return data


def current(path: Path = PARAMS_FILE) -> tuple[dict, dict]:
    """(PARAMS, SOURCE) as the parameters file has them (read, not imported)."""
    tree = ast.parse(path.read_text())
    values = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.value is not None:
            values[node.target.id] = ast.literal_eval(node.value)
    return values["PARAMS"], values["SOURCE"]


# ------------------------------------------------------------------ fitting
def _gcd(values) -> int:
    values = [int(v) for v in values if v]
    return reduce(math.gcd, values) if values else 0


def fit_page(results: dict, notes: list[str]) -> int | None:
    granule = ((results.get("costs") or {}).get("info") or {}).get("granularity")
    grew = _gcd(row["used_grew"] for row in (results.get("driver-pool") or {})
                .get("cudaMalloc") or [])
    if granule and grew and grew % granule and granule % grew:
        notes.append(f"page: cudaMalloc's memory grew in steps of {grew:,} B, not whole "
                     f"granules of {granule:,} B")
    if granule:
        return int(granule)
    if grew:
        notes.append("page: no granularity measured (no cuda-bindings?); taken from "
                     "cudaMalloc's growth")
        return grew
    notes.append("page: not measured (steps costs and driver-pool missing); kept")
    return None


def fit_pool(results: dict, page: int | None, notes: list[str]) -> tuple[int | None, int | None]:
    pool = results.get("driver-pool") or {}
    chunk = _gcd(row["reserved"] for row in pool.get("fresh") or [])
    if not chunk:
        notes.append("pool_chunk: not measured (step driver-pool missing or failed); kept")
        return None, None
    if page and chunk % page:
        notes.append(f"pool_chunk: {chunk:,} B is not whole pages of {page:,} B")
    growth = pool.get("one_live_per_growth")
    if not growth or not growth.get("kept"):
        notes.append("pool_trim_step: not measured; kept")
        return chunk, None
    step = growth["reserved_after_trim"] // growth["kept"]
    if page:
        step = -(-step // page) * page
    if step < chunk:
        notes.append(f"pool_trim_step: a trim keeps {step:,} B per live block, less than "
                     f"the {chunk:,} B the pool grows by; the host model's HostAsyncPool has "
                     "one step for both (its chunk): it is now pessimistic about trims")
    return chunk, step


def fit_calls(results: dict, notes: list[str]) -> dict | None:
    costs = results.get("costs") or {}
    by_op: dict[str, list] = {}
    for row in costs.get("rows", []):
        if "idle_us" in row:
            by_op.setdefault(row["op"], []).append(row)
    if not by_op:
        notes.append("call_us: not measured (step costs missing); kept")
        return None
    out = {}
    for op, rows in by_op.items():
        sizes = np.array([r["size"] for r in rows], float) / GiB
        times = np.array([r["idle_us"] for r in rows], float)
        if len(set(sizes)) > 1:
            per_gib, fixed = np.polyfit(sizes, times, 1)
        else:
            per_gib, fixed = 0.0, float(times.mean())
        if fixed <= 0 or per_gib < 0:
            # Not a cost (a call preempted by the machine bends the line): the cheapest
            # call, the least disturbed, as a cost that does not grow with the size.
            notes.append(f"call_us: {op}: the line through its times is not a cost (fixed "
                         f"{fixed:.1f} us, {per_gib:.1f} us per GiB): its cheapest call kept")
            per_gib, fixed = 0.0, float(times.min())
        entry = {"fixed": round(float(fixed), 2), "per_gib": round(float(per_gib), 2),
                 "sizes": len(rows)}
        for key, name in (("waited", "waits"), ("other_waited", "waits_other")):
            marks = [r[key] for r in rows if key in r]
            if marks:
                entry[name] = sum(marks) * 2 > len(marks)
        out[op] = entry
    return out


def fit(data: dict, old: dict) -> tuple[dict, list[str]]:
    """New parameters (``old`` where the file measured nothing) and notes for a person."""
    results = data["results"]
    notes: list[str] = []
    page = fit_page(results, notes)
    chunk, trim = fit_pool(results, page or old.get("page"), notes)
    calls = fit_calls(results, notes)
    new = dict(old)
    for key, value in (("page", page), ("pool_chunk", chunk), ("pool_trim_step", trim),
                       ("call_us", calls)):
        if value is not None:
            new[key] = value
    return new, notes


def source_of(data: dict, path: Path) -> dict:
    env = data.get("environment") or {}
    return {"kind": "dry run (stand-ins)" if data.get("dry_run") else "measured",
            "file": path.name, "command": data.get("command", "?"),
            "date": data.get("date", "?"), "device": env.get("device", "?"),
            "versions": {k: v for k, v in env.items() if k not in ("device", "device memory")}}


# ------------------------------------------------------------------ writing
def render(params: dict, source: dict) -> str:
    return (HEADER + "PARAMS: dict[str, Any] = " + pprint.pformat(params, width=75)
            + "\n\nSOURCE: dict[str, Any] = " + pprint.pformat(source, width=75) + "\n")


def changes(old: dict, new: dict) -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            if key == "call_us":
                out.append(f"call_us: {len(new.get(key) or {})} calls fitted (were "
                           f"{len(old.get(key) or {})})")
            else:
                out.append(f"{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return out


def main(argv=None) -> int:
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="the quick check's quick-check.json")
    parser.add_argument("--out", "-o", type=Path, default=PARAMS_FILE,
                        help="the parameters file to write")
    parser.add_argument("--check", action="store_true",
                        help="write nothing: say what would change (exit 1 if anything)")
    args = parser.parse_args(argv)
    try:
        data = load(args.results)
        if data.get("dry_run") and args.out.resolve() == PARAMS_FILE.resolve() \
                and not args.check:
            raise FitError(f"{args.results}: a dry run's numbers are the stand-ins', not a "
                           "GPU's: give --out another file")
        old, _ = current(args.out if args.out.exists() else PARAMS_FILE)
        new, notes = fit(data, old)
    except OSError as error:
        raise FitError(str(error)) from error
    for note in notes:
        print(f"note: {note}")
    diff = changes(old, new)
    print("\n".join(diff) if diff else "no parameter changed")
    if args.check:
        return 1 if diff else 0
    args.out.write_text(render(new, source_of(data, args.results)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(programs.run(main, errors=(FitError,)))
