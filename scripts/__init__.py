"""pgmo's benchmarks and GPU-session programs: one package, run from the repository root.

Every program is a module run with ``python -m scripts.<name>`` from the
folder holding ``pgmo/`` (``--help`` says what it takes); the modules share
code by import, and only :mod:`scripts.examples` touches ``sys.path`` (to
reach the example models in ``examples/``).  A program that starts another
one as a child (an isolated recording, a benchmark configuration) starts it
the same way, through :mod:`scripts.children`.

Programs (no GPU needed unless said):

``bench_solver``      the packing methods on DSA instances (``--bestfit-timing``:
                      the paper's best-fit alone, timed)
``bench_footprint``   whole runs on the host model of the device: pgmo against
                      CuPy's pool and the physical limit
``bench_import``      importing and analyzing a 100,000-event PyTorch snapshot
``bench_malloc``      one malloc+free pair in each of pgmo's paths (``--gpu``)
``bench_overhead``    re-planning: boundary stalls, plan latency, planning's cost to training
``bench_memory``      GPU: the paper's memory and speed experiments (``--device -1``:
                      a CPU dry run)
``gpu_quick_check``   GPU: what the device layer and its host model assume, settled
                      in 8 minutes; fails when a part fell back (``--dry-run``:
                      stand-ins on the CPU)
``fit_host_model``    the host model's device parameters fitted to a quick check's
                      ``quick-check.json``
``record_traces``     GPU: one iteration's requests per workload (``--device -1``:
                      a CPU dry run)
``record_runs``       whole runs of the examples recorded on the CPU
``mirror_fidelity``   how close a CPU recording comes to the H100's
``recompute_table``   DenseNet-BC recomputation and pgmo, from recorded traces
``results_table``     ``docs/results.md`` from a GPU session's output folder

Shared modules: :mod:`~scripts.examples` (the example models),
:mod:`~scripts.children` (starting a program as a child and reading its
result), :mod:`~scripts.needs_gpu` (a GPU program's first check: one line
where CuPy sees no GPU), :mod:`~scripts.markdown` (writing and reading Markdown tables),
:mod:`~scripts.chainer_workloads` (the examples' training and inference
steps), :mod:`~scripts.numpy_mirror` and :mod:`~scripts.numpy_allocations`
(a GPU's requests made from a run on NumPy), :mod:`~scripts.dsa_instances`
and :mod:`~scripts.bestfit_timing` (for ``bench_solver``),
:mod:`~scripts.footprint_workloads` (the runs ``bench_footprint`` measures),
:mod:`~scripts.bench_memory_report`, :mod:`~scripts.quick_check_report` and
:mod:`~scripts.evidence` (the GPU reports and a session's folder),
:mod:`~scripts.quick_check_steps`, :mod:`~scripts.allocator_costs`,
:mod:`~scripts.driver_pool_probe`, :mod:`~scripts.device_replays`,
:mod:`~scripts.nvml_probe`, :mod:`~scripts.gpu_modules` and
:mod:`~scripts.gpu_stand_ins` (the quick check's steps, measurements, the GPU's
modules and their stand-ins).
``gpu_session.sh`` and ``fetch_gpu_wheels.sh`` are the shell side of a GPU
session (``docs/reproducing-gpu-results.md``).  A shared module run with
``python -m`` says in one line that it is no program, and names the programs.
"""

import re as _re
import sys as _sys
from pathlib import Path as _Path

_MAIN = _re.compile(r'^if __name__ == "__main__":', _re.M)


def _refuse_a_shared_module() -> None:
    """``python -m scripts.<shared module>`` says in one line (exit status 2) that it is no
    program and names the programs, where it used to do nothing and exit 0."""
    argv = getattr(_sys, "orig_argv", [])
    if "-m" not in argv[:-1]:
        return
    package, _, name = argv[argv.index("-m") + 1].partition(".")
    source = _Path(__file__).with_name(f"{name}.py")
    if package != __name__ or not source.is_file() or _MAIN.search(source.read_text()):
        return
    names = sorted(p.stem for p in _Path(__file__).parent.glob("*.py")
                   if _MAIN.search(p.read_text()))
    print(f"{name}.py: error: scripts.{name} is a module the programs share, not a program; "
          f"the programs: {', '.join(names)}", file=_sys.stderr)
    raise SystemExit(2)


if _sys.argv[:1] == ["-m"]:  # `python -m scripts.<name>`: Python imports this package first
    _refuse_a_shared_module()

    from pgmo import programs as _programs

    # A program run where a package it imports (Chainer) is missing says so in one line.
    _programs.answer_missing_packages()
