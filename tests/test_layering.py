"""Data flows one way: the core (trace, io, solver, plan) never loads CuPy or Chainer."""

from __future__ import annotations

import subprocess

import pytest
import sys


def test_core_runs_without_loading_cupy_or_chainer(tmp_path):
    code = (
        "import sys, pgmo\n"
        "t = pgmo.Trace.from_tuples([(0, 4, 3), (1, 3, 2), (3, 6, 4)])\n"
        f"pgmo.write_trace(t, {str(tmp_path / 't.csv')!r})\n"
        f"t = pgmo.read_trace({str(tmp_path / 't.csv')!r})\n"
        "for method in ('bestfit', 'best'):\n"
        "    pgmo.solve(t, method=method, time_limit=1).validate()\n"
        "import pgmo.bundled, pgmo.synth, pgmo.cli\n"
        "print(sorted(m for m in ('cupy', 'chainer') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]"


def test_pool_names_load_lazily_from_the_package():
    pytest.importorskip("cupy")
    code = ("import sys, pgmo\n"
            "assert 'cupy' not in sys.modules\n"
            "cls = pgmo.ProfileGuidedMemoryPool\n"
            "print(cls.__module__, 'cupy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.split() == ["pgmo.pool", "True"]
