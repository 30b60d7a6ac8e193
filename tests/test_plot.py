"""Pictures: the live-bytes curve and the Figure-1-style plan plot."""

from __future__ import annotations

import pytest
from hypothesis import given

from pgmo import Trace, solve
from pgmo.measure.plot import live_bytes, plot_plan
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


def _lines(ax) -> dict[str, float]:
    """The horizontal lines of ``ax`` with a legend label: label's first word -> y."""
    return {line.get_label().split()[0]: float(line.get_ydata()[0]) for line in ax.lines
            if not line.get_label().startswith("_")}


def test_the_figure_shows_the_plans_blocks_peak_and_lower_bound():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    from pgmo.measure.plot import plan_figure
    from pgmo.synth import random_iteration
    from pgmo.units import byte_unit

    trace = random_iteration(25)  # best-fit stays 12 % above the lower bound here
    plan = solve(trace, method="bestfit")
    assert plan.peak > trace.lower_bound()  # so that the two lines can be told apart
    scale, _ = byte_unit(plan.peak)
    fig = plan_figure(plan)
    try:
        blocks_ax, live_ax = fig.axes[:2]
        lines = _lines(blocks_ax)
        assert lines["peak"] == pytest.approx(plan.peak / scale)
        assert lines["lower"] == pytest.approx(trace.lower_bound() / scale)
        (blocks,) = [c for c in blocks_ax.collections if isinstance(c, PolyCollection)]
        paths = blocks.get_paths()
        assert len(paths) == len(trace)
        tops = [p.vertices[:, 1].max() for p in paths]
        assert max(tops) == pytest.approx(plan.peak / scale)  # the highest block meets the peak
        bottoms = sorted(p.vertices[:, 1].min() * scale for p in paths)
        assert bottoms == pytest.approx(sorted(plan.offsets))
        (curve,) = [line for line in live_ax.lines if len(line.get_ydata()) > 2]
        assert max(curve.get_ydata()) == pytest.approx(trace.lower_bound() / scale)
    finally:
        plt.close(fig)
