"""Sphinx configuration: the API reference from pgmo's docstrings, the guides from docs/.

Build (the ``docs`` extra)::

    python -m sphinx -W -b html docs build/docs

Neither CuPy nor Chainer is needed: autodoc imports them as stand-ins.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's pgmo, installed or not

import pgmo  # noqa: E402

project = "pgmo"
author = "the pgmo developers"
copyright = "the pgmo developers (MIT license)"  # noqa: A001
version = release = pgmo.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# The adapters import CuPy, Chainer, ChainerMN, MPI and the CUDA bindings: the site is built
# without them (Read the Docs installs only the docs extra), from the docstrings alone.
autodoc_mock_imports = ["cupy", "cupy_backends", "chainer", "chainermn", "mpi4py", "cuda"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_inherit_docstrings = False  # CuPy's MemoryPool docstrings are CuPy's, not pgmo's

# Markdown guides: headings get anchors, so pages can link to their sections.
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"pgmo {release}"

# Every cross-reference must resolve (-W makes a broken one fail the build), except to what
# this site does not document: other projects' names, and pgmo's internals (the engine, the
# device layer and its host model), which docs/architecture.md describes instead.
nitpicky = True
#: Other projects' names: not documented here, and not checked.
EXTERNAL = r"(os|pathlib|argparse|typing|collections|numpy|np|scipy|cupy|chainer|chainermn|" \
           r"mpi4py|training)\..*"
nitpick_ignore_regex = [("py:.*", EXTERNAL)]


def _lookup(dotted: str) -> object | None:
    """The object a full dotted name names (importing modules of pgmo as needed), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            obj: object = sys.modules.get(name) or importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not a module: a shorter prefix may be
            continue
        for part in parts[cut:]:
            try:  # a lazy name of pgmo imports its module: CuPy's, where it is absent
                obj = getattr(obj, part, _MISSING)
            except ImportError:
                return None
            if obj is _MISSING:
                return None
        return obj
    return None


_MISSING = object()


def _candidates(target: str, module: str | None, cls: str | None) -> list[str]:
    """Full names a reference may mean: as written, in its class, its module, its
    package and the packages above, and a name of ``import pgmo``."""
    names = [target]
    if target.startswith("pgmo.") and target.split(".")[1] in pgmo._LAZY:
        where, attr = pgmo._LAZY[target.split(".")[1]]
        rest = target.split(".")[2:]
        names.insert(0, ".".join([where, *([attr] if attr else []), *rest]))
    scope = module or ""
    while scope:
        if cls:
            names.append(f"{scope}.{cls}.{target}")
        names.append(f"{scope}.{target}")
        scope = scope.rpartition(".")[0]
    return names


def _resolve(app, env, node, contnode):
    """A reference to a name of pgmo that the site does not document under that name: to
    where the name is defined (``pgmo.Trace`` is ``pgmo.trace.Trace``; ``PlanFileError`` in
    ``pgmo.pool`` is ``pgmo.errors.PlanFileError``), linked if documented there, else named
    without a link (the engine and other internals, described in docs/architecture.md).  A
    name that exists nowhere stays broken: the build fails on it."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").lstrip(".~")
    domain = env.get_domain("py")
    for name in _candidates(target, node.get("py:module"), node.get("py:class")):
        if not name.startswith("pgmo"):
            continue
        obj = _lookup(name)
        if obj is None:
            continue
        where = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
        canonical = f"{where}.{qualname}" if isinstance(where, str) and isinstance(
            qualname, str) and where.startswith("pgmo") and not isinstance(
            obj, type(sys)) else name
        for full in dict.fromkeys([canonical, name]):
            found = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                        full, node, contnode)
            if found is not None:
                return found
        return contnode
    if target.isidentifier():  # an annotation imported only for type checking: pgmo's one
        found = {f"{m.__name__}.{target}" for m in list(sys.modules.values())
                 if getattr(m, "__name__", "").startswith("pgmo")
                 and getattr(getattr(m, target, None), "__module__", None) == m.__name__}
        if len(found) == 1:
            return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                       found.pop(), node, contnode) or contnode
    return None


def setup(app):
    app.connect("missing-reference", _resolve)
