"""Where the public DSA instances are, for the tests that use them.

They are kept in the repository, in ``tests/data/dsa-benchmarks`` (licenses and
provenance beside them); ``PGMO_DSA_BENCHMARKS`` names another folder of the
same layout.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

IN_REPOSITORY = Path(__file__).resolve().parent / "data" / "dsa-benchmarks"
_FOLDER = Path(os.environ.get("PGMO_DSA_BENCHMARKS") or IN_REPOSITORY)
BENCH: Path | None = _FOLDER if _FOLDER.is_dir() else None
needs_bench = pytest.mark.skipif(BENCH is None, reason=f"no DSA instances in {_FOLDER} "
                                                       "(tests/data is part of the repository)")
