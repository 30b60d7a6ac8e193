"""The quick GPU check: what pgmo's device layer must know, in one command under 8 minutes.

Run it first on a machine with a GPU::

    python -m scripts.gpu_quick_check --device 0 --out quick-check     # at most 7.5 min
    python -m scripts.gpu_quick_check --dry-run --out /tmp/qc          # the CPU, stand-ins

It measures

a. what ``cudaMalloc``/``cudaFree``, a private stream-ordered pool and CUDA
   virtual-memory granules cost at 512 B, 64 KiB, 2 MiB, 20 MiB, 256 MiB and
   4 GiB, idle and behind 5 ms of queued kernels, and which calls wait for
   the queue (:mod:`scripts.allocator_costs`);
b. the device memory each run takes, seen from outside the pool the same way
   for both pools (``cudaMemGetInfo`` sampled inside iterations and NVML,
   peak over the whole run less the baseline once the CUDA context exists),
   beside each pool's own count and the bytes in live blocks, for ResNet-50
   at batch 32 and 128 and seq2seq (30 variable-length batches), under pgmo
   and under CuPy's pool, each run a process of its own
   (``scripts.bench_memory``'s child, the same measurement);
c. the time of iterations 1-3 and of the steady state under both pools,

then prints a verdict table and the tables (:mod:`scripts.quick_check_report`)
and writes ``quick-check.json`` (every raw result) and ``quick-check.md``
(the report) into ``--out``, after every step, so that a cut keeps what was
measured; ``python -m scripts.results_table`` brings them into
``docs/results.md``.  Every step has its own time limit and the whole run
``--budget`` seconds (default 450: with the start and the report, under 8
minutes on an H100); a step that times out or fails is reported as such and
the next one starts.  ``--dry-run`` runs every step on the CPU with the
stand-ins of :mod:`scripts.gpu_stand_ins` for ``cupy.cuda.runtime``, NVML
and ``cuda.bindings.driver``, and tiny workloads: every number is labelled a
stand-in's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import children, quick_check_report

JSON_NAME, REPORT_NAME = "quick-check.json", "quick-check.md"

log = logging.getLogger("gpu_quick_check")


@dataclass
class Workload:
    """One workload of parts b and c: a ``scripts.bench_memory --child`` configuration."""

    name: str
    config: dict
    limit_s: float  # per pool


GPU_WORKLOADS = (
    Workload("resnet50 b32", {"workload": "cnn-train", "arch": "resnet50", "batch": 32,
                              "iterations": 8}, 60),
    Workload("resnet50 b128", {"workload": "cnn-train", "arch": "resnet50", "batch": 128,
                               "iterations": 8}, 80),
    Workload("seq2seq b64, 30 batches", {"workload": "seq2seq-train", "arch": None, "batch": 64,
                                         "iterations": 30}, 150),
)
#: The dry run's stand-ins: the same code path at sizes a CPU runs in seconds.
DRY_WORKLOADS = (
    Workload("alexnet b2 (dry run, for resnet50 b32)",
             {"workload": "cnn-train", "arch": "alexnet", "batch": 2, "insize": 39,
              "iterations": 4}, 120),
    Workload("alexnet b4 (dry run, for resnet50 b128)",
             {"workload": "cnn-train", "arch": "alexnet", "batch": 4, "insize": 39,
              "iterations": 4}, 120),
    Workload("seq2seq b4, 4 batches (dry run)",
             {"workload": "seq2seq-train", "arch": None, "batch": 4, "iterations": 4}, 120),
)
COSTS_LIMIT_S = 90.0
POOLS = ("stock", "pgmo")
#: A step is not started with less than this many seconds left for it.
MIN_STEP_S = 10.0


def base_config(args) -> dict:
    """What every run of parts b and c shares (``scripts.bench_memory``'s child configuration)."""
    if args.dry_run:
        return {"device": -1, "stand_ins": True, "skip": 3, "method": "best",
                "time_limit": 1.0, "classes": 10, "vocab": 50, "units": 16, "layers": 1,
                "sentences": 40, "limit": 0, "insize": None}
    return {"device": args.device, "skip": 3, "method": "best", "time_limit": 2.0,
            "classes": 1000, "vocab": 40000, "units": 512, "layers": 3, "sentences": 4000,
            "limit": 0, "insize": None}


# ------------------------------------------------------------------ part a, in a child
def costs_child(options: dict) -> dict:
    """Part a in this (fresh) process, with the environment it ran in."""
    from . import allocator_costs

    if options["dry_run"]:
        from . import gpu_stand_ins

        gpu = gpu_stand_ins.modules()
        env = {"device": gpu.name, "device memory": f"{gpu.device.total / 2**30:.0f} GiB",
               "CUDA runtime": gpu.runtime.runtimeGetVersion(), "cuda-bindings": "stand-in"}
    else:
        gpu = allocator_costs.real_gpu(options["device"])
        props = gpu.runtime.getDeviceProperties(options["device"])
        env = {"device": gpu.name, "device memory": f"{props['totalGlobalMem'] / 2**30:.1f} GiB",
               "CUDA runtime": gpu.runtime.runtimeGetVersion()}
        try:
            from importlib.metadata import version

            env["cuda-bindings"] = version("cuda-bindings")
        except Exception:  # noqa: BLE001 - not installed: part a says so
            env["cuda-bindings"] = "not installed"
    import pgmo

    env["pgmo"] = pgmo.__version__
    try:
        import cupy

        env["cupy"] = cupy.__version__
    except ImportError:
        env["cupy"] = "not installed"
    costs = allocator_costs.measure(gpu, seconds=options["seconds"])
    return {"environment": env, "costs": costs}


# ------------------------------------------------------------------ the steps
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
                     "costs": None, "runs": []}

    def remaining(self) -> float:
        return self.args.budget - (time.monotonic() - self.started)

    def step(self, name: str, limit_s: float, command: list[str]) -> dict | None:
        """Run one child (a command line) under its limit (and what is left of the budget); its
        result or None."""
        limit = min(limit_s, self.remaining() - 5)
        status = {"name": name, "limit_s": max(limit, 0.0), "seconds": 0.0}
        self.data["steps"].append(status)
        if limit < MIN_STEP_S:
            status["status"] = "not started: time budget used up"
            log.warning("%s: not started, %.0f s of the budget left", name, self.remaining())
            return None
        log.info("%s: started (limit %.0f s)", name, limit)
        start = time.monotonic()
        env = children.environment(PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=limit, env=env)
        except subprocess.TimeoutExpired:
            status.update(status=f"timed out after {limit:.0f} s",
                          seconds=time.monotonic() - start)
            log.warning("%s: timed out after %.0f s", name, limit)
            return None
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

    def costs(self) -> None:
        options = {"device": self.args.device, "dry_run": self.args.dry_run,
                   "seconds": COSTS_LIMIT_S - 15}
        result = self.step("a. allocation costs", COSTS_LIMIT_S,
                           children.command("gpu_quick_check", "--costs-child",
                                            json.dumps(options)))
        if result is not None:
            self.data["environment"] = result["environment"]
            self.data["costs"] = result["costs"]

    def run(self, workload: Workload, pool: str) -> None:
        cfg = {**base_config(self.args), **workload.config, "pool": pool}
        result = self.step(f"b/c. {workload.name} {pool}", workload.limit_s,
                           children.command("bench_memory", "--child", json.dumps(cfg)))
        last = self.data["steps"][-1]
        self.data["runs"].append({"workload": workload.name, "pool": pool, "config": cfg,
                                  "result": result if result is not None
                                  else {"skipped": last["status"]}})

    def write(self) -> str:
        text = quick_check_report.render(self.data)
        out = self.args.out
        out.mkdir(parents=True, exist_ok=True)
        (out / JSON_NAME).write_text(json.dumps(self.data, indent=1) + "\n")
        (out / REPORT_NAME).write_text(text + "\n")
        return text


def workloads(args) -> tuple[Workload, ...]:
    return DRY_WORKLOADS if args.dry_run else GPU_WORKLOADS


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.costs_child is not None:
        children.print_result(costs_child(json.loads(args.costs_child)))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    check = Check(args, shlex.join(["python", "-m", "scripts.gpu_quick_check", *argv]))

    def stop(signum, frame):  # a session's timeout: report what was measured
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        check.costs()
        check.write()
        for workload in workloads(args):
            for pool in POOLS:
                check.run(workload, pool)
                check.write()
    except KeyboardInterrupt as why:
        check.data["steps"].append({"name": "the rest", "status": f"stopped ({why})",
                                    "limit_s": 0.0, "seconds": 0.0})
    finally:
        text = check.write()
        print(text, flush=True)
        log.info("total %.0f s of a %.0f s budget; wrote %s and %s in %s",
                 time.monotonic() - check.started, args.budget, JSON_NAME, REPORT_NAME,
                 args.out)
    return 0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", "-d", type=int, default=0, help="the GPU to check")
    parser.add_argument("--out", "-o", type=Path, default=Path("quick-check"),
                        help=f"folder for {JSON_NAME} and {REPORT_NAME}")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds for every step together (each also has its own limit)")
    parser.add_argument("--dry-run", action="store_true",
                        help="run on the CPU with stand-ins for the GPU's modules")
    parser.add_argument("--costs-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget <= 0:
        parser.error(f"--budget must be positive, got {args.budget}")
    return args


if __name__ == "__main__":
    sys.exit(main())
