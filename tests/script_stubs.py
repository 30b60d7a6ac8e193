"""Stand-ins for the programs the GPU shell scripts call, so the scripts can run on any CPU.

``python script_stubs.py ROLE ARGS...`` plays ``ROLE``: ``python`` (the
interpreter the scripts call as ``$PY``/``$PYTHON``), ``compute-sanitizer``,
``nvidia-smi`` or ``mpiexec``.  Every call is appended as one JSON line (role, argv, cwd and
the environment variables the scripts set) to ``$STUB_CALLS``.  ``$STUB_PLAN``
names a JSON file that shapes what each step does: ``{"<step>": {"rc": 1,
"sleep": 60, "advance": 100, "files": [...], "errors": 3, "size": N}}``;
``advance`` moves the fake clock in ``$STUB_CLOCK`` (read by a ``date`` stub)
by that many seconds, so that session budgets are tested without waiting.
Only the standard library is used: the stubs start with ``python -S``.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time

PYTHON_STEPS = {  # script (run by path) or module (run with -m) -> step name in the plan
    "scripts.record_traces": "traces", "scripts.bench_malloc": "malloc",
    "scripts.bench_memory": "bench", "scripts.gpu_quick_check": "quick",
    "one_liner.py": "one-liner", "train_imagenet.py": "chainer", "train_mn.py": "mn",
    "setup.py": "build",
}


def _plan(step: str) -> dict:
    path = os.environ.get("STUB_PLAN")
    if not path or not os.path.exists(path):
        return {}
    with open(path) as fh:
        return json.load(fh).get(step, {})


def _record(role: str, argv: list[str], step: str) -> None:
    entry = {"role": role, "step": step, "argv": argv, "cwd": os.getcwd(),
             "env": {k: os.environ.get(k) for k in ("PYTHONPATH", "PIP_CONSTRAINT",
                                                    "PIP_BUILD_CONSTRAINT", "PYTHONWARNINGS",
                                                    "LD_LIBRARY_PATH")}}
    with open(os.environ["STUB_CALLS"], "a") as fh:
        fh.write(json.dumps(entry) + "\n")


def _advance_clock(seconds: int) -> None:
    path = os.environ.get("STUB_CLOCK")
    if seconds and path:
        with open(path) as fh:
            now = int(fh.read())
        with open(path, "w") as fh:
            fh.write(str(now + seconds))


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _write(path: str, size: int) -> None:
    with open(path, "wb") as fh:
        fh.truncate(size)  # sparse: a "large" wheel costs no disk


def _python_step(argv: list[str]) -> str:
    if argv[:2] == ["-m", "pip"]:
        return "pip-" + argv[2] + ("-prefix" if "--prefix" in argv else "")
    if argv[:1] == ["-"]:
        return "probe"
    if argv[:2] == ["-m", "pytest"]:
        return "tests"
    if argv[:3] == ["-m", "pgmo", "demo"]:
        return "demo"
    if argv[:1] == ["-m"]:
        return PYTHON_STEPS.get(argv[1], "unknown")
    script = os.path.basename(argv[0]) if argv else ""
    return PYTHON_STEPS.get(script, "unknown")


def python(argv: list[str]) -> int:
    step = _python_step(argv)
    _record("python", argv, step)
    plan = _plan(step)
    print(f"stub {step} output")
    if step == "probe":
        sys.stdin.read()
        print("python 3.12.3 numpy 2.5.0 cupy 14.2.0\ndevice NVIDIA H100 80GB HBM3")
    elif step == "tests":  # progress, failures, then the counts, as pytest -q prints them
        print("\n".join(plan.get("lines", [".......                [100%]"])))
        print(plan.get("summary", "7 passed, 551 deselected in 12.34s"))
    elif step == "traces":
        out_dir = _value(argv, "--out-dir")
        os.makedirs(out_dir, exist_ok=True)
        for name in plan.get("files", ["alexnet-train-b32.json.gz",
                                       "resnet50-train-b32.json.gz"]):
            with gzip.open(os.path.join(out_dir, name), "wt") as fh:
                json.dump({"stub trace": name}, fh)
    elif step == "demo":
        _write(_value(argv, "-o"), 100)  # the picture
    elif step == "mn":  # rank 0's summary lines, as examples/train_mn.py prints them
        print("parameters identical on all 2 ranks: yes\n"
              "pools optimized: 2 of 2; fallback requests: 0 (pinned requests: 0)")
    elif step == "pip-install-prefix":  # MPICH's wheel: its library and its mpiexec
        prefix = _value(argv, "--prefix")
        os.makedirs(os.path.join(prefix, "lib"), exist_ok=True)
        os.makedirs(os.path.join(prefix, "bin"), exist_ok=True)
        mpiexec = os.path.join(prefix, "bin", "mpiexec")
        with open(mpiexec, "w") as fh:
            fh.write(f'#!/bin/sh\nSTUB_MPIEXEC_PATH="$0" exec "{sys.executable}" -S '
                     f'"{os.path.abspath(__file__)}" mpiexec "$@"\n')
        os.chmod(mpiexec, 0o755)
    elif step == "quick":  # its raw results and report, written into --out
        out_dir = _value(argv, "--out")
        os.makedirs(out_dir, exist_ok=True)
        for name in ("quick-check.json", "quick-check.md"):
            with open(os.path.join(out_dir, name), "w") as fh:
                fh.write(json.dumps({"stub": name}) + "\n")
        print("# pgmo quick GPU check")
    elif step == "malloc":
        print("| workload | path | us / malloc+free | x cupy MemoryPool | x pgmo optimized |")
    elif step == "bench":
        with open(_value(argv, "-o"), "w") as fh:
            fh.write("# pgmo against CuPy's stock memory pool\n")
        if "--run-dir" in argv:  # the whole runs it records
            run_dir = _value(argv, "--run-dir")
            os.makedirs(run_dir, exist_ok=True)
            with gzip.open(os.path.join(run_dir, "resnet50-train-b32-stock.run.json.gz"),
                           "wt") as fh:
                json.dump({"stub run": True}, fh)
    elif step == "pip-wheel":
        _write(os.path.join(_value(argv, "-w"), "chainer-7.8.1-py3-none-any.whl"),
               plan.get("size", 1000))
    elif step == "pip-download":
        dest = _value(argv, "-d")
        bindings = [arg for arg in argv if arg.startswith("cuda-bindings")]
        if bindings:  # the one pgmo's cuda12 / cuda13 extra pins, and what it needs
            version = "12.9.4" if "<13" in bindings[0] else "13.5.0"
            _write(os.path.join(dest, f"cuda_bindings-{version}-cp312-cp312-"
                                      "manylinux_2_28_x86_64.whl"), plan.get("size", 500))
            _write(os.path.join(dest, "cuda_pathfinder-1.9.1-py3-none-any.whl"), 20)
            _write(os.path.join(dest, "nvidia_ml_py-13.580.82-py3-none-any.whl"), 30)
        elif any(arg.startswith("mpich") for arg in argv):
            _write(os.path.join(dest, "mpi4py-4.1.2-cp312-cp312-manylinux1_x86_64.whl"), 300)
            _write(os.path.join(dest, "mpich-5.0.2-py3-none-manylinux_2_28_x86_64.whl"), 700)
        else:
            _write(os.path.join(dest, "ortools-9.15.6755-cp312-cp312-manylinux_2_27_x86_64.whl"),
                   plan.get("size", 2000))
            _write(os.path.join(dest, "immutabledict-4.2.1-py3-none-any.whl"), 100)
    sys.stdout.flush()
    _advance_clock(plan.get("advance", 0))
    if plan.get("sleep"):
        time.sleep(plan["sleep"])
    return plan.get("rc", 0)


def compute_sanitizer(argv: list[str]) -> int:
    """Skips ``--opt value`` pairs, runs the program, then prints memcheck's summary."""
    _record("compute-sanitizer", argv, "sanitizer")
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        i += 2
    program = argv[i:]
    print("========= COMPUTE-SANITIZER", flush=True)
    rc = subprocess.call(program)
    step = PYTHON_STEPS.get(os.path.basename(program[1]) if len(program) > 1 else "", "")
    print(f"========= ERROR SUMMARY: {_plan(step).get('errors', 0)} errors", flush=True)
    return rc


def mpiexec(argv: list[str]) -> int:
    """Records the call (with ``$0``: which mpiexec), then runs the program once, as rank 0."""
    _record("mpiexec", [os.environ.get("STUB_MPIEXEC_PATH", "")] + argv, "mn")
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2
    return subprocess.call(argv[i:])


def nvidia_smi(argv: list[str]) -> int:
    _record("nvidia-smi", argv, "setup")
    print("name, memory.total [MiB], driver_version\nNVIDIA H100 80GB HBM3, 81559 MiB, 570.86")
    return 0


def main(argv: list[str]) -> int:
    role, args = argv[0], argv[1:]
    return {"python": python, "compute-sanitizer": compute_sanitizer,
            "nvidia-smi": nvidia_smi, "mpiexec": mpiexec}[role](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
