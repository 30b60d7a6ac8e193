"""The hot path is sealed: no module outside it assigns to its fields.

:class:`~pgmo.engine.handout.HotPath` changes its own state (and its
:class:`~pgmo.engine.frees.Counts`) and offers methods for the rest; the
engine, the device memory and everyone else only read it.  The check reads the
source, as ``test_layering.py`` does: every assignment, augmented assignment,
``del`` and ``setattr`` whose target is reached through a hot path (a name or
attribute ``hot``), or is a request counter, in every Python file of the
repository but the hot path's own two.  Compiled, the fields are also
read-only or invisible at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pgmo.engine import compiled, reference_handout
from pgmo.engine import handout as compiled_handout
from pgmo.measure.hosts import host_engine

ROOT = Path(__file__).resolve().parents[1]
#: The hot path's own modules: they alone change its state.
HOT_PATH = {ROOT / "pgmo" / "engine" / "handout.py", ROOT / "pgmo" / "engine" / "frees.py"}
#: Names under which other modules hold a hot path.
HOLDERS = {"hot", "_hot"}
#: The request counters (frees.Counts): the hot path bumps them as it hands out.
COUNTERS = {"planned", "profiled", "departed", "pinned", "interrupted", "outside", "foreign"}
_SKIP_DIRS = {".git", ".venv", "build", "node_modules", "__pycache__"}


def chain(node: ast.AST) -> list[str]:
    """The names along an attribute chain, outermost last: ``self.hot.counts.planned`` is
    ``["self", "hot", "counts", "planned"]`` (a call or subscript in it ends the chain)."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


def sealed_target(target: ast.AST) -> bool:
    """Whether assigning to ``target`` changes a hot path's state."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(sealed_target(t) for t in target.elts)
    if isinstance(target, ast.Starred):
        return sealed_target(target.value)
    if isinstance(target, ast.Subscript):  # hot.slot[i] = ..., hot.counts[...]
        return sealed_target(target.value) or bool(HOLDERS & set(chain(target.value)))
    if not isinstance(target, ast.Attribute):
        return False
    names = chain(target)
    return bool(HOLDERS & set(names[:-1])) or (
        names[-1] in COUNTERS and "counts" in names[:-1])


def violations(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: code`` of each statement that changes a hot path's state."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.Call) and chain(node.func)[-1:] == ["setattr"] and node.args:
            held = chain(node.args[0])
            if HOLDERS & set(held):
                found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
            continue
        if any(sealed_target(t) for t in targets):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def python_files() -> list[Path]:
    """Every Python file of the repository but the hot path's, and this one (whose last
    test tries assignments on purpose, to see them refused)."""
    mine = Path(__file__).resolve()
    return [p for p in ROOT.rglob("*.py")
            if not _SKIP_DIRS & set(p.relative_to(ROOT).parts) and p not in HOT_PATH
            and p != mine]


def test_no_module_outside_the_hot_path_assigns_to_its_fields():
    files = python_files()
    assert ROOT / "pgmo" / "engine" / "core.py" in files  # the walk found the engine
    bad = [v for path in files
           for v in violations(path.read_text(), str(path.relative_to(ROOT)))]
    assert not bad, "the hot path's state is changed outside it:\n" + "\n".join(bad)


@pytest.mark.parametrize("code", [
    "hot.n = 3",
    "self.hot.kind = 1",
    "engine.hot.arena.size += 512",
    "hot.counts.planned += 1",
    "self.counts.departed = 0",
    "del hot.placer",
    "hot.slot[3] = -1",
    "setattr(self.hot, 'solo', False)",
    "monkeypatch.setattr(engine.hot, 'malloc', fake)",
    "a, hot.n = 1, 2",
])
def test_the_check_finds_each_kind_of_assignment(code):
    [found] = violations("x = 1\n" + code)
    assert found.startswith("<source>:2: ")


@pytest.mark.parametrize("code", [
    "arena = hot.arena", "hot.install(rows)", "hot.drain()", "x = hot.counts.planned",
    "self.memory.arena.size = 3", "planned = 1",
])
def test_reading_and_calling_are_allowed(code):
    assert violations(code) == []


def public_names(hot) -> set[str]:
    return {name for name in dir(hot) if not name.startswith("_")}


@pytest.mark.skipif(not compiled_handout.COMPILED, reason="pgmo was built without Cython")
def test_both_hot_paths_offer_the_same_fields_and_methods():
    engine = host_engine()
    plain = reference_handout().HotPath(*(lambda *a: None,) * 3, lambda *a: None,
                                        lambda *a: None, lambda *a: None)
    assert public_names(engine.hot) == public_names(plain)


@pytest.mark.skipif(not compiled_handout.COMPILED or not compiled(),
                    reason="the compiled hot path is not built (or is stale)")
def test_compiled_the_fields_are_read_only_or_hidden():
    hot = host_engine().hot
    for name in ("n", "kind", "arena", "iteration", "used", "solo", "owner"):
        getattr(hot, name)
        with pytest.raises(AttributeError):
            setattr(hot, name, getattr(hot, name))
    with pytest.raises(AttributeError):
        hot.counts.planned = 1
    for private in ("_rows", "_slot", "_addresses", "_tick", "_placer"):
        assert not hasattr(hot, private)
