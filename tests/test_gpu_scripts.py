"""The GPU scripts, run on the CPU: the shell scripts with stand-ins, the Python ones as dry runs.

``scripts/gpu_session.sh`` and ``scripts/fetch_gpu_wheels.sh`` run for real in
a copy of the checkout, with the programs they call replaced by
``tests/script_stubs.py`` (the Python interpreter, ``compute-sanitizer``,
``nvidia-smi``; ``date`` reads a fake clock, so session budgets are tested
without waiting): what each step is given, what it logs, which files it
leaves, and that one failing step does not stop the next.

``python -m scripts.record_traces`` and ``python -m scripts.bench_memory`` are
run as the GPU session runs them, in a subprocess, with ``--device -1`` at tiny
sizes.
The checks: every output is labelled a dry run, no file could pass for a
recording, the tables have the columns users read, and no GPU number is
made up.
"""

import gzip
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pgmo import _chainer_compat, bundled

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")
STUBS = os.path.join(ROOT, "tests", "script_stubs.py")


def run_script(program, *args, timeout=240):
    """``python -m scripts.<program> ARGS`` from the repository root; (stdout, stderr)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, "-m", f"scripts.{program}", *map(str, args)],
                            capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert result.returncode == 0, \
        f"{program} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout, result.stderr


# ------------------------------------------------------------ the shell scripts, stubbed
needs_shell = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("bash", "timeout", "tar", "du", "date")),
    reason="needs bash and coreutils")

#: The fake clock's start (epoch seconds); stubs move it forward with "advance".
CLOCK_START = 1_700_000_000
DEFAULT_STEPS = ["tests", "traces", "malloc", "sanitizer-one-liner", "sanitizer-chainer",
                 "demo", "mn"]


class Checkout:
    """A copy of the files a script needs, stand-ins on PATH, and what they recorded."""

    def __init__(self, base: Path, files: list[str], plan: dict | None = None):
        self.base, self.root = base, base / "checkout"
        for name in files:
            (self.root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.join(ROOT, name), self.root / name)
        self.bin = base / "bin"
        self.bin.mkdir(parents=True)
        for role in ("python", "compute-sanitizer", "nvidia-smi", "mpiexec"):
            self._executable("py" if role == "python" else role,
                             f'STUB_MPIEXEC_PATH="$0" exec "{sys.executable}" -S "{STUBS}" '
                             f'{role} "$@"')
        self._executable("date", f'if [ "$1" = "+%s" ]; then cat "$STUB_CLOCK"; '
                                 f'else exec "{shutil.which("date")}" "$@"; fi')
        self.py = str(self.bin / "py")
        self.calls_file, self.clock, self.plan_file = (base / "calls.jsonl", base / "clock",
                                                       base / "plan.json")
        self.clock.write_text(str(CLOCK_START))
        self.plan_file.write_text(json.dumps(plan or {}))

    def _executable(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)

    def run(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
        base_env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL")}
        base_env.update(PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}",
                        STUB_CALLS=str(self.calls_file), STUB_PLAN=str(self.plan_file),
                        STUB_CLOCK=str(self.clock), **env)
        return subprocess.run(["bash", str(self.root / "scripts" / script), *args],
                              env=base_env, capture_output=True, text=True, timeout=120,
                              cwd=self.base)

    def calls(self, role: str | None = None) -> list[dict]:
        if not self.calls_file.exists():
            return []
        calls = [json.loads(line) for line in self.calls_file.read_text().splitlines()]
        return [c for c in calls if role is None or c["role"] == role]


class Session:
    """One run of ``scripts/gpu_session.sh`` with stand-ins."""

    def __init__(self, base: Path, *steps: str, plan: dict | None = None, wheels: bool = True,
                 wheels_extra: tuple = (), **env: str):
        self.checkout = Checkout(base, ["scripts/gpu_session.sh"], plan)
        self.root = self.checkout.root
        if wheels:
            (self.root / ".whl").mkdir()
            (self.root / ".whl" / "chainer-7.8.1-py3-none-any.whl").write_bytes(b"wheel")
            for name in wheels_extra:
                (self.root / ".whl" / name).write_bytes(b"wheel")
        self.out, self.scratch = base / "out", base / "scratch"
        self.py = self.checkout.py
        self.result = self.checkout.run("gpu_session.sh", *steps, OUT=str(self.out),
                                        SCRATCH=str(self.scratch), PY=self.py, **env)
        assert self.result.returncode == 0, self.result.stderr
        self.log = (self.out / "session.log").read_text()
        # what the script said, without the "[HH:MM:SS +Ns] " prefix
        self.events = [re.sub(r"^\[\d\d:\d\d:\d\d \+\d+s\] ", "", line)
                       for line in self.log.splitlines() if line.startswith("[")]

    def python_calls(self) -> dict[str, dict]:
        return {c["step"]: c for c in self.checkout.calls("python")}

    def step_events(self) -> list[str]:
        """BEGIN/END/SKIP lines, shortened to "BEGIN name", "END name: exit N", "SKIP name"."""
        short = []
        for event in self.events:
            m = re.match(r"(BEGIN|END|SKIP) ([\w-]+)(: exit \d+)?", event)
            if m:
                short.append(f"{m[1]} {m[2]}{m[3] or ''}")
        return short


@pytest.fixture(scope="module")
def default_session(tmp_path_factory):
    """The default steps, all succeeding; the Chainer run's memcheck reports 2 errors."""
    return Session(tmp_path_factory.mktemp("session"), plan={"chainer": {"errors": 2}})


@needs_shell
def test_session_logs_each_default_step_with_its_exit_status(default_session):
    s = default_session
    expected = []
    for name in DEFAULT_STEPS:
        expected += [f"BEGIN {name}", f"END {name}: exit 0"]
    assert s.step_events() == expected  # each step begins and ends before the next
    assert "bench" not in s.python_calls()  # the long step runs only when asked for
    assert s.events[-1].startswith("done; files in ")
    # the environment: the GPU, the versions, the sanitizer found
    assert "NVIDIA H100 80GB HBM3, 81559 MiB, 570.86" in s.log
    assert "python 3.12.3 numpy 2.5.0 cupy 14.2.0" in s.log
    assert "pgmo commit: unknown" in s.log  # a copy of the checkout without git
    assert f"compute-sanitizer: {s.checkout.bin / 'compute-sanitizer'}" in s.log


@needs_shell
def test_session_gives_each_step_its_command(default_session):
    s, calls = default_session, default_session.python_calls()
    assert list(calls) == ["pip-install", "build", "probe", "tests", "traces", "malloc",
                           "one-liner", "chainer", "demo", "mn"]
    # pgmo runs from the checkout: its hot path is compiled there first
    assert calls["build"]["argv"] == ["setup.py", "-q", "build_ext", "--inplace"]
    assert calls["pip-install"]["argv"] == [
        "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
        "--no-cache-dir", "--upgrade", "--target", str(s.scratch / "site"),
        ".whl/chainer-7.8.1-py3-none-any.whl"]
    assert calls["tests"]["argv"] == ["-m", "pytest", "-m", "gpu", "-q", "-p",
                                      "no:cacheprovider", "-o", "addopts=", "tests"]
    assert calls["traces"]["argv"] == [
        "-m", "scripts.record_traces", "--device", "0", "--out-dir", str(s.scratch / "traces"),
        "--arch", "alexnet", "googlenet", "resnet50", "inception-resnet-v2",
        "--batchsize", "32", "64", "128", "--inference", "--seq2seq", "3", "--densenet", "64",
        "--isolate"]
    assert calls["malloc"]["argv"] == ["-m", "scripts.bench_malloc", "--gpu"]
    assert calls["demo"]["argv"] == ["-m", "pgmo", "demo", "-o",
                                     str(s.scratch / "pgmo-demo.png")]
    # two MPI ranks, with the mpiexec beside the Python (no MPICH wheel in .whl/)
    assert [c["argv"] for c in s.checkout.calls("mpiexec")] == [
        [str(s.checkout.bin / "mpiexec"), "-n", "2", s.py, "examples/train_mn.py",
         "--arch", "resnet50", "--batchsize", "16", "--insize", "128", "--classes", "100",
         "--iterations", "12", "--out", str(s.scratch / "mn")]]
    assert calls["mn"]["argv"][0] == "examples/train_mn.py"
    memcheck = ["--tool", "memcheck", "--leak-check", "no", s.py]
    assert [c["argv"] for c in s.checkout.calls("compute-sanitizer")] == [
        memcheck + ["examples/one_liner.py", "--device", "0", "--iterations", "5",
                    "--batchsize", "64", "--inputs", "256", "--hidden", "128",
                    "--classes", "10"],
        memcheck + ["examples/train_imagenet.py", "--device", "0", "--arch", "resnet50",
                    "--pool", "pgmo", "--batchsize", "4", "--insize", "64", "--classes", "10",
                    "--iterations", "4"]]
    for step, call in calls.items():  # every step sees the wheels and the checkout's pgmo
        assert call["cwd"] == str(s.root)
        if step != "pip-install":
            assert call["env"]["PYTHONPATH"] == f"{s.scratch / 'site'}:{s.root}", step


@needs_shell
def test_session_puts_each_steps_output_in_its_file(default_session):
    s = default_session
    assert sorted(p.name for p in s.out.iterdir()) == sorted([
        "session.log", "pytest-gpu.log", "traces.tar.gz", "bench_malloc.txt",
        "sanitizer.log", "demo.log"])
    assert (s.out / "pytest-gpu.log").read_text().splitlines()[-1] == \
        "7 passed, 551 deselected in 12.34s"
    assert "pytest: 7 passed, 551 deselected in 12.34s" in s.events
    assert "stub traces output" in s.log  # record_traces reports into session.log
    assert (s.out / "bench_malloc.txt").read_text().startswith("stub malloc output\n| workload")
    assert "stub demo output" in (s.out / "demo.log").read_text()
    assert "stub mn output" in s.log  # the MPI run reports into session.log
    assert ("mn: parameters identical on all 2 ranks: yes pools optimized: 2 of 2; fallback "
            "requests: 0 (pinned requests: 0) ") in s.events
    assert (s.scratch / "pgmo-demo.png").exists()  # the picture stays out of the results
    sanitizer = (s.out / "sanitizer.log").read_text()
    assert sanitizer.index("stub one-liner output") < sanitizer.index("stub chainer output")


@needs_shell
def test_session_copies_sanitizer_error_summaries_into_the_log(default_session):
    assert [e for e in default_session.events if e.startswith("sanitizer:")] == [
        "sanitizer: ========= ERROR SUMMARY: 0 errors ========= ERROR SUMMARY: 2 errors "]


@needs_shell
def test_session_archives_the_traces(default_session):
    s = default_session
    with tarfile.open(s.out / "traces.tar.gz") as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert names == ["traces/alexnet-train-b32.json.gz", "traces/resnet50-train-b32.json.gz"]
    assert "traces: 2 files, " in s.log


@pytest.fixture(scope="module")
def failing_session(tmp_path_factory):
    """pytest fails, the traces step times out after writing 3 files, malloc and a sanitizer
    run fail."""
    plan = {"tests": {"rc": 1, "summary": "2 failed, 5 passed, 551 deselected in 9.00s",
                      "lines": [".F.F...", "FAILED tests/test_pool_gpu.py::test_a - assert 1 == 2",
                                "FAILED tests/test_pool_gpu.py::test_b - RuntimeError: error"]},
            "traces": {"files": ["a.json.gz", "b.json.gz", "c.json.gz"], "sleep": 60},
            "malloc": {"rc": 3}, "one-liner": {"rc": 2}}
    return Session(tmp_path_factory.mktemp("failing"), plan=plan, TIMEOUT_TRACES="3")


@needs_shell
def test_failing_or_timed_out_step_does_not_stop_the_others(failing_session):
    s = failing_session
    assert s.step_events() == [
        "BEGIN tests", "END tests: exit 1", "BEGIN traces", "END traces: exit 124",
        "BEGIN malloc", "END malloc: exit 3", "BEGIN sanitizer-one-liner",
        "END sanitizer-one-liner: exit 2", "BEGIN sanitizer-chainer",
        "END sanitizer-chainer: exit 0", "BEGIN demo", "END demo: exit 0", "BEGIN mn",
        "END mn: exit 0"]
    assert "BEGIN traces (timeout 3s): " in s.log
    assert re.search(r"END traces: exit 124 after \d+s \(TIMED OUT\)", s.log)
    assert "pytest: 2 failed, 5 passed, 551 deselected in 9.00s" in s.events


@needs_shell
def test_traces_archive_holds_what_was_written_before_a_timeout(failing_session):
    s = failing_session
    with tarfile.open(s.out / "traces.tar.gz") as tar:
        files = {m.name: json.loads(gzip.decompress(tar.extractfile(m).read()))
                 for m in tar.getmembers() if m.isfile()}
    assert files == {f"traces/{n}": {"stub trace": n} for n in ("a.json.gz", "b.json.gz",
                                                                   "c.json.gz")}
    assert "traces: 3 files, " in s.log


@needs_shell
def test_session_with_every_step_writes_at_most_eight_files(tmp_path):
    s = Session(tmp_path, "tests", "traces", "malloc", "sanitizer", "demo", "mn", "bench")
    files = sorted(p.name for p in s.out.iterdir())
    assert files == sorted(["session.log", "pytest-gpu.log", "traces.tar.gz",
                            "bench_malloc.txt", "sanitizer.log", "demo.log", "results.md",
                            "bench_memory.log"])
    assert len(files) <= 8  # what a results folder of 8 files can hold
    assert s.python_calls()["bench"]["argv"] == [
        "-m", "scripts.bench_memory", "--device", "0", "--budget", "520", "--run-dir",
        str(s.scratch / "runs"), "-o", str(s.out / "results.md")]  # 570 s session, 10 s
    # kept, 40 s for the report
    assert "stub bench output" in (s.out / "bench_memory.log").read_text()
    with tarfile.open(s.out / "traces.tar.gz") as tar:  # the whole runs join the traces
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == [
            "runs/resnet50-train-b32-stock.run.json.gz", "traces/alexnet-train-b32.json.gz",
            "traces/resnet50-train-b32.json.gz"]
    assert "runs: 1 files, " in s.log
    assert s.step_events()[-2:] == ["BEGIN bench", "END bench: exit 0"]


@needs_shell
def test_the_quick_check_step_writes_into_the_archive_and_its_report_into_the_log(tmp_path):
    s = Session(tmp_path, "quick", "malloc")
    assert s.step_events() == ["BEGIN quick", "END quick: exit 0", "BEGIN malloc",
                               "END malloc: exit 0"]
    assert "BEGIN quick (timeout 480s): " in s.log
    # its own budget leaves 30 s of the step's limit for its start and its report
    assert s.python_calls()["quick"]["argv"] == [
        "-m", "scripts.gpu_quick_check", "--device", "0", "--out",
        str(s.scratch / "quick-check"),
        "--budget", "450"]
    assert "# pgmo quick GPU check" in s.log
    with tarfile.open(s.out / "traces.tar.gz") as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert names == ["quick-check/quick-check.json", "quick-check/quick-check.md"]
    assert sorted(p.name for p in s.out.iterdir()) == ["bench_malloc.txt", "session.log",
                                                       "traces.tar.gz"]


@needs_shell
def test_later_steps_are_skipped_when_session_time_is_used_up(tmp_path):
    # On the fake clock: tests take 50 s and traces 60 s of a 130 s session.
    s = Session(tmp_path, plan={"tests": {"advance": 50}, "traces": {"advance": 60}},
                SESSION_SECONDS="130")
    assert s.step_events() == [
        "BEGIN tests", "END tests: exit 0", "BEGIN traces", "END traces: exit 0",
        "SKIP malloc", "SKIP sanitizer-one-liner", "SKIP sanitizer-chainer", "SKIP demo",
        "SKIP mn"]
    assert "BEGIN tests (timeout 120s): " in s.log  # capped at the session's 130 - 10 s
    assert "END tests: exit 0 after 50s" in s.events
    assert "BEGIN traces (timeout 70s): " in s.log  # what was left, not its own 240 s
    for name in ("malloc", "sanitizer-one-liner", "sanitizer-chainer", "demo", "mn"):
        assert f"SKIP {name}: session time used up" in s.events
    assert not {"malloc", "one-liner", "chainer", "demo", "mn"} & set(s.python_calls())
    assert "sanitizer: no ERROR SUMMARY line (see sanitizer.log)" in s.events
    assert (s.out / "traces.tar.gz").exists()


@needs_shell
def test_session_without_wheels_uses_the_installed_chainer(tmp_path):
    s = Session(tmp_path, "malloc", wheels=False)
    assert "pip-install" not in s.python_calls()
    assert f"no .whl/: using the Chainer installed in {s.py}, if any" in s.events
    assert s.step_events() == ["BEGIN malloc", "END malloc: exit 0"]


@needs_shell
def test_mpich_wheel_gets_its_own_prefix_and_its_mpiexec_runs_the_ranks(tmp_path):
    mpi_wheels = ["mpi4py-4.1.2-cp312-cp312-manylinux1_x86_64.whl",
                  "mpich-5.0.2-py3-none-manylinux_2_28_x86_64.whl"]
    s = Session(tmp_path, "mn", wheels_extra=mpi_wheels)
    calls = s.python_calls()
    # Chainer and mpi4py into the site folder, MPICH (its lib/ and bin/) under a prefix.
    target = calls["pip-install"]["argv"]
    assert target[target.index("--target") + 1:] == [
        str(s.scratch / "site"), ".whl/chainer-7.8.1-py3-none-any.whl", f".whl/{mpi_wheels[0]}"]
    prefix = calls["pip-install-prefix"]["argv"]
    assert prefix[prefix.index("--prefix") + 1] == str(s.scratch / "mpi")
    assert prefix[-1] == f".whl/{mpi_wheels[1]}" and "--ignore-installed" in prefix
    [mpiexec] = s.checkout.calls("mpiexec")
    assert mpiexec["argv"][0] == str(s.scratch / "mpi" / "bin" / "mpiexec")
    assert mpiexec["env"]["LD_LIBRARY_PATH"].split(":")[0] == str(s.scratch / "mpi" / "lib")
    assert calls["mn"]["env"]["LD_LIBRARY_PATH"].split(":")[0] == str(s.scratch / "mpi" / "lib")
    assert f"mpiexec: {s.scratch / 'mpi' / 'bin' / 'mpiexec'}" in s.log
    assert s.step_events() == ["BEGIN mn", "END mn: exit 0"]


@needs_shell
def test_mn_step_is_skipped_without_mpiexec(tmp_path):
    s = Session(tmp_path, "mn", MPIEXEC=str(tmp_path / "no-such-mpiexec"))
    assert s.step_events() == ["SKIP mn"]
    assert "SKIP mn: mpiexec not found (pip install 'pgmo[mpi]')" in s.events
    assert "mn" not in s.python_calls()


@needs_shell
def test_relative_out_and_scratch_are_where_the_script_was_started(tmp_path):
    checkout = Checkout(tmp_path, ["scripts/gpu_session.sh"])
    result = checkout.run("gpu_session.sh", "demo", OUT="results", SCRATCH="work",
                          PY=checkout.py)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["demo.log",
                                                                         "session.log"]
    assert (tmp_path / "work" / "pgmo-demo.png").exists()
    assert not (checkout.root / "results").exists()


# ---------------------------------------------------------------- fetch_gpu_wheels.sh
def fetch_wheels(tmp_path, *args, plan=None, existing=()):
    checkout = Checkout(tmp_path, ["scripts/fetch_gpu_wheels.sh", "constraints-chainer.txt"],
                        plan)
    for name in existing:
        (checkout.root / ".whl").mkdir(exist_ok=True)
        (checkout.root / ".whl" / name).write_bytes(b"old")
    result = checkout.run("fetch_gpu_wheels.sh", *args, PYTHON=checkout.py)
    return checkout, result


BINDINGS = ["cuda_bindings-13.5.0-cp312-cp312-manylinux_2_28_x86_64.whl",
            "cuda_pathfinder-1.9.1-py3-none-any.whl", "nvidia_ml_py-13.580.82-py3-none-any.whl"]


@needs_shell
def test_fetch_wheels_builds_chainer_under_pgmos_constraints(tmp_path):
    checkout, result = fetch_wheels(tmp_path)
    assert result.returncode == 0, result.stderr
    call = checkout.calls()[0]
    assert call["argv"] == ["-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir",
                            "-w", ".whl", "chainer==7.8.1"]
    assert call["cwd"] == str(checkout.root)
    # setuptools<82 while building (Chainer's setup.py imports pkg_resources)
    assert call["env"]["PIP_CONSTRAINT"] == call["env"]["PIP_BUILD_CONSTRAINT"] == \
        "constraints-chainer.txt"
    assert "setuptools<82" in (checkout.root / "constraints-chainer.txt").read_text()
    assert sorted(p.name for p in (checkout.root / ".whl").iterdir()) == [
        "chainer-7.8.1-py3-none-any.whl", *BINDINGS]
    assert result.stdout.splitlines()[-1] == "total: 1550 bytes"


def downloads(checkout) -> list[list[str]]:
    """The pip downloads after the Chainer wheel: binary wheels for the device's CPython."""
    wheel, *calls = checkout.calls()
    assert wheel["step"] == "pip-wheel" and all(c["step"] == "pip-download" for c in calls)
    for call in calls:
        argv = call["argv"]
        assert argv[:3] == ["-m", "pip", "download"]
        assert {"--no-deps", "--only-binary=:all:"} <= set(argv)
        assert argv[argv.index("--python-version") + 1] == "3.12"
        assert argv[argv.index("--implementation") + 1] == "cp"
        assert argv[argv.index("-d") + 1] == ".whl"
        platforms = [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"]
        assert "manylinux2014_x86_64" in platforms and all("x86_64" in p for p in platforms)
    return [call["argv"] for call in calls]


@needs_shell
def test_fetch_wheels_fetches_the_cuda_bindings_of_the_cupy_wheels_cuda(tmp_path):
    """cupy-cuda13x (the default) needs cuda-bindings 13.x, cupy-cuda12x 12.x (pgmo's cuda13 and
    cuda12 extras): without them the arena falls back to cudaMalloc on the GPU machine."""
    checkout, result = fetch_wheels(tmp_path)
    assert result.returncode == 0, result.stderr
    [argv] = downloads(checkout)
    assert argv[-3:] == ["cuda-bindings>=13,<14", "cuda-pathfinder", "nvidia-ml-py"]
    checkout, result = fetch_wheels(tmp_path / "cuda12", "--cuda", "12")
    assert result.returncode == 0, result.stderr
    [argv] = downloads(checkout)
    assert argv[-3] == "cuda-bindings>=12.6,<13"
    assert "cuda_bindings-12.9.4-cp312-cp312-manylinux_2_28_x86_64.whl" in \
        [p.name for p in (checkout.root / ".whl").iterdir()]


@needs_shell
def test_fetch_wheels_with_ortools_downloads_wheels_for_cpython_312(tmp_path):
    checkout, result = fetch_wheels(tmp_path, "--ortools")
    assert result.returncode == 0, result.stderr
    assert downloads(checkout)[-1][-2:] == ["ortools==9.15.6755", "immutabledict"]
    assert result.stdout.splitlines()[-1] == "total: 3650 bytes"


@needs_shell
def test_fetch_wheels_with_mpi_downloads_mpi4py_and_mpich(tmp_path):
    checkout, result = fetch_wheels(tmp_path, "--mpi", "--cuda", "13")
    assert result.returncode == 0, result.stderr
    assert downloads(checkout)[-1][-2:] == ["mpi4py>=4.1", "mpich>=5.0"]
    assert sorted(p.name for p in (checkout.root / ".whl").iterdir()) == [
        "chainer-7.8.1-py3-none-any.whl", *BINDINGS[:2],
        "mpi4py-4.1.2-cp312-cp312-manylinux1_x86_64.whl",
        "mpich-5.0.2-py3-none-manylinux_2_28_x86_64.whl", BINDINGS[2]]
    assert result.stdout.splitlines()[-1] == "total: 2550 bytes"


@needs_shell
@pytest.mark.parametrize("args, message", [
    (["--mpi4py"], "error: unknown option --mpi4py (options: --cuda 12|13 --ortools --mpi)"),
    (["--cuda", "11"], "error: --cuda takes 12 or 13"),
    (["--ortools", "--cuda"], "error: --cuda takes 12 or 13")])
def test_fetch_wheels_refuses_a_mistake_before_any_download(tmp_path, args, message):
    checkout, result = fetch_wheels(tmp_path, *args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and \
        result.stderr.startswith(message)
    assert checkout.calls() == []


@needs_shell
def test_fetch_wheels_answers_ctrl_c_with_one_line(tmp_path):
    import signal
    import time

    checkout = Checkout(tmp_path, ["scripts/fetch_gpu_wheels.sh", "constraints-chainer.txt"],
                        {"pip-wheel": {"sleep": 30}})
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL")}
    env.update(PATH=f"{checkout.bin}{os.pathsep}{os.environ['PATH']}", PYTHON=checkout.py,
               STUB_CALLS=str(checkout.calls_file), STUB_PLAN=str(checkout.plan_file),
               STUB_CLOCK=str(checkout.clock))
    process = subprocess.Popen(["bash", str(checkout.root / "scripts" / "fetch_gpu_wheels.sh")],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        for _ in range(100):  # until pip (the stub) runs
            if checkout.calls():
                break
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole group
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130
    assert err.strip().splitlines()[-1] == "fetch_gpu_wheels: stopped (Ctrl-C)"


@needs_shell
def test_fetch_wheels_refuses_two_versions_of_a_package(tmp_path):
    _, result = fetch_wheels(tmp_path, existing=["chainer-7.8.0-py3-none-any.whl"])
    assert result.returncode == 1
    assert "error: several wheels of: chainer (keep one version each)" in result.stderr


@needs_shell
def test_fetch_wheels_refuses_more_than_48_mib(tmp_path):
    _, result = fetch_wheels(tmp_path, plan={"pip-wheel": {"size": 48 * 2**20 + 1}})
    assert result.returncode == 1
    assert "error: wheels exceed 48 MiB" in result.stderr
    _, result = fetch_wheels(tmp_path / "fits",
                             plan={"pip-wheel": {"size": 48 * 2**20 - 550}})  # + the bindings
    assert result.returncode == 0, result.stderr


def test_gpu_session_names_at_most_eight_result_files():
    """Every file the script could write to $OUT, whichever steps run: at most 8."""
    with open(os.path.join(SCRIPTS, "gpu_session.sh")) as fh:
        text = fh.read()
    outputs = set(re.findall(r'\$OUT/([A-Za-z0-9_.-]+)', text))
    assert "session.log" in outputs and "traces.tar.gz" in outputs
    assert len(outputs) <= 8, sorted(outputs)


needs_chainer = pytest.mark.chainer


def _chainer_or_skip():
    pytest.importorskip("cupy")
    _chainer_compat.apply()
    pytest.importorskip("chainer")


@needs_chainer
def test_record_traces_dry_run_is_labelled(tmp_path):
    _chainer_or_skip()
    out, _ = run_script("record_traces", "--device", -1, "--out-dir", tmp_path,
                        "--arch", "alexnet", "--batchsize", 2, "--inference", "--seq2seq", 2,
                        "--classes", 10, "--vocab", 50, "--units", 16, "--layers", 1,
                        "--seq2seq-batchsize", 4, "--sentences", 20, "--max-output", 5)
    assert "CPU DRY RUN" in out
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(f"{n}.dry-run.json.gz" for n in (
        "alexnet-train-b2", "alexnet-infer-b1", "seq2seq-train-b4-1", "seq2seq-train-b4-2",
        "seq2seq-infer-b1-1", "seq2seq-infer-b1-2"))
    import pgmo

    for name in names:
        with gzip.open(tmp_path / name, "rt") as fh:
            meta = json.load(fh)["metadata"]
        assert meta["dry_run"] is True and meta["synthetic"] is True
        assert "dry run" in meta["recorded_by"].lower() and "no GPU recording" in meta["note"]
        assert meta["device"].startswith("CPU")
        # everything a recording must say is there; only the dry-run label keeps it out
        assert bundled.provenance_problems(meta) == [
            "a CPU dry run (dry_run: true), not a recording"], name
        assert bundled.provenance_problems({**meta, "dry_run": False, "synthetic": False}) == []
        trace = pgmo.read_trace(tmp_path / name)  # a valid trace the solver accepts
        assert len(trace) == meta["requests"] > 0
        assert trace.lower_bound() == meta["lower_bound"]
    # Variable-length seq2seq batches give different profiles.
    a = pgmo.read_trace(tmp_path / "seq2seq-train-b4-1.dry-run.json.gz")
    b = pgmo.read_trace(tmp_path / "seq2seq-train-b4-2.dry-run.json.gz")
    assert a.metadata["source_lengths"] != b.metadata["source_lengths"]
    assert len(a) != len(b) or a.blocks != b.blocks


@needs_chainer
def test_record_traces_dry_run_records_profiles_the_pool_plans_in_the_background(tmp_path):
    """GoogLeNet training, which the pool's default replan="background" plans in its worker
    process after the iteration: the script still writes the profiled iteration."""
    _chainer_or_skip()
    import pgmo

    run_script("record_traces", "--device", -1, "--out-dir", tmp_path, "--arch", "googlenet",
               "--batchsize", 2, "--classes", 10)
    trace = pgmo.read_trace(tmp_path / "googlenet-train-b2.dry-run.json.gz")
    assert len(trace) == trace.metadata["requests"] > 0


@needs_chainer
def test_record_traces_isolates_each_workload_in_a_process_of_its_own(tmp_path):
    """--isolate, as the GPU session runs it: the same traces, each naming the user's command."""
    _chainer_or_skip()
    import pgmo

    out, _ = run_script("record_traces", "--device", -1, "--out-dir", tmp_path, "--arch",
                        "alexnet", "--batchsize", 2, "--inference", "--classes", 10, "--isolate")
    assert f"wrote 2 trace(s) to {tmp_path} in " in out and "; 0 workload(s) failed" in out
    for name in ("alexnet-train-b2", "alexnet-infer-b1"):
        meta = pgmo.read_trace(tmp_path / f"{name}.dry-run.json.gz").metadata
        assert meta["command"] == (f"record_traces.py --device -1 --out-dir {tmp_path} --arch "
                                   "alexnet --batchsize 2 --inference --classes 10 --isolate")


@needs_chainer
def test_the_dry_run_reaches_the_pool_through_cupys_allocator():
    """As on a GPU: a request reaches the pool only through the allocator installed in CuPy."""
    _chainer_or_skip()
    workloads = _import_script("chainer_workloads")
    pool = workloads.new_pool(-1, warmup=0)
    assert pool.stats().replan == "background"  # the pool's own default, not the tests'
    with pool:  # installed as CuPy's allocator
        block = _import_script("numpy_mirror").cupy_alloc(1000)
        assert pool.stats().requests == 1 and block.mem.size == 1024 and block.ptr


@needs_chainer
def test_record_traces_dry_run_refuses_the_bundled_folder():
    _chainer_or_skip()
    result = subprocess.run([sys.executable, "-m", "scripts.record_traces",
                             "--device", "-1", "--out-dir", os.path.join(ROOT, "pgmo", "traces")],
                            capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert result.returncode == 2 and "must not write into pgmo/traces" in result.stderr


MEMORY_HEADER = ("| model | task | batch | pool | taken, cudaMemGetInfo (MiB) "
                 "| taken, NVML (MiB) | live bytes, peak (MiB) | pool's own count, peak (MiB) "
                 "| planned peak (MiB) | lower bound (MiB) | planned / bound | ms/iter "
                 "| iterations 1-3 (ms) | pgmo mode | arena | fallback reqs |")


@needs_chainer
def test_bench_memory_dry_run_prints_labelled_tables(tmp_path):
    _chainer_or_skip()
    report = tmp_path / "results.md"
    out, err = run_script("bench_memory", "--device", -1, "--arch", "alexnet",
                          "--no-inference", "--search-arch", "alexnet", "--search-probes", 1,
                          "--seq2seq-iterations", 2, "--densenet-batchsize", 0,
                          "--repeats", 2, "--run-dir", tmp_path / "runs", "-o", report)
    assert report.read_text().strip() == out.strip()
    assert "CPU DRY RUN" in out and "- command: `python -m scripts.bench_memory --device -1" in out
    lines = out.splitlines()
    assert MEMORY_HEADER in lines
    rows = [line.split(" | ") for line in lines if line.startswith("| alexnet | train | 2 | ")]
    assert [r[3] for r in rows] == ["n/a (CPU)", "stock", "pgmo"]  # side by side, then each
    assert rows[0][3:] == ["n/a (CPU)"] * 5 + ["n/a (CPU) |"]
    rows = rows[1:]
    for row in rows:  # every measured cell is n/a on the CPU: no stand-in number leaks out
        cells = [c.strip(" |") for c in row[4:]]
        assert cells == ["n/a (CPU)"] * 12, row
    search = [line for line in lines if line.startswith("| alexnet | 96.0 |")]
    assert [line.split(" | ")[2] for line in search] == ["stock", "pgmo"]
    assert all(line.endswith("| n/a (CPU) | 1 |") for line in search)
    assert sum(1 for line in lines if re.match(r"- alexnet (stock|pgmo) batch \d+: "
                                               r"(fits|does not fit)$", line)) == 2
    seq = [line for line in lines if re.match(r"\| (stock|pgmo) \| 4 \| 2 \|", line)]
    assert len(seq) == 2 and all(line.count("n/a (CPU)") == 9 for line in seq)
    assert "- runs per configuration: up to 2 " in out
    assert re.search(r"time per part: memory and time, first batch size and inference \d+ s, "
                     r"seq2seq \d+ s, largest batch \d+ s, whole runs \d+ s, memory and time, "
                     r"other batch sizes \d+ s, repeats \d+ s, total \d+ s", out)
    assert "skipped" not in out and "failed" not in err
    # the whole runs: run files of pgmo.runs, every request heard, labelled dry runs
    from pgmo.runs import read_run

    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert names == sorted(f"{m}-train-b{b}-{pool}.dry-run.run.json.gz"
                           for m, b in (("alexnet", 2), ("seq2seq", 4))
                           for pool in ("stock", "pgmo"))
    for name in names:
        run = read_run(tmp_path / "runs" / name)
        meta = run.metadata
        assert len(run.iterations) == 3 == meta["iterations_run"]  # the dry run's default
        assert len(run) > 0 and meta["heard"]["frees_not_heard"] == 0
        assert meta["pool"] == name.split(".")[0].split("-")[-1]
        assert meta["dry_run"] is True and meta["synthetic"] is True
        assert meta["command"].startswith("python -m scripts.bench_memory --device -1")
        assert meta["recorded_by"].startswith("pgmo.TraceRecorder: a CuPy memory hook "
                                              "installed at process start")
        assert bundled.provenance_problems(meta) == [
            "a CPU dry run (dry_run: true), not a recording"], name
        assert len(meta["per_iteration"]["ms"]) == 3
        assert f"| {name} |" in out


@needs_chainer
@pytest.mark.parametrize("pool", ["stock", "pgmo"])
def test_bench_memory_holds_both_pools_to_the_limit_from_the_start(pool):
    """The same criterion for both pools: pgmo's warm-up and profiling run under the limit too."""
    _chainer_or_skip()
    bm = _import_bench_memory()
    cfg = {**bm.base_config(bm.parse_args(["--device", "-1"])), "workload": "cnn-train",
           "arch": "alexnet", "batch": 2, "insize": 39, "pool": pool, "limit": 2**20}
    done = subprocess.run([sys.executable, "-m", "scripts.bench_memory", "--child",
                           json.dumps(cfg)], capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"), cwd=ROOT)
    result = _import_script("children").result_of(done.stdout)
    assert result["oom"] and not result["fits"] and result["iterations"] == 0


def test_largest_fitting_batch_bisects_within_the_probe_budget():
    from scripts.bench_memory import fit_text, largest_fitting_batch
    for true_max in (0, 1, 7, 100, 1023, 1024):
        asked = []

        def fits(batch):
            asked.append(batch)
            return batch <= true_max

        lo, hi, used = largest_fitting_batch(fits, 1024, 20)
        assert (lo, hi) == (true_max, true_max + 1) and used == len(asked) <= 20
        assert len(set(asked)) == len(asked)
    lo, hi, used = largest_fitting_batch(lambda b: b <= 300, 1024, 3)
    assert used == 3 and lo <= 300 < hi and hi - lo > 1
    assert fit_text(lo, hi, 1024).startswith("between")
    assert fit_text(0, 1025, 1024) == "unknown (no probe ran)"
    assert fit_text(1024, 1025, 1024) == ">= 1024 (search max)"
    assert fit_text(0, 1, 1024) == "none (batch 1 does not fit)"
    assert fit_text(0, 40, 1024) == "below 40"
    lo, hi, used = largest_fitting_batch(lambda b: None, 1024, 5)
    assert (lo, hi, used) == (0, 1025, 1)


def _import_bench_memory():
    return _import_script("bench_memory")


def _child_result(pool, taken_mib, ms, oom=False, nvml_mib=None, own_mib=None):
    """The dict a GPU child prints (shape of ``bench_memory.run_child``), with chosen values:
    ``taken_mib`` seen from outside the pool, ``own_mib`` the pool's own count."""
    own_mib = taken_mib // 2 if own_mib is None else own_mib
    result = {"ok": not oom, "oom": oom, "iterations": 3 if oom else 7, "fits": not oom,
              "ms_per_iter": ms, "timed_iterations": 5,
              "laps_ms": [] if ms is None else [3 * ms, 2 * ms, ms + 1, ms, ms, ms, ms],
              "taken_device_bytes": taken_mib * 2**20,
              "taken_nvml_bytes": None if nvml_mib is None else nvml_mib * 2**20,
              "live_peak_bytes": 250 * 2**20, "own_peak_bytes": own_mib * 2**20,
              "outside": {"readings": {}, "samples": 500, "errors": 0, "interval_ms": 5.0,
                          "nvml_source": "process", "unavailable": ""}}
    if pool == "pgmo":
        result["pgmo"] = {"mode": "optimized", "planned_peak": 300 * 2**20,
                          "lower_bound": 250 * 2**20, "arena_bytes": 300 * 2**20,
                          "fallback_requests": 0, "reoptimizations": 2, "departures": 3,
                          "planned_requests": 5000, "arena_failures": 0,
                          "total_bytes": own_mib * 2**20, "peak_total_bytes": own_mib * 2**20,
                          "peak_used_bytes": 250 * 2**20, "arena_kind": None}
    return result


def test_several_runs_of_a_configuration_give_the_median_time_and_its_range():
    bm = _import_bench_memory()
    runs = [_child_result("stock", 800, 104.0, nvml_mib=1500),
            _child_result("stock", 820, 98.0, nvml_mib=1400),
            {"skipped": "timeout 150 s"}, _child_result("stock", 810, 100.0)]
    merged = bm.combine(runs)
    assert (merged["runs"], merged["failed_runs"]) == (3, 1)
    assert merged["ms_per_iter"] == 100.0 and merged["ms_runs"] == [104.0, 98.0, 100.0]
    assert merged["taken_device_bytes"] == 820 * 2**20  # memory: the worst run
    assert merged["taken_nvml_bytes"] == 1500 * 2**20
    text = _import_script("bench_memory_report")
    assert text.time_text(merged) == "100.0 (98.0-104.0, 3 runs)"
    assert text.time_text(bm.combine([_child_result("stock", 1, 43.5)])) == "43.5 (1 run)"
    ours = bm.combine([_child_result("pgmo", 400, 110.0), _child_result("pgmo", 400, 120.0)])
    # the medians' ratio, and the least and most any two runs give: here it cannot tell
    assert text.ratio_text(merged, ours) == "1.150 (1.06-1.22)"
    assert bm.combine([{"skipped": "budget"}]) == {"skipped": "budget", "runs": 0,
                                                   "ms_runs": []}


def test_gpu_report_formats_child_results():
    """The GPU-only formatting path, fed the result shape a GPU child prints."""
    bm = _import_bench_memory()
    args = bm.parse_args(["--device", "0", "--arch", "resnet50", "--batchsize", "32", "64"])
    base = {"arch": "resnet50", "workload": "cnn-train"}
    stock_runs = [_child_result("stock", 800, ms, nvml_mib=1500) for ms in (100.0, 96.0, 103.0)]
    runs = [({**base, "batch": 64, "pool": "pgmo"}, bm.combine([_child_result("pgmo", 400,
                                                                              110.0)])),
            ({**base, "batch": 32, "pool": "stock"}, bm.combine(stock_runs)),
            ({**base, "batch": 32, "pool": "pgmo"},  # its own count would say 75 % saved
             bm.combine([_child_result("pgmo", 400, 110.0, nvml_mib=1200, own_mib=100)])),
            ({**base, "batch": 64, "pool": "stock"},
             bm.combine([_child_result("stock", 0, None, oom=True)]))]
    runs.sort(key=bm.run_order)
    assert [(c["batch"], c["pool"]) for c, _ in runs] == [
        (32, "stock"), (32, "pgmo"), (64, "stock"), (64, "pgmo")]
    seq = [bm.seq2seq_row(args, {"pool": "pgmo", "batch": 64}, _child_result("pgmo", 900, 50.0))]
    search = [("resnet50", bm.mib(args.memory_limit), "pgmo", bm.fit_text(90, 91, 1024), 6)]
    run_file = _child_result("stock", 800, 100.0, nvml_mib=1500)
    run_file["run_file"] = {"path": "/x/resnet50-train-b32-stock.run.json.gz", "requests": 9000,
                            "iterations": 10}
    recorded = [({**base, "batch": 32, "pool": "stock",
                  "run_path": "/x/resnet50-train-b32-stock.run.json.gz"}, run_file)]
    text = bm.report(args, {"device": "NVIDIA H100 80GB HBM3", "device memory": "79.1 GiB",
                            "CUDA runtime": 13000, "cupy": "14.2.0",
                            "nvml": "cudaMemGetInfo and NVML sampled every 5 ms"},
                     (runs, seq, search, ["resnet50 pgmo batch 90: fits"]),
                     {"total": 12.0}, "python -m scripts.bench_memory --device 0", "", recorded)
    lines = text.splitlines()
    assert "n/a (CPU)" not in text and "DRY RUN" not in text
    assert "- device: NVIDIA H100 80GB HBM3 (79.1 GiB, CUDA runtime 13000)" in lines
    assert "- outside view: cudaMemGetInfo and NVML sampled every 5 ms" in lines
    # side by side: only batch 32 ran to the end with both pools; the savings are of the
    # memory taken seen from outside the pools (800 -> 400, 1500 -> 1200), not of their own
    # counts (400 -> 100)
    assert "| resnet50 | train | 32 | 800.0 / 400.0 | 1,500.0 / 1,200.0 | 50.0 % | 20.0 % " \
           "| 100.0 (96.0-103.0, 3 runs) / 110.0 (1 run) | 1.100 (1.07-1.15) |" in lines
    assert "| resnet50 | train | 32 | pgmo | 400.0 | 1,200.0 | 250.0 | 100.0 | 300.0 | 250.0 " \
           "| 1.200 | 110.0 (1 run) | 330 / 220 / 111 | optimized | not reported | 0 |" in lines
    assert "| resnet50 | train | 32 | stock | 800.0 | 1,500.0 | 250.0 | 400.0 | - | - | - " \
           "| 100.0 (96.0-103.0, 3 runs) | 300 / 200 / 101 | - | - | - |" in lines
    assert any(line.startswith("| resnet50 | train | 64 | stock | out of memory at iteration 4")
               for line in lines)
    assert "| resnet50 | 4,096.0 | pgmo | 90 | 6 |" in lines
    assert "| pgmo | 64 | 7 | 900.0 | - | 250.0 | 450.0 | 50.0 | 150 / 100 / 51 | 2 | 0 | 3 |" \
        in lines
    assert "| resnet50-train-b32-stock.run.json.gz | resnet50 | stock | 32 | 10 | 9000 " \
           "| 800.0 |" in lines


# ------------------------------------------------------------ NVML, from outside the pool
class FakeNvml:
    """Stands in for ``pynvml``: device memory in use and the processes' shares, as set."""

    class Process:
        def __init__(self, pid, used):
            self.pid, self.usedGpuMemory = pid, used

    def __init__(self, used=1000, processes=()):
        self.used, self.processes = used, dict(processes)

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("device", index)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return type("Memory", (), {"used": self.used})()

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [self.Process(pid, used) for pid, used in self.processes.items()]


def _outside_view():
    return _import_script("examples").load("outside_view")


def test_the_nvml_reader_reads_this_process_and_keeps_that_source():
    probe_module = _import_script("nvml_probe")
    nvml = FakeNvml(used=1000, processes={99: 5, 4242: 300})
    reader = probe_module.NvmlReader(nvml, pid=4242)
    assert reader() == 300 and reader.source == "process"
    del nvml.processes[4242]  # no longer listed: no reading, never the device's instead
    assert reader() is None and reader.source == "process"


def test_the_nvml_reader_falls_back_to_the_device_when_processes_are_hidden():
    """A container may hide process ids: then the device's used memory (the view's baseline,
    taken once the CUDA context exists, leaves other processes out)."""
    probe_module = _import_script("nvml_probe")
    nvml = FakeNvml(used=1000, processes={99: 5})
    reader = probe_module.NvmlReader(nvml, pid=4242)
    assert reader() == 1000 and reader.source == "device"
    nvml.processes[4242] = 300  # the source chosen at the baseline is kept
    nvml.used = 1800
    assert reader() == 1800


def test_without_nvidia_ml_py_the_probe_says_why(monkeypatch):
    probe_module = _import_script("nvml_probe")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if nvidia-ml-py were not installed
    nvml, why = probe_module.load_nvml()
    assert nvml is None and "nvidia-ml-py is not installed" in why


def test_the_outside_view_keeps_whole_run_and_interval_peaks_less_the_baseline():
    """Sampled by hand (a day-long interval): a peak inside an iteration, gone by its end,
    still counts; a reader that fails is counted and the others go on."""
    view_module = _outside_view()
    device = {"used": 500}
    calls = {"n": 0}

    def broken():
        calls["n"] += 1
        raise RuntimeError("NVML went away")

    view = view_module.OutsideView({"device": lambda: device["used"], "broken": broken},
                                   interval=86400).start()
    assert view.baseline == {"device": 500, "broken": None}
    device["used"] = 2000  # the arena taken while the profiled iteration's memory is held
    view.sample()
    device["used"] = 900  # ... and given back before the iteration ends
    assert view.mark() == {"device": 2000, "broken": None}
    device["used"] = 1100
    assert view.mark() == {"device": 1100, "broken": None}  # the next iteration's own peak
    summary = view.stop()
    assert summary["readings"]["device"] == {"baseline_bytes": 500, "peak_bytes": 2000,
                                             "taken_bytes": 1500}
    assert view.taken("broken") is None and summary["errors"] == calls["n"] > 0


def test_the_outside_view_samples_on_its_thread_between_marks():
    view_module = _outside_view()
    import threading

    seen = threading.Event()
    device = {"used": 100}

    def read():
        if device["used"] == 700:
            seen.set()
        return device["used"]

    view = view_module.OutsideView({"device": read}, interval=0.001).start()
    device["used"] = 700
    assert seen.wait(5)  # read by the thread, no mark needed
    device["used"] = 100
    summary = view.stop()
    assert summary["readings"]["device"]["peak_bytes"] == 700 and summary["samples"] > 2


# ------------------------------------------------------------ DenseNet-BC and recomputation
DENSENET_NAMES = [f"densenet-bc28-k4-train-b2-recompute-{r}-{p}.dry-run.json.gz"
                  for r in ("off", "on") for p in ("stock", "pgmo")]


@pytest.fixture(scope="module")
def densenet_dry_run(tmp_path_factory):
    """``scripts.record_traces --densenet 2`` as a CPU dry run: the four DenseNet-BC traces."""
    _chainer_or_skip()
    out_dir = tmp_path_factory.mktemp("densenet")
    out, _ = run_script("record_traces", "--device", -1, "--out-dir", out_dir,
                        "--arch", "--batchsize", "--densenet", 2)
    return out_dir, out


@needs_chainer
def test_record_traces_dry_run_records_densenet_four_ways(densenet_dry_run):
    import pgmo

    out_dir, out = densenet_dry_run
    assert "CPU DRY RUN" in out
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(DENSENET_NAMES)
    traces = {}
    for name in DENSENET_NAMES:
        trace = pgmo.read_trace(out_dir / name)
        meta = trace.metadata
        recompute, pool = name.split("-recompute-")[1].split(".")[0].split("-")
        assert (meta["recompute"], meta["pool"]) == (recompute == "on", pool)
        assert (meta["model"], meta["depth"], meta["growth_rate"], meta["batch_size"]) == \
            ("densenet-bc-28", 28, 4, 2)
        assert ("recomputed" in meta) == (recompute == "on")
        assert "forget" in meta.get("recomputed", "forget")
        assert meta["dry_run"] is True and meta["synthetic"] is True
        assert "dry run" in meta["recorded_by"].lower() and "no GPU recording" in meta["note"]
        # only the stock recording knows what its pool reserved
        assert ("reserved_peak" in meta) == (pool == "stock")
        if pool == "stock":
            assert "TraceRecorder" in meta["recorded_by"] and meta["reserved_peak"] > 0
        assert bundled.provenance_problems(meta) == [
            "a CPU dry run (dry_run: true), not a recording"], name
        assert len(trace) == meta["requests"] > 0
        assert trace.lower_bound() == meta["lower_bound"]
        traces[recompute, pool] = trace
    for pool in ("stock", "pgmo"):
        off, on = traces["off", pool], traces["on", pool]
        # Recomputation runs the bottlenecks again in backward (more requests) and frees
        # their outputs after forward (fewer bytes live at once), even in the stand-in.
        assert len(on) > len(off)
        assert on.lower_bound() < off.lower_bound()


@needs_chainer
def test_recompute_table_dry_run_prints_no_numbers(densenet_dry_run, tmp_path):
    out_dir, _ = densenet_dry_run
    report = tmp_path / "table.md"
    out, _ = run_script("recompute_table", out_dir, "--time-limit", 1, "-o", report)
    assert report.read_text().strip() == out.strip()
    lines = out.splitlines()
    assert lines[0] == "## DenseNet-BC: recomputation and pgmo"
    assert "CPU DRY RUN" in out
    rows = [line.split(" | ") for line in lines if line.startswith("| DenseNet-BC-28 (k=4) | 2 |")]
    assert [r[2:4] for r in rows[:4]] == [["off", "stock (CuPy)"], ["off", "pgmo"],
                                          ["on", "stock (CuPy)"], ["on", "pgmo"]]
    assert [r[2] for r in rows[4:]] == ["off", "on"]
    for row in rows:
        cells = [c.strip(" |") for c in row[4 if len(row) > 6 else 3:]]
        assert cells and all(c == "n/a (CPU)" for c in cells), row


def _densenet_trace(path, recompute, pool, rows, reserved=None):
    """A trace with the metadata record_traces.py --densenet writes on a GPU."""
    import pgmo

    meta = {"model": "densenet-bc-100", "depth": 100, "growth_rate": 12, "kind": "training",
            "batch_size": 64, "recompute": recompute, "pool": pool, "dry_run": False,
            "synthetic": False, "device": "NVIDIA H100 80GB HBM3", "date": "2025-01-31T12:00:00",
            "command": "record_traces.py --device 0 --densenet 64", "cupy": "14.2.0"}
    if recompute:
        meta["recomputed"] = "the bottlenecks"
    if reserved is not None:
        meta["reserved_peak"] = reserved
    pgmo.write_trace(pgmo.Trace.from_rows(rows, meta), path)
    return path


def _import_script(name):
    return importlib.import_module(f"scripts.{name}")


def test_recompute_table_compares_measured_with_measured_and_plan_with_plan(tmp_path):
    """A GPU recording's table: the stock pool's measured reservation changes against its own
    without recomputation, pgmo's plan against its own plan, and every plan cell says so."""
    table = _import_script("recompute_table")
    mib = 2**20
    # off: two 100 MiB blocks live together; on: they no longer overlap.
    off = [(0, 2, 100 * mib), (1, 3, 100 * mib)]
    on = [(0, 1, 100 * mib), (1, 3, 100 * mib), (2, 4, 50 * mib)]
    paths = [_densenet_trace(tmp_path / "off-stock.json.gz", False, "stock", off, 300 * mib),
             _densenet_trace(tmp_path / "on-pgmo.json.gz", True, "pgmo", on),
             _densenet_trace(tmp_path / "off-pgmo.json.gz", False, "pgmo", off),
             _densenet_trace(tmp_path / "on-stock.json.gz", True, "stock", on, 240 * mib)]
    text = table.section(table.analyse(paths, "best", 1.0), "best", 1.0)
    assert "n/a (CPU)" not in text and "DRY RUN" not in text
    lines = text.splitlines()
    assert "- device: NVIDIA H100 80GB HBM3; versions: pgmo unknown, cupy 14.2.0, " \
           "chainer unknown, numpy unknown, python unknown" in lines
    assert "- recorded with: `record_traces.py --device 0 --densenet 64`" in lines
    head = "| DenseNet-BC-100 (k=12) | 64 | "
    assert [line for line in lines if line.startswith(head) and line.count("|") == 10] == [
        head + "off | stock (CuPy) | 2 | 200.0 | 200.0 | 200.0 | 300.0 |",
        head + "off | pgmo | 2 | 200.0 | 200.0 | 200.0 | - |",
        head + "on | stock (CuPy) | 3 | 150.0 | 150.0 | 150.0 | 240.0 |",
        head + "on | pgmo | 3 | 150.0 | 150.0 | 150.0 | - |"]
    assert "| model | batch | recompute | stock pool: reserved, measured (MiB) " \
           "| lower bound (MiB) | pgmo: best plan, not measured (MiB) |" in lines
    compose = [line for line in lines if line.startswith(head) and line.count("|") == 7]
    # 240 against 300 measured (-20 %), the plan 150 against the plan 200 (-25 %); never the
    # plan against the measured reservation (150 against 300 would read -50 %)
    assert compose == [head + "off | 300.0 | 200.0 | plan 200.0 |",
                       head + "on | 240.0 (-20.0 %) | 150.0 | plan 150.0 (-25.0 %) |"]
    assert "-50.0 %" not in text and "-33.3 %" not in text


def test_recompute_table_skips_other_traces_in_a_folder_and_refuses_one_named(tmp_path):
    import pgmo

    table = _import_script("recompute_table")
    _densenet_trace(tmp_path / "densenet.json.gz", False, "pgmo", [(0, 1, 512)])
    other = tmp_path / "resnet50.json.gz"
    pgmo.write_trace(pgmo.Trace.from_rows([(0, 1, 512)], {"model": "resnet50"}), other)
    assert [p.name for p in table.find_traces([tmp_path])] == ["densenet.json.gz"]
    with pytest.raises(ValueError, match="not a trace of record_traces.py --densenet"):
        table.find_traces([other])
    from pgmo import programs

    assert programs.run(lambda: table.main([str(other)]), name="recompute_table") == 2
    assert "No DenseNet-BC trace found" in table.section([])  # bench_memory's empty section


@needs_chainer
def test_bench_memory_dry_run_ends_with_the_recomputation_table(tmp_path):
    _chainer_or_skip()
    out, err = run_script("bench_memory", "--device", -1, "--arch", "--no-inference",
                          "--search-arch", "--seq2seq-iterations", 0,
                          "--trace-dir", tmp_path / "traces")
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == sorted(DENSENET_NAMES)
    section = out[out.index("## DenseNet-BC: recomputation and pgmo"):]
    assert "CPU DRY RUN" in section
    # the traces' command names no folder of this machine
    assert "- recorded with: `record_traces.py --device -1 --out-dir . --arch --batchsize " \
           "--densenet 2`" in section
    rows = [line for line in section.splitlines() if line.startswith("| DenseNet-BC-28 (k=4)")]
    assert len(rows) == 6 and all("n/a (CPU)" in row for row in rows)
    assert re.search(r"time per part: .*seq2seq \d+ s, recomputation \d+ s, largest batch", out)
    assert "failed" not in err and "Recording stopped early" not in out


@pytest.mark.gpu
@needs_chainer
def test_record_traces_densenet_on_the_gpu(tmp_path):
    """Real recordings: complete provenance, a stock pool reserving at least what is live, and
    recomputation lowering the most bytes live at once under both pools."""
    _chainer_or_skip()
    import pgmo

    run_script("record_traces", "--device", 0, "--out-dir", tmp_path, "--arch",
               "--batchsize", "--densenet", 16, "--densenet-depth", 40, "--growth-rate", 12)
    traces = {}
    for recompute in ("off", "on"):
        for pool in ("stock", "pgmo"):
            path = tmp_path / f"densenet-bc40-k12-train-b16-recompute-{recompute}-{pool}.json.gz"
            trace = pgmo.read_trace(path)
            assert bundled.provenance_problems(trace.metadata) == [], path.name
            assert trace.metadata["dry_run"] is False and trace.metadata["pool"] == pool
            traces[recompute, pool] = trace
    for recompute in ("off", "on"):
        stock = traces[recompute, "stock"]
        assert stock.metadata["reserved_peak"] >= stock.lower_bound() > 0
    for pool in ("stock", "pgmo"):
        assert traces["on", pool].lower_bound() < traces["off", pool].lower_bound()


def test_a_live_bytes_hook_counts_the_requests_of_any_pool():
    cupy = pytest.importorskip("cupy")
    from pgmo.measure.hosts import host_pool

    hook = _import_script("examples").load("live_bytes").LiveBytes(0)
    with hook:
        pool = host_pool(warmup=1)
        with pool:
            for _ in range(3):
                with pool.iteration():
                    a = cupy.cuda.alloc(1000)  # 1024 once rounded
                    b = cupy.cuda.alloc(3000)  # 3072
                    del a
                    c = cupy.cuda.alloc(100)  # 512
                    del b, c
                assert hook.mark() == 4096 and hook.now == 0
    assert hook.peak == 4096
