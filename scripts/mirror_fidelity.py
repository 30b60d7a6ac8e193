"""How close a CPU recording comes to a GPU's: the H100 traces of 2026-11-25, recorded again.

``scripts.record_runs`` records on the CPU what a GPU run would allocate;
this script checks that against what a GPU did allocate.  For each
calibration workload it records two updates on the CPU (the first a
warm-up, as ``scripts.record_traces`` did on the H100), cuts the second one out
the way the GPU trace was taken, and compares request count, lower bound and
largest blocks with the bundled H100 trace:

``profiled`` (AlexNet b32, pgmo's profiling mode on a fresh pool)
    the requests made in the iteration; frees after it are open; sizes
    rounded up to 512 bytes as the pool records them;
``stock`` (DenseNet-BC-100 k=12 b64 without and with recomputation,
``pgmo.TraceRecorder`` on CuPy's pool)
    also the blocks live when the iteration starts and freed in it (the
    previous update's gradients); exact sizes;
``planned`` (ResNet-50 and GoogLeNet b32: no trace was kept, only the lower
bound of pgmo's plan in ``bench_memory-results.md``, in MiB to 0.1)
    as ``profiled``, less the blocks that outlive the iteration (the
    gradients: pgmo keeps them in buffers of their own, outside the plan).

    python -m scripts.mirror_fidelity --out pgmo/traces/runs/fidelity.json
    python -m scripts.mirror_fidelity --capture mirror numpy --workload alexnet
"""

from __future__ import annotations

import json
import logging
import sys
import time

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130

import pgmo  # noqa: E402
from pgmo import bundled  # noqa: E402
from pgmo.runs import Run  # noqa: E402

from . import record_runs  # noqa: E402  (Chainer and the examples)

log = logging.getLogger("mirror_fidelity")

#: name -> (the H100's: a bundled trace's name, or a lower bound in MiB as published;
#: how it was cut; record_runs arguments).
WORKLOADS = {
    "alexnet": ("h100-alexnet-train-b32", "profiled",
                ["--workload", "alexnet", "--batchsize", "32"]),
    "densenet": ("h100-densenet-bc100-k12-train-b64-recompute-off-stock", "stock",
                 ["--workload", "densenet", "--batchsize", "64"]),
    "densenet-recompute": ("h100-densenet-bc100-k12-train-b64-recompute-on-stock", "stock",
                           ["--workload", "densenet", "--batchsize", "64", "--recompute"]),
    "resnet50": (3439.0, "planned", ["--workload", "resnet50", "--batchsize", "32"]),
    "googlenet": (1604.7, "planned", ["--workload", "googlenet", "--batchsize", "32"]),
}
#: Where the published lower bounds come from.
PUBLISHED = ("the lower bound of pgmo's plan, H100 2026-11-25, bench_memory-results.md "
             "(docs/results.md), MiB to 0.1")
LARGEST = 8


def iteration_trace(run: Run, k: int, cut: str) -> pgmo.Trace:
    """Iteration ``k`` of ``run`` as the GPU trace of kind ``cut`` holds one."""
    begin, end = run.iterations[k]
    blocks = []
    for b in run.trace.blocks:
        upper = None if b.upper is None or b.upper >= end else b.upper  # freed after it
        if begin <= b.lower < end and not (cut == "planned" and upper is None):
            size = b.size if cut == "stock" else -(-b.size // 512) * 512
            blocks.append((b.lower, upper, size))
        elif cut == "stock" and b.lower < begin and upper is not None and upper >= begin:
            blocks.append((begin, upper, b.size))  # live at the start, freed in it
    blocks.sort()
    return pgmo.Trace.from_columns([lo for lo, _, _ in blocks], [up for _, up, _ in blocks],
                                   [s for _, _, s in blocks], {})


def summary(trace: pgmo.Trace) -> dict:
    sizes = sorted((b.size for b in trace.blocks), reverse=True)
    return {"requests": len(trace), "lower_bound": trace.lower_bound(),
            "largest": sizes[:LARGEST]}


def compare(name: str, capture: str, extra: list[str] = ()) -> dict:
    """Record ``name`` with ``capture`` and compare its second iteration with the H100's.

    ``extra``: more record_runs arguments (smaller sizes, for a quick check).
    """
    reference, cut, argv = WORKLOADS[name]
    args = record_runs.parse_args([*argv, "--iterations", "2", "--capture", capture, *extra])
    setup, _, _, _ = record_runs.workload(args, args.workload[0])
    started = time.perf_counter()
    run, _ = record_runs.record(setup, 2, capture)
    seconds = time.perf_counter() - started
    cpu = summary(iteration_trace(run, 1, cut))
    if isinstance(reference, str):
        gpu = summary(bundled.load(reference))
    else:  # only the lower bound was published
        gpu = {"requests": None, "lower_bound": round(reference * 2 ** 20), "largest": []}
        reference = PUBLISHED
    row = {"workload": name, "capture": capture, "reference": reference, "cut": cut,
           "gpu": gpu, "cpu": cpu,
           "lower_bound_ratio": round(cpu["lower_bound"] / gpu["lower_bound"], 4),
           "seconds": round(seconds, 1)}
    log.info("%s (%s): %d requests (H100: %s), lower bound %.1f vs %.1f MiB on the H100 (%.3f)",
             name, capture, cpu["requests"], gpu["requests"], cpu["lower_bound"] / 2**20,
             gpu["lower_bound"] / 2**20, row["lower_bound_ratio"])
    return row


def table(rows: list[dict]) -> str:
    """A Markdown table of the comparison."""
    mib = 2 ** 20
    lines = ["| workload | capture | requests CPU / H100 | lower bound CPU / H100 (MiB) | "
             "ratio | largest blocks CPU (MiB) | largest blocks H100 (MiB) |",
             "|---|---|---:|---:|---:|---|---|"]
    for r in rows:
        cpu, gpu = r["cpu"], r["gpu"]
        largest = [", ".join(f"{s / mib:.1f}" for s in x["largest"][:5]) or "-"
                   for x in (cpu, gpu)]
        lines.append(f"| {r['workload']} ({r['cut']}) | {r['capture']} | {cpu['requests']} / "
                     f"{gpu['requests'] or '-'} | {cpu['lower_bound'] / mib:,.1f} / "
                     f"{gpu['lower_bound'] / mib:,.1f} | {r['lower_bound_ratio']:.3f} | "
                     f"{largest[0]} | {largest[1]} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", choices=list(WORKLOADS),
                        default=list(WORKLOADS))
    parser.add_argument("--capture", nargs="+", choices=sorted(record_runs.CAPTURES),
                        default=["mirror"])
    parser.add_argument("--out", type=programs.output_file, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = [compare(name, capture) for name in args.workload for capture in args.capture]
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "table": table(rows)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(programs.run(main))
