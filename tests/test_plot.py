"""Pictures: the live-bytes curve and the Figure-1-style plan plot."""

from __future__ import annotations

import pytest
from hypothesis import given

from pgmo import Trace, solve
from pgmo.plot import live_bytes, plot_plan
from tests.strategies import traces


@given(traces())
def test_live_bytes_peaks_at_the_lower_bound(trace):
    ticks, live = live_bytes(trace)
    assert int(live.max()) == trace.lower_bound()
    assert live[-1] == 0  # everything is freed by the end
    assert list(ticks) == sorted(set(ticks))


def test_touching_lifetimes_do_not_add_up():
    trace = Trace.from_tuples([(0, 2, 5), (2, 4, 7)])
    _, live = live_bytes(trace)
    assert int(live.max()) == 7


@pytest.mark.parametrize("with_plan", [True, False])
def test_plot_writes_a_png(tmp_path, with_plan):
    pytest.importorskip("matplotlib")
    trace = Trace.from_tuples([(0, 4, 3), (1, 3, 2), (3, 6, 4), (5, 8, 1)])
    plan = solve(trace, method="bestfit") if with_plan else None
    out = plot_plan(plan, tmp_path / "p.png", trace=trace)
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 1000


def test_plot_needs_a_plan_or_a_trace(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(ValueError, match="needs a plan or a trace"):
        plot_plan(None, tmp_path / "x.png")
