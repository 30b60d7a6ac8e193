"""The workloads ``scripts.bench_footprint`` measures: whole runs, each with its physical limit.

* *repeating*: the real traces recorded on the H100 on 2026-11-25, each made
  into a run (weights, momentum and gradients from its own sizes), and the
  ResNet-50 run recorded on the CPU;
* *variable*: the family of :mod:`pgmo.workloads`;
* *small* (:data:`SMALL`): members of that family at sizes whose limit is
  under 64 MiB, where a pool's rounding (2 MiB pages, an arena's granules, a
  heap's pages) weighs most: one repeating, two variable.

Kept apart from the bench's measuring and reporting so that each stays short;
tested through the bench in ``tests/test_footprint_bench.py`` and
``tests/test_politeness.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pgmo
from pgmo import bundled, programs, workloads
from pgmo.runs import Run, read_run, run_from_iteration

ROOT = Path(__file__).resolve().parent.parent
RECORDED_RUNS = ROOT / "pgmo" / "traces" / "runs"

#: Small workloads (limit under 64 MiB): name -> (family member, its keywords, variable).
#: Every request's size scaled (``scale``) or a small model: ResNet-50 inference at batch
#: 1 (16.4 MiB; the size of an AlexNet-like inference at batch 1), the same serving
#: batches of 1, 2 and 4 (14.3 MiB), and an encoder-decoder LSTM 2x128 with random
#: lengths (48.2 MiB).
SMALL: dict[str, tuple[str, dict[str, Any], bool]] = {
    "small-cnn-infer-b1": ("serving", {"iterations": 30, "batches": (1,), "scale": 0.15},
                           False),
    "small-cnn-infer-batches": ("serving", {"iterations": 60, "batches": (1, 2, 4),
                                            "scale": 0.1}, True),
    "small-lstm": ("lstm-random", {"batch": 16, "units": 128, "layers": 2, "vocab": 2000},
                   True),
}

#: A workload is small when its limit is under this: its smallest device is searched in whole
#: pages (:data:`PAGE`, the device's) and must be at most its limit in pages plus one page.
SMALL_LIMIT = 64 << 20
PAGE = 2 << 20


def small_goal(limit: int) -> int:
    """The smallest device a workload of ``limit`` bytes (under :data:`SMALL_LIMIT`) may
    need: its limit rounded up to whole pages, and one page more."""
    return -(-limit // PAGE) * PAGE + PAGE


def search(limit: int) -> dict:
    """How the smallest device is searched for a workload of ``limit`` bytes: in whole
    pages (exactly) under :data:`SMALL_LIMIT`, where one page is a large share, else
    within 1%."""
    return {"tolerance": 0.0, "unit": PAGE} if limit < SMALL_LIMIT else {"tolerance": 0.01}


@dataclass
class Workload:
    name: str
    run: Run
    how: str
    variable: bool

    @property
    def limits(self) -> tuple[int, int]:
        """(the physical limit as the targets define it, the strict bound)."""
        bounds = self.run.bounds()
        strict = bounds.physical
        return max(bounds.largest + bounds.long_lived, strict), strict


# ------------------------------------------------------------------ workloads
def _model_weights(arch: str) -> list[int]:
    """A model's parameter sizes, from examples/models after one step's heads (Chainer's
    lazy layers make their weights in the first forward pass)."""
    import numpy as np

    import pgmo.chainer  # noqa: F401,I001  (the compatibility layer first)

    from .examples import load

    ARCHS = load("models").ARCHS  # noqa: N806

    model = ARCHS[arch](n_classes=1000)
    model.heads(np.zeros((1, 3, model.insize, model.insize), np.float32))
    return [p.array.nbytes for p in model.params()]


def real_traces(folder: Path | None) -> dict[str, pgmo.Trace]:
    """The bundled traces recorded on the H100, or those in ``folder``, by name."""
    if folder is None:
        return {name: bundled.load(name) for name in bundled.names()
                if bundled.is_real(bundled.load(name).metadata)}
    traces = {p.name.split(".json")[0]: pgmo.read_trace(p)
              for p in sorted(folder.glob("*.json.gz"))}
    if not traces:
        raise programs.UsageError(f"--traces {folder}: no traces (*.json.gz) there")
    return traces


def trace_runs(folder: Path | None, iterations: int,
               wanted=lambda name: True) -> list[tuple[str, Run, str]]:
    """(name, run, how) for each real trace (:func:`real_traces`) that is ``wanted``:
    weights and state from its own gradients."""
    traces = real_traces(folder)
    out = []
    for name, trace in traces.items():
        if not wanted(name):
            continue
        meta = trace.metadata
        training = meta.get("kind") == "training"
        grads = [b.size for b in trace.blocks if b.upper is None]
        if training:
            weights, state = grads, grads  # MomentumSGD: one velocity per parameter
            how = "weights + momentum = its gradients' sizes"
        else:
            donor = next((t for n, t in traces.items()
                          if t.metadata.get("model") == meta.get("model")
                          and t.metadata.get("kind") == "training"), None)
            if donor is not None:
                weights = [b.size for b in donor.blocks if b.upper is None]
                how = "weights from the same model's training trace"
            else:
                try:
                    weights = _model_weights(str(meta.get("model")))
                    how = "weights from examples/models"
                except Exception as e:  # Chainer missing: say so, run without weights
                    weights, how = [], f"no weights ({type(e).__name__})"
            state = []
        run = run_from_iteration(trace, iterations, setup=weights, state=state,
                                 recorded=str(meta.get("device", "?")))
        out.append((name, run, how))
    return out


def all_workloads(args) -> list[Workload]:
    """The workloads whose name has one of ``--only`` (each checked against every name
    before any run is made), else all."""
    resnet = RECORDED_RUNS / "resnet50-train-b32-cpu.run.json.gz"
    names = [*real_traces(args.traces), *(["resnet50-train-b32-cpu"] if resnet.exists() else []),
             *workloads.names(), *SMALL]
    for o in args.only:
        if not any(o in name for name in names):
            raise programs.unknown_name("workload matching", o, names)

    def wanted(name: str) -> bool:
        return not args.only or any(o in name for o in args.only)

    out = [Workload(n, r, h, False)
           for n, r, h in trace_runs(args.traces, args.iterations, wanted)]
    if resnet.exists() and wanted("resnet50-train-b32-cpu"):
        out.append(Workload("resnet50-train-b32-cpu", read_run(resnet),
                            "recorded whole run (CPU, NumPy mirror)", False))
    for name in filter(wanted, workloads.names()):
        run = workloads.make(name)
        out.append(Workload(name, run, run.metadata.get("how", "recorded whole run"), True))
    for name in filter(wanted, SMALL):
        member, options, variable = SMALL[name]
        run = workloads.make(member, **options)
        scale = options.get("scale", 1.0)
        how = run.metadata.get("how", member) + (f", every size x{scale:g}" if scale != 1 else "")
        out.append(Workload(name, run, how, variable))
    return out
