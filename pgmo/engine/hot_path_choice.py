"""Which hot path runs: the compiled one when pgmo was built with it, else plain Python.

:mod:`.handout` and :mod:`.frees` are plain Python source files.  A normal
``pip install`` compiles them with Cython when a C compiler is available;
Python then imports the compiled modules in their place.
``PGMO_PURE_PYTHON=1`` in the environment picks the plain-Python hot path
anyway (to debug, or to compare).

Tested in ``tests/test_hot_path_seal.py`` and ``tests/test_replay.py``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import types
from pathlib import Path

from .handout import COMPILED, HotPath

__all__ = ["reference_handout", "default_hot_path", "compiled"]

log = logging.getLogger("pgmo.pool")

_HERE = Path(__file__).resolve().parent
_SOURCES = ("frees", "handout")  # in import order
_REFERENCE = "pgmo.engine._reference"


def _stale() -> bool:
    """A compiled module is older than its source (edited, not rebuilt): do not trust it."""
    for name in _SOURCES:
        module = sys.modules.get(f"pgmo.engine.{name}")
        built = getattr(module, "__file__", None) or ""
        if not built.endswith((".so", ".pyd")):
            continue
        try:
            if (_HERE / f"{name}.py").stat().st_mtime > Path(built).stat().st_mtime:
                return True
        except OSError:
            pass
    return False


def reference_handout() -> types.ModuleType:
    """:mod:`.handout` (with :mod:`.frees`) run as plain Python, even where compiled.

    The reference the compiled hot path is tested against.  Both sources are
    loaded into a package of their own, so that handout's ``from .frees
    import ...`` finds the plain-Python frees.
    """
    name = f"{_REFERENCE}.handout"
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    package = types.ModuleType(_REFERENCE)
    package.__path__ = []  # a namespace for the two modules, found through sys.modules
    sys.modules.setdefault(_REFERENCE, package)
    module = package
    for source in _SOURCES:
        spec = importlib.util.spec_from_file_location(f"{_REFERENCE}.{source}",
                                                      _HERE / f"{source}.py")
        assert spec is not None and spec.loader is not None  # a .py file next to this one
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module  # handout, loaded last


def compiled() -> bool:
    """Whether the engine's default hot path is compiled."""
    if not COMPILED or os.environ.get("PGMO_PURE_PYTHON"):
        return False
    if _stale():
        log.warning("pgmo's compiled hot path is older than its source in pgmo/engine/; "
                    "running the plain-Python one (rebuild with: pip install -e .)")
        return False
    return True


def default_hot_path() -> type[HotPath]:
    """The hot path the engine runs: the compiled one when built and fresh, else plain."""
    return HotPath if compiled() else reference_handout().HotPath
