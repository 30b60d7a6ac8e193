"""Every program (``scripts/``, ``examples/``, the ``pgmo`` command) is as polite as ``pgmo``.

What a newcomer meets, program by program: Ctrl-C answered with one line and
exit status 130 (children started as a user starts them, all at once, each
interrupted once it has printed its first sign of work), defaults in every
``--help``, a missing path, an output into a missing folder or an unknown
name answered with one line before anything runs (the closest name where
there is one), and no CuPy NCCL warning from a program that uses no NCCL.
The help texts and the mistakes are read in-process, from each program's own
parser; only the Ctrl-C checks start processes.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pgmo import programs

from .example_modules import EXAMPLES, load_example
from .program_needs import skip_unless_installed

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"

#: Programs that keep a Ctrl-C handling of their own, and why.
OWN_HANDLING = {
    "gpu_quick_check": "a GPU session's step: on Ctrl-C or SIGTERM it writes what it has "
                       "measured so far and exits 0, for the session to go on",
}
#: Modules whose import before programs.start() would leave a Ctrl-C to Python's traceback.
HEAVY = ("chainer", "chainermn", "cupy", "mpi4py", "pgmo.chainer", "pgmo.chainermn",
         "pgmo.pool", "pgmo.testing", "pgmo.trace_recorder")


def _is_program(path: Path) -> bool:
    return re.search(r'^if __name__ == "__main__":', path.read_text(), re.M) is not None


SCRIPT_PROGRAMS = sorted(p.stem for p in SCRIPTS.glob("*.py")
                         if _is_program(p) and p.stem not in OWN_HANDLING)
EXAMPLE_PROGRAMS = sorted(p.name for p in Path(EXAMPLES).glob("*.py") if _is_program(p))


def _source(program: str) -> Path:
    return Path(EXAMPLES) / program if program.endswith(".py") else SCRIPTS / f"{program}.py"


# ------------------------------------------------------------------ how each is built
def _top_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(statement index, module) of each top-level import, relative ones as '.name'."""
    found = []
    for k, node in enumerate(tree.body):
        if isinstance(node, ast.Import):
            found += [(k, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found += [(k, module + alias.name if node.module is None else
                       f"{module}.{alias.name}" if node.module == "pgmo" else module)
                      for alias in node.names]
    return found


def _heavy_imports(path: Path, seen: set[Path] | None = None) -> list[str]:
    """The heavy modules a module imports at its top level, through this package's own."""
    seen = set() if seen is None else seen
    if path in seen:
        return []
    seen.add(path)
    heavy = []
    for _, module in _top_imports(ast.parse(path.read_text())):
        name = module.lstrip(".")
        if module.startswith(".") and (path.parent / f"{name.split('.')[0]}.py").exists():
            heavy += _heavy_imports(path.parent / f"{name.split('.')[0]}.py", seen)
        elif any(name == h or name.startswith(h + ".") for h in HEAVY):
            heavy.append(name)
    return heavy


def _start_index(tree: ast.Module) -> int | None:
    for k, node in enumerate(tree.body):
        if isinstance(node, ast.Expr) and ast.unparse(node) == "programs.start(__name__)":
            return k
    return None


@pytest.mark.parametrize("program", SCRIPT_PROGRAMS + EXAMPLE_PROGRAMS)
def test_every_program_runs_politely_from_its_first_import(program):
    """``programs.run(main)`` runs it, its parser is ``programs.ArgumentParser``, and a
    Ctrl-C during its imports is answered too: ``programs.start`` comes before any
    import that takes time (Chainer, CuPy), or it imports none before ``main``."""
    path = _source(program)
    text = path.read_text()
    tree = ast.parse(text)
    assert re.search(r'^if __name__ == "__main__":.*\n    (sys\.exit|raise SystemExit)'
                     r'\(programs\.run\(main[,)]', text, re.M), f"{program}: not run politely"
    assert "argparse.ArgumentParser(" not in text, f"{program}: a parser without defaults"
    start = _start_index(tree)
    if start is None:
        assert not _heavy_imports(path), f"{program} imports {_heavy_imports(path)} " \
                                         "before a Ctrl-C is answered: call programs.start"
        return
    before = [module for k, module in _top_imports(tree) if k < start
              and module.split(".")[0] not in sys.stdlib_module_names]
    assert before == ["pgmo.programs"], f"{program}: {before} imported before programs.start"


# ------------------------------------------------------------------ --help
class _Parsed(Exception):
    """Raised instead of parsing: carries the program's parser."""


def _parsers(program: str, monkeypatch) -> list[programs.ArgumentParser]:
    """The parsers a program builds, caught as it parses (before it runs anything)."""
    if program == "pgmo":
        from pgmo.cli import build_parser

        parser = build_parser()
        return [parser, *parser._subparsers._group_actions[0].choices.values()]

    def caught(self, *args, **kwargs):
        raise _Parsed(self)

    monkeypatch.setattr(programs.ArgumentParser, "parse_args", caught)
    module = load_example(program[:-3]) if program.endswith(".py") else \
        importlib.import_module(f"scripts.{program}")
    with pytest.raises(_Parsed) as parsed:
        module.main([])
    return [parsed.value.args[0]]


def _has_default(action) -> bool:
    default = action.default
    return bool(action.option_strings) and default is not None and not isinstance(default, bool) \
        and default is not argparse.SUPPRESS and default not in ([], ())


@pytest.mark.parametrize("program", SCRIPT_PROGRAMS + sorted(OWN_HANDLING) + EXAMPLE_PROGRAMS
                         + ["pgmo"])
def test_every_help_shows_every_default(program, monkeypatch):
    skip_unless_installed(program)
    for parser in _parsers(program, monkeypatch):
        parser.format_help()  # as --help: options without help get their default as help
        for action in parser._actions:
            if not _has_default(action):
                continue
            formatter = parser._get_formatter()
            formatter.add_argument(action)
            shown = " ".join(formatter.format_help().split())
            assert "default" in shown, f"{parser.prog} {action.option_strings}: {shown}"


def test_the_pgmo_commands_offer_only_what_they_do(capsys):
    from pgmo.cli import main

    with pytest.raises(SystemExit):
        main(["check", "--help"])
    text = capsys.readouterr().out
    assert "--verbose" not in text and "solver" not in text  # check solves nothing
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "The whole pipeline on a bundled trace" in text  # a description
    assert "10 s and 2.4 GB of memory" in text


# ------------------------------------------------------------------ mistakes
MISTAKES = [
    ("bench_footprint", ["--traces", "/nonexistent"],
     "argument --traces: no such folder: /nonexistent"),
    ("bench_footprint", ["-o", "/nonexistent/dir/report.md"],
     "cannot write /nonexistent/dir/report.md: no folder /nonexistent/dir (make it first)"),
    ("bench_footprint", ["--modes", "sync/bst"],
     "invalid choice: 'sync/bst'; did you mean 'sync/best'?"),
    ("bench_import", ["--trace", "resnet50-train"],
     "no bundled trace 'resnet50-train'; did you mean 'synthetic-resnet50-train-b32'?"),
    ("bench_overhead", ["--workloads", "resnet50"],
     "did you mean 'synthetic-resnet50-infer-b1' or 'synthetic-resnet50-train-b32'?"),
    ("bench_overhead", ["--workloads", ","],
     "--workloads ',' names no workload (real, family, or names)"),
    ("bench_overhead", ["--raw", "/"], "--raw /: a folder; give a file to write"),
    ("bench_overhead", ["--modes", "sync,nosuch"],
     "--modes nosuch: the modes are sync, bestfit, background"),
    ("bench_solver", ["-o", "/nonexistent/dir/solver.md"],
     "cannot write /nonexistent/dir/solver.md: no folder /nonexistent/dir (make it first)"),
    ("bench_malloc", ["-n", "0"], "-n must be at least 1, got 0"),
    ("bench_solver", ["/nonexistent"], "argument inputs: no such file or folder: /nonexistent"),
    ("bench_solver", ["--bestfit-timing", "--n", "200", "/nonexistent"],
     "argument inputs: no such file or folder: /nonexistent"),
    ("recompute_table", ["/nonexistent"], "no such file or folder: /nonexistent"),
    ("recompute_table", [str(ROOT / "docs")], "error: no DenseNet-BC trace "
     f"in {ROOT / 'docs'} (python -m scripts.record_traces --densenet B writes them)"),
    ("recompute_table", [str(ROOT / "README.rst")],
     f"error: {ROOT / 'README.rst'}, line 1, field 'id': missing column"),
    ("results_table", ["/nonexistent"], "no such folder: /nonexistent"),
    ("results_table", [str(ROOT), "-o", "/nonexistent/results.md"], "no folder /nonexistent"),
    ("bench_memory", ["--device", "-1", "-o", "/nonexistent/r.md"], "no folder /nonexistent"),
    ("mirror_fidelity", ["--out", "/nonexistent/f.json"], "no folder /nonexistent"),
    ("record_runs", ["--workload", "resnet50", "--fidelity", "/nonexistent.json"],
     "no such file: /nonexistent.json"),
    ("record_traces", ["--device", "-1", "--out-dir", "/nonexistent/traces"],
     "cannot make /nonexistent/traces: no folder /nonexistent (make it first)"),
    ("train_imagenet.py", ["--arch", "resnet"], "did you mean 'resnet50'"),
    ("train_mn.py", ["--out", "/nonexistent/result"], "no folder /nonexistent"),
    ("one_liner.py", ["--device", "-2"],
     "argument --device/-d: expects a device number (-1: the CPU) >= -1, got '-2'"),
    ("one_liner.py", ["--warmup", "-1"], "argument --warmup: expects an integer >= 0, got '-1'"),
    ("train_imagenet.py", ["--device", "-1", "--warmup", "-1"],
     "argument --warmup: expects an integer >= 0, got '-1'"),
    ("train_imagenet.py", ["--device", "-1", "--time-limit", "-1"],
     "argument --time-limit: must be a number >= 0, got -1"),
    ("densenet.py", ["--device", "-1", "--warmup", "-1"],
     "argument --warmup: expects an integer >= 0, got '-1'"),
    ("seq2seq.py", ["--device", "-1", "--warmup", "-1"],
     "argument --warmup: expects an integer >= 0, got '-1'"),
    ("gpu_quick_check", ["--dry-run", "--out", str(ROOT / "README.rst")],
     f"argument --out/-o: {ROOT / 'README.rst'} is a file, not a folder"),
    ("bench_memory", ["--device", "-1", "--batchsize", "0"],
     "argument --batchsize/-b: expects an integer >= 1, got '0'"),
    ("bench_memory", ["--device", "-1", "--vocab", "2"],
     "argument --vocab: expects an integer >= 3, got '2'"),
    ("bench_memory", ["--device", "-1", "--time-limit", "-2"],
     "argument --time-limit: must be a number >= 0, got -2"),
    ("bench_footprint", ["--time-limit", "-1"],
     "argument --time-limit: must be a number >= 0, got -1"),
    ("pgmo", ["demo", "-o", "demo.txt"], "cannot draw demo.txt: a picture ends in one of .png"),
    ("pgmo", ["analyze", "h100-alexnet-infer-b1", "--plot", "a.txt"],
     "cannot draw a.txt: a picture ends in one of .png"),
    ("pgmo", ["plot", "h100-alexnet-infer-b1", "-o", "/nonexistent/dir/p.png"],
     "cannot write /nonexistent/dir/p.png: no folder /nonexistent/dir (make it first)"),
    ("pgmo", ["solve", "h100-alexnet-infer-b1", "--time-limt", "2"],
     "pgmo solve: error: unrecognized arguments: --time-limt 2; did you mean --time-limit?"),
    ("pgmo", ["demo", "--trace", "resnet50"], "no bundled trace 'resnet50'; did you mean "
     "'synthetic-resnet50-infer-b1' or 'synthetic-resnet50-train-b32'?"),
    ("pgmo", ["analyze", "resnet50-train-b32"],
     "did you mean the bundled trace 'synthetic-resnet50-train-b32'?"),
]


@pytest.mark.parametrize("program, argv, said", MISTAKES)
def test_a_mistake_is_one_line_before_anything_runs(program, argv, said, capsys):
    skip_unless_installed(program)
    if program == "pgmo":
        from pgmo.cli import main
    else:
        module = load_example(program[:-3]) if program.endswith(".py") else \
            importlib.import_module(f"scripts.{program}")
        main = module.main  # noqa: N806
    try:
        code = programs.run(lambda: main(argv), name=program)
    except SystemExit as stop:  # argparse's: one line too
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.splitlines() == [err.splitlines()[-1]] and said in err, err  # one line


def test_bench_footprint_names_the_closest_workload_to_an_unknown_one(capsys):
    from scripts import bench_footprint

    args = bench_footprint.parse_args(["--only", "alexnet-inferr", "--traces",
                                       str(ROOT / "tests" / "data" / "gpu-evidence")])
    with pytest.raises(programs.UsageError, match="no traces"):
        bench_footprint.all_workloads(args)  # a folder without traces is no silent run
    args = bench_footprint.parse_args(["--only", "alexnet-inferr"])
    with pytest.raises(programs.UsageError, match="no workload matching 'alexnet-inferr'; did "
                                                  "you mean 'h100-alexnet-infer-b1'"):
        bench_footprint.all_workloads(args)


# ------------------------------------------------------------------ Ctrl-C
#: Each program as a user starts it, made to run long, and the line after which it is
#: interrupted (its first sign of work; "still working" when it prints nothing else).
CTRL_C = {
    "bench_footprint": ([], r"done, \d+ s$"),
    "bench_solver": ([], r"^### "),
    "bench_import": ([], "still working"),
    "bench_malloc": ([], "still working"),
    "bench_overhead": ([], r"^workloads: "),
    "bench_memory": (["--device", "-1"], "device: CPU"),
    "record_traces": (["--device", "-1", "--out-dir", "{tmp}/traces"], "CPU DRY RUN"),
    "record_runs": (["--workload", "resnet50", "--out-dir", "{tmp}/runs"], "still working"),
    "mirror_fidelity": ([], "still working"),
    "one_liner.py": (["--device", "-1", "--iterations", 10**6, "--batchsize", 8, "--inputs",
                      32, "--hidden", 16, "--classes", 4, "-v"], r"iter\s+1 "),
    "train_imagenet.py": (["--device", "-1", "--arch", "alexnet", "--insize", 39,
                           "--batchsize", 2, "--iterations", 10**6, "--classes", 10],
                          r"iter\s+1 "),
    "seq2seq.py": (["--device", "-1", "--vocab", 50, "--units", 16, "--layers", 1,
                    "--batchsize", 4, "--iterations", 10**6], r"^1\s"),
    "densenet.py": (["--device", "-1", "--depth", 10, "--growth-rate", 4, "--insize", 8,
                     "--batchsize", 2, "--iterations", 10**6], r"iter\s+1 "),
    "train_mn.py": (["--device", "-1", "--arch", "mlp", "--insize", 8, "--batchsize", 4,
                     "--iterations", 10**6, "--classes", 4], r"^1\s"),
}


class _Child:
    """One program started as a user starts it; interrupted once ``ready`` is printed."""

    def __init__(self, program: str, argv: list, ready: str, tmp: Path):
        command = [sys.executable, str(_source(program))] if program.endswith(".py") else \
            [sys.executable, "-m", f"scripts.{program}"]
        command += [str(a).format(tmp=tmp) for a in argv]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
        self.ready, self.lines, self.interrupted_after = re.compile(ready), [], None
        self.started = time.monotonic()
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if self.interrupted_after is None and self.ready.search(line.rstrip("\n")):
                self.interrupted_after = time.monotonic() - self.started
                self.proc.send_signal(signal.SIGINT)

    def finish(self, deadline: float) -> int:
        try:
            code = self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.reader.join(timeout=10)
        return code


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """Every program of :data:`CTRL_C` started at once, each sent SIGINT once it shows work."""
    tmp = tmp_path_factory.mktemp("ctrl-c")
    runnable = {p: v for p, v in CTRL_C.items()
                if not (p in ("train_mn.py",) and importlib.util.find_spec("mpi4py") is None)}
    children = {p: _Child(p, argv, ready, tmp) for p, (argv, ready) in runnable.items()}
    deadline = time.monotonic() + 240
    return {p: (child.finish(deadline), child) for p, child in children.items()}


@pytest.mark.parametrize("program", sorted(CTRL_C))
def test_ctrl_c_is_one_line_and_exit_status_130(program, interrupted):
    skip_unless_installed(program)
    if program not in interrupted:
        pytest.skip("needs mpi4py and an MPI (pip install 'pgmo[mpi]')")
    code, child = interrupted[program]
    text = "\n".join(child.lines)
    assert child.interrupted_after is not None, f"never showed work:\n{text[-3000:]}"
    name = program if program.endswith(".py") else f"{program}.py"
    assert code == programs.INTERRUPTED, text[-3000:]
    assert child.lines[-1] == f"{name}: interrupted", text[-3000:]
    assert text.count("interrupted") == 1 and "Traceback" not in text, text[-3000:]
    assert "nccl" not in text.lower(), text[:3000]  # no NCCL warning: none uses NCCL
