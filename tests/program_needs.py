"""What each program (``scripts/``, ``examples/``) needs beyond numpy: one list for every
test that runs them, so that the suite without CuPy or Chainer skips them with their
reason instead of failing."""

from __future__ import annotations

import importlib.util

import pytest

#: Programs that import Chainer before parsing their arguments (the examples too, but the
#: one-liner, which falls back to plain NumPy).
NEEDS_CHAINER = {"record_traces", "record_runs", "mirror_fidelity"}
#: Programs that time the pool itself, CuPy's memory objects included, or record through
#: CuPy's allocator (the mirror capture); the examples too.
NEEDS_CUPY = {"bench_malloc", "bench_overhead", "record_runs", "mirror_fidelity"}


def skip_unless_installed(program: str) -> None:
    """Skip the calling test, saying why, when ``program`` needs what is not installed."""
    example = program.endswith(".py")
    if (program in NEEDS_CHAINER or example and program != "one_liner.py") and \
            importlib.util.find_spec("chainer") is None:
        pytest.skip("needs Chainer (pgmo[chainer])")
    if (program in NEEDS_CUPY or example) and importlib.util.find_spec("cupy") is None:
        pytest.skip("needs CuPy (pgmo[cuda13]): it times or records through CuPy's memory "
                    "objects" if not example else "the examples need CuPy")
