"""``scripts/`` is one package: programs run with ``python -m scripts.<name>``, no import cycle.

The module graph is read from the source (every import, at module level or
inside a function, relative or absolute), so a cycle hidden in a function
body counts too.  Every program answers ``--help``, and those that run on a
CPU in seconds run once for real at tiny sizes, as a user starts them; the
GPU programs' dry runs are in ``tests/test_gpu_scripts.py``.  The commands
the documentation and ``gpu_session.sh`` give name programs that exist.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import import_graph
from .import_graph import find_cycle, imports_in
from .program_needs import skip_unless_installed

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "scripts"
#: The one module that may touch sys.path: it makes examples/ importable.
PATH_HELPER = "scripts.examples"

def module_name(path: Path) -> str:
    return import_graph.module_name(path, PACKAGE)


def graph() -> dict[str, set[str]]:
    return import_graph.graph(PACKAGE)


def programs() -> list[str]:
    """The modules of ``scripts/`` that run as programs (``if __name__ == "__main__"``)."""
    return sorted(p.stem for p in PACKAGE.glob("*.py")
                  if re.search(r'^if __name__ == "__main__":', p.read_text(), re.M))


# ------------------------------------------------------------------ the package
def test_the_scripts_import_each_other_without_a_cycle():
    edges = graph()
    assert "scripts.record_traces" in edges and "scripts.bench_memory" in edges
    assert "scripts.chainer_workloads" in edges["scripts.record_traces"]  # relative, read
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function():
    edges = {"scripts.a": {"scripts.b"}, "scripts.b": {"scripts.c"},
             "scripts.c": {"scripts.a"}, "scripts.d": set()}
    assert find_cycle(edges) == ["scripts.a", "scripts.b", "scripts.c", "scripts.a"]
    hidden = imports_in("def f():\n    from .bench_memory import report\n", "scripts.x")
    assert {"scripts.bench_memory", "scripts.bench_memory.report"} <= hidden


def test_only_the_examples_helper_touches_sys_path():
    for path in PACKAGE.rglob("*.py"):
        if module_name(path) == PATH_HELPER:
            continue
        tree = ast.parse(path.read_text())
        touched = [node.lineno for node in ast.walk(tree)
                   if isinstance(node, ast.Attribute) and node.attr == "path"
                   and isinstance(node.value, ast.Name) and node.value.id == "sys"]
        assert not touched, f"{path.relative_to(ROOT)}:{touched[0]} uses sys.path " \
                            f"(load the examples through {PATH_HELPER})"


def test_the_package_docstring_lists_every_program_and_module():
    doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text()))
    listed = set(re.findall(r"^``(\w+)``", doc, re.M))
    assert listed == set(programs())
    shared = set(re.findall(r":mod:`~scripts\.(\w+)`", doc))
    assert shared == {p.stem for p in PACKAGE.glob("*.py")} - listed - {"__init__"}


# ------------------------------------------------------------------ every program runs
def run(program: str, *args, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m scripts.<program> ARGS`` from the repository root, as a user runs it."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", f"scripts.{program}", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.parametrize("program", programs())
def test_every_program_answers_help(program):
    skip_unless_installed(program)
    done = run(program, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: ") and "--help" in done.stdout


SHARED = sorted({p.stem for p in PACKAGE.glob("*.py")} - set(programs()) - {"__init__"})


@pytest.mark.parametrize("module", ["children", "numpy_mirror"])
def test_a_shared_module_run_as_a_program_says_it_is_none_in_one_line(module):
    assert module in SHARED
    done = run(module, "--help")
    assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.startswith(f"{module}.py: error: scripts.{module} is a module the "
                                  "programs share, not a program; the programs: ")
    assert "bench_solver" in done.stderr.split("the programs: ")[1]


@pytest.mark.parametrize("module", SHARED)
def test_every_shared_module_imports_first_in_a_fresh_interpreter(module):
    for needed in ("cupy", "chainer"):  # some of them import these
        if importlib.util.find_spec(needed) is None:
            pytest.skip(f"needs {needed}")
    done = subprocess.run([sys.executable, "-c", f"import scripts.{module}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


def test_bench_solver_runs_on_a_tiny_instance(tmp_path):
    trace = tmp_path / "tiny.csv"
    trace.write_text("id,lower,upper,size\n0,0,2,3\n1,1,3,2\n2,2,4,3\n")
    out = _ok(run("bench_solver", trace, "--random", 20, "--methods", "bestfit"))
    assert re.search(r"^\| tiny \| 3 \| 5 \| - \| 5 \| ", out, re.M)
    assert "Summary (all instances): **bestfit** peak/LB" in out
    out = _ok(run("bench_solver", "--bestfit-timing", "--n", 100, "--repeat", 1))
    assert "| random-short (seed 100000) | 100 |" in out and out.rstrip().endswith(
        "Y_1: not given")


def readme_command(program: str) -> list[str]:
    """The arguments the CPU quick start (the site's *More without a GPU*) gives
    ``python -m scripts.<program>``."""
    [line] = re.findall(rf"^ +\.venv/bin/python -m scripts\.{program} (.+)$",
                        (ROOT / "docs" / "quickstart.rst").read_text(), re.M)
    return line.split()


def test_bench_footprint_runs_one_workload_in_one_mode_as_the_readme_says():
    from scripts import bench_footprint

    argv = readme_command("bench_footprint")
    assert argv == ["--only", "alexnet-infer", "--modes", "sync/best", "--no-limits"]
    done = run("bench_footprint", *argv, timeout=300)
    out = _ok(done)
    assert out.startswith("# Device footprint and syncs over whole runs (CPU model)")
    assert "- command: `python -m scripts.bench_footprint --only alexnet-infer --modes " \
           "sync/best --no-limits`" in out
    assert "h100-alexnet-infer-b1" in out and "## Against the targets" in out
    # the strict bound is labelled by what it covers: not one iteration's
    assert "the most bytes live at once over the whole run, weights and optimizer state " \
           "included" in out
    # progress on stderr, a line per step, also when no one watches a terminal
    assert re.findall(r"^  h100-alexnet-infer-b1: (.+) done, \d+ s$", done.stderr, re.M) == \
        ["CuPy's pool", *(f"sync/best [{heap}]" for heap in bench_footprint.HEAP_MODELS)]


def test_bench_import_runs_on_a_small_snapshot():
    out = _ok(run("bench_import", "--events", 3000, "--repeat", 1, "--time-limit", 0.2))
    assert out.startswith("synthetic PyTorch snapshot: 3,000 events")
    assert "| **import + lower bound + bestfit** |" in out


def test_bench_malloc_runs_on_the_host():
    skip_unless_installed("bench_malloc")
    out = _ok(run("bench_malloc", "-n", 200, "--iterations", 2, "--repeat", 1))
    rows = [line.split(" | ")[1] for line in out.splitlines() if line.startswith("| pairs |")]
    assert rows[:2] == ["trivial python allocator", "host fallback pool alone"]
    assert any(row.startswith("pgmo optimized") for row in rows)


def test_bench_overhead_runs_a_few_iterations():
    skip_unless_installed("bench_overhead")
    out = _ok(run("bench_overhead", "--workloads", "h100-alexnet-train-b32", "--runs", 1,
                  "--iterations", 6, "--time-limit", 0.2, "--launches", 10))
    rows = [line.split(" | ")[:3] for line in out.splitlines()
            if line.startswith("| h100-alexnet-train-b32 |")]
    assert rows == [["| h100-alexnet-train-b32", mode, "this"]
                    for mode in ("sync", "bestfit", "background")]
    from pgmo.engine.hot_path_choice import compiled

    ran = "compiled" if compiled() else "plain Python"
    assert f"hot path run: this: {ran}" in out  # what the boundaries' times are of


def test_bench_overhead_says_a_stale_compiled_hot_path_ran_plain(monkeypatch):
    """A checkout copied without its files' times looks edited since it was compiled: the
    bench says its boundaries are the plain-Python hot path's."""
    from pgmo.engine import hot_path_choice
    from scripts import bench_overhead

    monkeypatch.setattr(hot_path_choice, "_stale", lambda: True)
    monkeypatch.delenv("PGMO_PURE_PYTHON", raising=False)
    expected = ("plain Python (its compiled module is stale)" if hot_path_choice.COMPILED
                else "plain Python")
    assert bench_overhead.hot_path_run() == expected
    rows = {("w", "background", "this"): [{"hot_path": expected}],
            ("w", "background", "old"): [{"hot_path": "compiled"}]}
    assert bench_overhead.hot_paths(rows, ["this", "old"]) == f"this: {expected}; old: compiled"


def test_a_busy_core_is_kept_busy_while_inside_and_stopped_after():
    from scripts.children import busy_core

    with busy_core() as proc:
        assert proc is not None and proc.poll() is None
    assert proc.poll() is not None  # stopped and reaped
    with busy_core(False) as none:
        assert none is None


def test_recompute_table_runs_on_a_trace_folder(tmp_path):
    import pgmo

    meta = {"model": "densenet-bc-100", "depth": 100, "growth_rate": 12, "batch_size": 64,
            "recompute": False, "pool": "stock", "dry_run": False, "reserved_peak": 2048,
            "command": "record_traces.py --densenet 64"}
    pgmo.write_trace(pgmo.Trace.from_rows([(0, 2, 1024), (1, 3, 512)], meta),
                     tmp_path / "densenet.json.gz")
    out = _ok(run("recompute_table", tmp_path, "--method", "bestfit", "--time-limit", 1))
    assert out.startswith("## DenseNet-BC: recomputation and pgmo")
    assert "| DenseNet-BC-100 (k=12) | 64 | off | stock (CuPy) | 2 |" in out


@pytest.mark.chainer
def test_record_runs_records_a_tiny_whole_run(tmp_path):
    skip_unless_installed("record_runs")
    _ok(run("record_runs", "--workload", "seq2seq", "--iterations", 2, "--batchsize", 2,
            "--vocab", 20, "--units", 8, "--layers", 1, "--sentences", 10,
            "--out-dir", tmp_path))
    from pgmo.runs import read_run

    run_file = read_run(tmp_path / "seq2seq-train-b2-2batches-cpu.run.json.gz")
    assert len(run_file.iterations) == 2
    assert run_file.metadata["command"].startswith("record_runs.py --workload seq2seq")


# ------------------------------------------------------------------ the commands given
def _commands(text: str) -> list[str]:
    return re.findall(r"-m scripts\.([a-z][a-z_]*)", text)


def test_the_session_script_and_the_documents_name_programs_that_exist():
    names = set(programs())
    # docs/results.md quotes the commands the 2026-11-25 session ran, as its log has them
    docs = [p for p in sorted((ROOT / "docs").glob("*.*")) if p.suffix in (".md", ".rst")
            and p.name != "results.md"]
    files = [PACKAGE / "gpu_session.sh", ROOT / "README.rst", ROOT / "examples" / "README.rst",
             *docs, *sorted(PACKAGE.glob("*.py"))]
    seen = set()
    for path in files:
        text = path.read_text()
        assert not re.search(r"python3? scripts/\w+\.py", text), \
            f"{path.relative_to(ROOT)} runs a script by its path: python -m scripts.<name>"
        for name in _commands(text):
            assert name in names, f"{path.relative_to(ROOT)} names scripts.{name}"
            seen.add(name)
    assert {"gpu_quick_check", "record_traces", "bench_malloc", "bench_memory"} <= \
        set(_commands((PACKAGE / "gpu_session.sh").read_text()))
    assert "bench_solver" in seen and "results_table" in seen


def test_a_cupy_program_without_cupy_says_so_in_one_line():
    """Where CuPy is not installed, a program that needs it says so: one line, status 2."""
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: the suite without CuPy runs this")
    done = run("bench_malloc", "-n", 10)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "bench_malloc.py: error: needs CuPy (pip install 'pgmo[cuda13]', or cuda12), "
        "which is not installed"]
