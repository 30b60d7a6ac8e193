"""Which hot path runs: the compiled one when pgmo was built with it, else plain Python.

:mod:`.handout` is one source file.  A normal ``pip install`` compiles it with
Cython when a C compiler is available; Python then imports the compiled
module in its place.  ``PGMO_PURE_PYTHON=1`` in the environment picks the
plain-Python one anyway (to debug, or to compare).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path
from types import ModuleType

from . import handout

__all__ = ["reference_handout", "default_hot_path", "compiled"]

log = logging.getLogger("pgmo.pool")


def _stale() -> bool:
    """The compiled module is older than its source (edited, not rebuilt): do not trust it."""
    source = Path(handout.__file__).with_name("handout.py")
    try:
        return source.stat().st_mtime > Path(handout.__file__).stat().st_mtime
    except OSError:
        return False


def reference_handout() -> ModuleType:
    """:mod:`.handout` run as plain Python, even where the compiled module is installed.

    The reference the compiled hot path is tested against.
    """
    name = "pgmo.engine._handout_reference"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(
            name, Path(handout.__file__).with_name("handout.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def compiled() -> bool:
    """Whether the engine's default hot path is compiled."""
    if not handout.COMPILED or os.environ.get("PGMO_PURE_PYTHON"):
        return False
    if _stale():
        log.warning("pgmo's compiled hot path is older than pgmo/engine/handout.py; running "
                    "the plain-Python one (rebuild with: pip install -e .)")
        return False
    return True


def default_hot_path() -> type:
    return handout.HotPath if compiled() else reference_handout().HotPath
