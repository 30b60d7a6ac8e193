"""Where the public DSA instances are, for the tests that use them.

They are never copied into the project: ``PGMO_DSA_BENCHMARKS`` names the
folder, else ``../shared/dsa-benchmarks`` beside the checkout (as in CI).
Tests that need them skip cleanly without.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_CANDIDATES = [Path(p) for p in (os.environ.get("PGMO_DSA_BENCHMARKS"),) if p] + [
    Path(__file__).resolve().parents[2] / "shared" / "dsa-benchmarks",
]

BENCH: Path | None = next((p for p in _CANDIDATES if p.is_dir()), None)
needs_bench = pytest.mark.skipif(BENCH is None, reason="shared dsa-benchmarks not present "
                                                       "(set PGMO_DSA_BENCHMARKS)")
