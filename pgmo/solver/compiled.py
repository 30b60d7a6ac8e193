"""What a module compiled by Cython in pure Python mode needs to know of its own source.

:mod:`.search_nodes` and :mod:`.bestfit` are plain Python that ``setup.py``
compiles when a C compiler is there; tests run their source uncompiled too,
and a compiled module older than its source (edited, not rebuilt) is not
trusted.  One place for both questions, for every such module.
"""

from __future__ import annotations

import importlib.util
import logging
import types
from pathlib import Path

__all__ = ["plain_copy", "older_than_source"]

log = logging.getLogger(__name__)


def plain_copy(name: str, built: str) -> types.ModuleType:
    """The source next to the compiled module ``built`` (its ``__file__``), loaded as plain
    Python under the name ``<name>_plain``."""
    source = Path(built).with_name(name.rpartition(".")[2] + ".py")
    spec = importlib.util.spec_from_file_location(f"{name}_plain", source)
    assert spec is not None and spec.loader is not None  # the .py next to the compiled one
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def older_than_source(name: str, built: str, what: str) -> bool:
    """Whether the compiled module ``built`` (its ``__file__``) is older than its source; a
    warning names ``what`` then (it runs as plain Python until rebuilt)."""
    path = Path(built)
    try:
        stale = path.with_name(name.rpartition(".")[2] + ".py").stat().st_mtime \
            > path.stat().st_mtime
    except OSError:
        return False
    if stale:
        log.warning("pgmo's compiled %s (%s) is older than its source; running the "
                    "plain-Python one (rebuild with: pip install -e .)", what, path.name)
    return stale
