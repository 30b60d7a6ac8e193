"""The quick GPU check: what pgmo's device layer and its host model assume, settled in one command.

Run it first on a machine with a GPU.  It needs CuPy, ``cuda-bindings`` of
CuPy's CUDA major (and ``cuda-pathfinder``) and ``nvidia-ml-py``; for a GPU
machine without network access ``scripts/fetch_gpu_wheels.sh`` (``--cuda 13``
or ``12``) puts their wheels into ``.whl/`` on a machine with it, and
``scripts/gpu_session.sh`` installs them, or by hand::

    pip install --no-index --no-deps .whl/cuda_bindings-*.whl .whl/cuda_pathfinder-*.whl \
        .whl/nvidia_ml_py-*.whl
    python -m scripts.gpu_quick_check --device 0 --out quick-check   # under 8 min on an H100
    python -m scripts.gpu_quick_check --dry-run --out /tmp/qc        # the CPU, stand-ins, seconds

Each step runs in a process of its own, under its own time limit and what is
left of ``--budget`` (450 s by default: with the start and the report, under
8 minutes on an H100), and ``quick-check.json`` (every raw result) and
``quick-check.md`` (the report) are written after every step, so that a cut
keeps what was measured:

1. ``device``: the driver's and CUDA's versions (``cuDriverGetVersion``,
   ``runtimeGetVersion``, cuda-bindings, NVML), what
   :func:`pgmo.device.cuda.device_layer` probes, and what a pgmo pool chose
   after a short run (``stats()``: ``arena_kind``, ``heap_kind``,
   ``device_reasons``);
2. ``driver-pool``: the driver's stream-ordered pool's
   ``ReservedMemCurrent`` after 512 B, 1 MiB, 3 MiB and 40 MiB requests and
   after a trim with one live block per growth, and the pages cudaMalloc
   takes (:mod:`scripts.driver_pool_probe`);
3. ``costs``: cudaMalloc/cudaFree, a stream-ordered pool's calls and the
   virtual-memory calls (create, map, set access, unmap, release; set access
   and unmap once over a run of one-page mappings, as the page heap makes
   them), idle and behind kernels queued on their stream or another
   (:mod:`scripts.allocator_costs`);
4. ``replay-*``: one repeating workload (a real H100 trace made into a run)
   and one variable one (an LSTM with random lengths) replayed on the device
   through CuPy's pool and through pgmo, every block pattern-checked at its
   free, the memory each took measured the same way from outside the pool
   (NVML's count for the process and ``cudaMemGetInfo``, peak over the run);
5. ``second-stream``, ``per-thread-stream`` (a child with
   ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``), ``set-limit`` and ``teardown``
   (the pool dropped while kernels still read its memory, then a device sync
   and ``cudaGetLastError``): :mod:`scripts.quick_check_steps`.

It prints the report (a verdict table first, :mod:`scripts.quick_check_report`)
and ends with one verdict line.  **The exit status is 1 when any check
failed**: a part of the device layer fell back to cudaMalloc (no
cuda-bindings, a driver that refused the probe), a corrupted byte, a device
error, a broken promise of the pool, NVML unread, or a step that did not
finish; 130 after Ctrl-C (143 after SIGTERM), with what was measured
written.  ``python -m scripts.fit_host_model quick-check/quick-check.json``
then updates the host model's parameters; ``python -m scripts.results_table``
brings the report into ``docs/results.md``.  ``--dry-run`` runs every step
on the CPU with the stand-ins of :mod:`scripts.gpu_stand_ins` (host memory
under pgmo's real device layer) and small workloads: every number is
labelled a stand-in's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pgmo import programs

from . import children, needs_gpu, quick_check_report

JSON_NAME, REPORT_NAME = "quick-check.json", "quick-check.md"
KiB, MiB, GiB = 2**10, 2**20, 2**30

log = logging.getLogger("gpu_quick_check")


@dataclass(frozen=True)
class Step:
    """One step: a check of :mod:`scripts.quick_check_steps` in a child process."""

    key: str  # its name in quick-check.json's results
    name: str
    check: str
    limit_s: float  # on the GPU
    gpu: dict = field(default_factory=dict)  # its options on the GPU
    dry: dict = field(default_factory=dict)  # and in the dry run
    env: dict = field(default_factory=dict)  # the child's environment

    def options(self, dry_run: bool, device: int) -> dict:
        return {"check": self.check, "dry_run": dry_run, "device": device,
                **(self.dry if dry_run else self.gpu)}


def _replays() -> tuple[Step, ...]:
    out = []
    for workload, gpu, dry, limit in (
            ("repeating", {"iterations": 10}, {"iterations": 4}, 45),
            ("variable", {"iterations": 12, "scale": 1.0},
             {"iterations": 6, "scale": 0.05}, 75)):
        for pool in quick_check_report.POOLS:
            options = {"workload": workload, "pool": pool}
            out.append(Step(quick_check_report.replay_key(workload, pool),
                            f"replay, {workload} workload, {pool}", "replay", limit,
                            {**gpu, **options}, {**dry, **options}))
    return tuple(out)


STEPS = (
    Step("device", "device layer and versions", "device", 60, {"iterations": 4},
         {"iterations": 3}),
    Step("driver-pool", "the driver's stream-ordered pool", "driver-pool", 45),
    Step("costs", "allocation calls' costs", "costs", 90,
         {"sizes": [512, 64 * KiB, 2 * MiB, 20 * MiB, 256 * MiB, 4 * GiB], "repeats": 5,
          "behind_ms": 5.0, "seconds": 75.0},
         {"sizes": [512, 2 * MiB, 20 * MiB], "repeats": 2, "behind_ms": 2.0, "seconds": 20.0}),
    *_replays(),
    Step("second-stream", "a second stream", "second-stream", 45,
         {"iterations": 6, "touch_ms": 0.5}, {"iterations": 4, "touch_ms": 0.2}),
    Step("per-thread-stream", "a per-thread default stream", "per-thread-stream", 45,
         {"iterations": 6, "touch_ms": 1.0}, {"iterations": 4, "touch_ms": 1.0},
         {"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1"}),
    Step("set-limit", "set_limit", "set-limit", 75, {"iterations": 6}, {"iterations": 3}),
    Step("teardown", "teardown", "teardown", 45, {"iterations": 4, "touch_ms": 0.5},
         {"iterations": 3, "touch_ms": 0.5}),
)
#: A dry-run step's limit (a loaded CI machine, not a GPU).
DRY_LIMIT_S = 90.0
#: A step is not started with less than this many seconds left for it.
MIN_STEP_S = 10.0


# ------------------------------------------------------------------ a step, in its child
def run_child(options: dict) -> dict:
    """One step in this (fresh) process, on the GPU or its stand-ins."""
    from . import quick_check_steps

    if options["dry_run"]:
        from . import gpu_stand_ins

        gpu = gpu_stand_ins.modules()
    else:
        from . import gpu_modules

        gpu = gpu_modules.real_modules(options["device"])
    return quick_check_steps.CHECKS[options["check"]](gpu, options)


# ------------------------------------------------------------------ the run
class Stopped(Exception):
    """SIGTERM (a session's time limit): stop, keeping what was measured."""


@dataclass
class Check:
    """The run: its steps' statuses and results, written out after each step."""

    args: argparse.Namespace
    command: str
    started: float = field(default_factory=time.monotonic)
    data: dict = field(default_factory=dict)

    def __post_init__(self):
        self.data = {"command": self.command, "dry_run": self.args.dry_run,
                     "date": datetime.datetime.now(datetime.timezone.utc)
                     .strftime("%Y-%m-%d %H:%M UTC"),
                     "budget_s": self.args.budget, "environment": {}, "steps": [],
                     "results": {}}

    def remaining(self) -> float:
        return self.args.budget - (time.monotonic() - self.started)

    def step(self, name: str, limit_s: float, command: list[str],
             env: dict | None = None) -> dict | None:
        """Run one child (a command line) under its limit (and what is left of the budget);
        its result or None."""
        limit = min(limit_s, self.remaining() - 5)
        # a status from the start: a Ctrl-C may come before the step's child does
        status = {"name": name, "limit_s": max(limit, 0.0), "seconds": 0.0,
                  "status": "stopped before it started"}
        self.data["steps"].append(status)
        if limit < MIN_STEP_S:
            status["status"] = "not started: time budget used up"
            log.warning("%s: not started, %.0f s of the budget left", name, self.remaining())
            return None
        log.info("%s: started (limit %.0f s)", name, limit)
        start = time.monotonic()
        environment = children.environment(PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1",
                                           **(env or {}))
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=limit, env=environment)
        except subprocess.TimeoutExpired:
            status.update(status=f"timed out after {limit:.0f} s",
                          seconds=time.monotonic() - start)
            log.warning("%s: timed out after %.0f s", name, limit)
            return None
        except (KeyboardInterrupt, Stopped) as why:  # the child is gone too
            status.update(status=f"stopped ({str(why) or 'Ctrl-C'})",
                          seconds=time.monotonic() - start)
            raise
        status["seconds"] = time.monotonic() - start
        result = children.result_of(done.stdout)
        if result is not None:
            status["status"] = "done"
            log.info("%s: done in %.1f s", name, status["seconds"])
            return result
        status["status"] = f"failed (exit {done.returncode})"
        status["error"] = (done.stdout + done.stderr)[-1500:]
        log.warning("%s failed (exit %s):\n%s", name, done.returncode, status["error"])
        return None

    def run(self, step: Step) -> None:
        options = step.options(self.args.dry_run, self.args.device)
        limit = min(step.limit_s, DRY_LIMIT_S) if self.args.dry_run else step.limit_s
        result = self.step(step.name, limit,
                           children.command("gpu_quick_check", "--child", json.dumps(options)),
                           step.env)
        self.data["steps"][-1]["key"] = step.key
        if result is not None:
            self.data["results"][step.key] = result
            if step.key == "device":
                self.data["environment"] = result.get("versions", {})

    def write(self) -> str:
        text = quick_check_report.render(self.data)
        out = self.args.out
        out.mkdir(parents=True, exist_ok=True)
        (out / JSON_NAME).write_text(json.dumps(self.data, indent=1) + "\n")
        (out / REPORT_NAME).write_text(text + "\n")
        return text


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child is not None:
        try:
            children.print_result(run_child(json.loads(args.child)))
        except KeyboardInterrupt:
            print("gpu_quick_check: stopped (Ctrl-C)", file=sys.stderr)
            return 130
        return 0
    if not args.dry_run:  # every step would fail alike, each with the driver's traceback
        try:
            needs_gpu.require_gpu(args.device, instead="--dry-run runs it on the CPU with "
                                                      "stand-ins")
        except programs.UsageError as error:  # one line, as programs.run says it
            print(f"{programs.program_name()}: error: {error}", file=sys.stderr)
            return 2
    try:  # here, not once the first step has run: the report goes there
        args.out.mkdir(parents=True, exist_ok=True)
        if not os.access(args.out, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as error:
        print(f"{programs.program_name()}: error: argument --out/-o: {args.out}: "
              f"{error.strerror or error}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    check = Check(args, shlex.join(["python", "-m", "scripts.gpu_quick_check", *argv]))

    def stop(signum, frame):
        raise Stopped(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    status = None
    try:
        for step in STEPS:
            check.run(step)
            check.write()
    except (KeyboardInterrupt, Stopped) as why:
        status = 130 if isinstance(why, KeyboardInterrupt) else 143
        check.data["steps"].append({"name": "the steps after it", "limit_s": 0.0,
                                    "seconds": 0.0, "status": f"not run: stopped "
                                                              f"({str(why) or 'Ctrl-C'})"})
    text = check.write()
    print(text, flush=True)
    log.info("total %.0f s of a %.0f s budget; wrote %s and %s in %s",
             time.monotonic() - check.started, args.budget, JSON_NAME, REPORT_NAME, args.out)
    passed, line = quick_check_report.verdict(check.data)
    print(line, flush=True)
    if status is not None:
        print(f"gpu_quick_check: stopped ({'Ctrl-C' if status == 130 else 'SIGTERM'}); "
              f"what was measured is in {args.out / JSON_NAME}", file=sys.stderr)
        return status
    return 0 if passed else 1


def parse_args(argv=None):
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", "-d", type=int, default=0, help="the GPU to check")
    parser.add_argument("--out", "-o", type=Path, default=Path("quick-check"),
                        help=f"folder for {JSON_NAME} and {REPORT_NAME}")
    parser.add_argument("--budget", type=programs.non_negative_float, default=450.0,
                        help="seconds for every step together (each also has its own limit)")
    parser.add_argument("--dry-run", action="store_true",
                        help="run on the CPU with stand-ins for the GPU's modules")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget <= 0:
        parser.error(f"--budget must be positive, got {args.budget}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"argument --out/-o: {args.out} is a file, not a folder")
    if args.device < 0:
        parser.error(f"--device must be a GPU's number (0, 1, ...), got {args.device}; "
                     "--dry-run runs on the CPU")
    return args


if __name__ == "__main__":
    sys.exit(main())
