"""The example programs of ``examples/`` as modules: the one place ``scripts`` touches ``sys.path``.

The examples are programs, not a package: each puts its own folder on
``sys.path`` and imports its neighbours by plain name (``train_imagenet``
imports ``models``).  A script that trains an example model does the same
through :func:`load`, which puts ``examples/`` on ``sys.path`` once and
imports the module by that name, so the example and the script share one
copy of it.  Import ``pgmo.chainer`` before loading a module that imports
Chainer (it patches Chainer's imports for today's NumPy and CuPy).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

#: The folder of the example programs.
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str) -> ModuleType:
    """``examples/<name>.py`` (or the package ``examples/<name>/``), imported by its plain name."""
    folder = str(EXAMPLES)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)
