"""A package's import graph read from its source, for the tests that keep it one-way.

Every ``import`` counts, at module level or inside a function, relative or
absolute, so a cycle hidden in a function body counts too.  Used for
``pgmo/`` (``test_layering.py``) and ``scripts/`` (``test_scripts_package.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, package: Path) -> str:
    """The dotted name of ``path``, a file of the package folder ``package``."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, name: str, is_package: bool = False) -> set[str]:
    """Every module the source of module ``name`` imports, as absolute names."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            # "from . import x" loads the package first: an edge to it too, so that
            # engine -> hot_path_choice -> engine (the package) is a cycle.
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def imports_of(path: Path, package: Path) -> set[str]:
    """Every module ``path`` (a file of ``package``) imports, anywhere in it."""
    return imports_in(path.read_text(), module_name(path, package), path.name == "__init__.py")


def graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    return {name: {m for m in imports_of(path, package) if m in modules and m != name}
            for name, path in modules.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of imports, as the list of modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None
