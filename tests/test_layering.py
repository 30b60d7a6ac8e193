"""Data flows one way: the core never loads CuPy, Chainer or the adapters, and no import cycles.

The module graph is read from the source (every ``import``, at module level
or inside a function), so a cycle hidden in a function body counts too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from . import import_graph
from .import_graph import find_cycle

PACKAGE = Path(__file__).resolve().parents[1] / "pgmo"

#: Modules that talk to CuPy, Chainer or the user: the core never imports them.
ADAPTERS = {"pgmo.pool", "pgmo.pool_plans", "pgmo.device.cuda", "pgmo.cuda_device", "pgmo.hooks", "pgmo.testing", "pgmo.footprint", "pgmo.trace_recorder",
            "pgmo.measure.hosts", "pgmo.measure.replay", "pgmo.measure.footprint",
            "pgmo.chainer", "pgmo.chainermn", "pgmo._chainer_compat", "pgmo.cli", "pgmo.demo", "pgmo.__main__"}
#: The device layer: below the engine's Backend, it never imports the engine.
DEVICE = "pgmo.device"
#: Third-party modules only adapters may import.
FOREIGN = {"cupy", "cupy_backends", "chainer", "chainermn", "mpi4py", "torch", "rmm"}


def module_name(path: Path) -> str:
    return import_graph.module_name(path, PACKAGE)


def imports_of(path: Path) -> set[str]:
    return import_graph.imports_of(path, PACKAGE)


def graph() -> dict[str, set[str]]:
    return import_graph.graph(PACKAGE)


def test_there_is_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_importing_a_sibling_through_the_package_counts_as_importing_the_package(tmp_path):
    module = tmp_path / "pgmo" / "engine" / "hot_path_choice.py"
    module.parent.mkdir(parents=True)
    module.write_text("from . import handout\n")
    assert import_graph.imports_of(module, tmp_path / "pgmo") == \
        {"pgmo.engine", "pgmo.engine.handout"}


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a"}}) is None


def test_the_core_imports_no_adapter_and_nothing_of_cupy_or_chainer():
    bad = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if name in ADAPTERS or name == "pgmo":  # the package only names them lazily
            continue
        for target in imports_of(path):
            if target in ADAPTERS or target.split(".")[0] in FOREIGN:
                bad.append(f"{name} imports {target}")
    assert not bad, bad


def test_core_runs_without_loading_cupy_or_chainer(tmp_path):
    code = (
        "import sys, pgmo\n"
        "t = pgmo.Trace.from_tuples([(0, 4, 3), (1, 3, 2), (3, 6, 4)])\n"
        f"pgmo.write_trace(t, {str(tmp_path / 't.csv')!r})\n"
        f"t = pgmo.read_trace({str(tmp_path / 't.csv')!r})\n"
        "for method in ('bestfit', 'best'):\n"
        "    pgmo.solve(t, method=method, time_limit=1).validate()\n"
        "import pgmo.bundled, pgmo.synth, pgmo.cli, pgmo.engine\n"
        "from pgmo.testing import host_engine, replay\n"
        "assert replay([t] * 3, host_engine(warmup=1))['corrupted'] == 0\n"
        "print(sorted(m for m in ('cupy', 'chainer') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]"


def test_the_public_api_is_reachable_from_the_package():
    code = ("import sys, pgmo\n"
            "assert 'cupy' not in sys.modules\n"
            "names = [pgmo.testing.host_engine, pgmo.engine.Engine, pgmo.PoolStats,\n"
            "         pgmo.formats.FORMATS, pgmo.bundled.names]\n"
            "assert 'cupy' not in sys.modules\n"
            "print(sorted(set(pgmo.__all__) - set(dir(pgmo))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]"


def test_pool_names_load_lazily_from_the_package():
    pytest.importorskip("cupy")
    code = ("import sys, pgmo\n"
            "assert 'cupy' not in sys.modules\n"
            "cls = pgmo.ProfileGuidedMemoryPool\n"
            "pool = pgmo.testing.host_pool()\n"
            "print(cls.__module__, 'cupy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.split() == ["pgmo.pool", "True"]


def imported_by(name: str, edges: dict[str, set[str]]) -> set[str]:
    """Every module that importing ``name`` loads through its own imports, directly or not.

    The top package (``pgmo``) is left out: Python loads it before any of its
    modules, so every module would reach everything through it.
    """
    top = name.split(".")[0]
    seen: set[str] = set()
    todo = [name]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt != top and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_validator_never_imports_the_solver():
    """validate.py is the independent check of every plan: it must not share the solver's code."""
    reached = imported_by("pgmo.validate", graph())
    solver = sorted(m for m in reached if m == "pgmo.solver" or m.startswith("pgmo.solver."))
    assert not solver, f"pgmo.validate imports the solver: {solver}"
    assert "pgmo.trace" in reached  # the graph was read


def test_an_import_of_the_solver_through_another_module_counts():
    edges = {"pgmo.validate": {"pgmo.trace", "pgmo"}, "pgmo.trace": {"pgmo.units"},
             "pgmo.units": {"pgmo.solver.packing"}, "pgmo": {"pgmo.solver"}}
    assert imported_by("pgmo.validate", edges) == {"pgmo.trace", "pgmo.units",
                                                   "pgmo.solver.packing"}


def in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_device_layer_imports_nothing_of_the_engine():
    """pgmo/device/ implements the engine's Backend: it may use the neutral modules
    (placement, units, errors), never the engine, directly or through another module."""
    edges = graph()
    layer = [name for name in edges if in_package(name, DEVICE)]
    bad = [f"{name} reaches {target}" for name in sorted(layer)
           for target in sorted(imported_by(name, edges)) if in_package(target, "pgmo.engine")]
    assert not bad, bad
    assert "pgmo.placement" in imported_by("pgmo.device.host_async_pool", edges)  # it was read


def test_importing_the_device_package_loads_neither_cupy_nor_the_engine():
    code = ("import sys, pgmo.device, pgmo.device.host_stock_pool, pgmo.device.host_async_pool\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cupy'\n"
            "             or m.startswith('pgmo.engine')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]"
