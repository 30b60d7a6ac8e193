"""Which hot path runs: the compiled one when pgmo was built with it, else plain Python.

:mod:`.handout` is one source file.  A normal ``pip install`` compiles it with
Cython when a C compiler is available; Python then imports the compiled
module in its place.  ``PGMO_PURE_PYTHON=1`` in the environment picks the
plain-Python one anyway (to debug, or to compare).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from . import handout

__all__ = ["reference_handout", "default_hot_path", "compiled"]


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
    return handout.COMPILED and not os.environ.get("PGMO_PURE_PYTHON")


def default_hot_path() -> type:
    return handout.HotPath if compiled() else reference_handout().HotPath
