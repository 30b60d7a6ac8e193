"""Pictures of a plan, like Figure 1 of Sekiyama et al.: blocks over time x address.

The upper panel draws each block as a rectangle (lifetime along x, its
address range along y) with the peak and the lower bound as lines; the lower
panel draws the bytes live at each tick, whose maximum is the lower bound.
Needs matplotlib (``pip install pgmo[plot]``); imported only when used.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from ..plan import Plan
from ..trace import Trace
from ..units import byte_unit, format_bytes

__all__ = ["live_bytes", "plot_plan", "plan_figure"]


def live_bytes(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Ticks and bytes live right after each tick (frees at t before allocs at t)."""
    lowers, uppers, sizes = (np.asarray(c, dtype=np.int64) for c in trace.columns())
    ticks = np.concatenate([lowers, uppers])
    deltas = np.concatenate([sizes, -sizes])
    order = np.lexsort((deltas, ticks))  # frees (negative) first at equal ticks
    ticks, live = ticks[order], np.cumsum(deltas[order])
    # Keep the last value at each tick: what is live from that tick on.
    last = np.r_[ticks[1:] != ticks[:-1], True]
    return ticks[last], live[last]


def plot_plan(plan: Plan | None, path, trace: Trace | None = None, title: str | None = None,
              dpi: int = 120) -> Path:
    """Write a PNG (or any matplotlib format, by suffix) of ``plan`` to ``path``.

    With ``plan=None`` only the live-bytes curve of ``trace`` is drawn.
    Returns the path written (``.png`` added to a name without a suffix).
    """
    fig = plan_figure(plan, trace, title)
    import matplotlib.pyplot as plt

    out = Path(path)
    if out.is_dir():
        plt.close(fig)
        raise IsADirectoryError(f"{out} is a folder: name the picture to write, e.g. "
                                f"{out / 'plan.png'}")
    if not out.suffix:  # matplotlib would append .png itself; say the name it gets
        out = out.with_name(out.name + ".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out, dpi=dpi)
    finally:
        plt.close(fig)
    return out


def plan_figure(plan: Plan | None, trace: Trace | None = None, title: str | None = None):
    """The matplotlib figure of :func:`plot_plan` (the caller closes it)."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("plotting needs matplotlib: pip install 'pgmo[plot]'") from exc
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import LogNorm

    trace = plan.trace if plan is not None else trace
    if trace is None:
        raise ValueError("plot_plan needs a plan or a trace")
    lb = trace.lower_bound()
    top = plan.peak if plan is not None else lb
    scale, unit = byte_unit(top)
    fig, axes = plt.subplots(2 if plan is not None else 1, 1, sharex=True, squeeze=False,
                             layout="constrained",
                             figsize=(10, 7 if plan is not None else 3.5),
                             gridspec_kw={"height_ratios": [3, 1]} if plan is not None else None)
    axes = axes[:, 0]
    if plan is not None:
        ax = axes[0]
        lo, up, sz = (np.asarray(c, dtype=np.float64) for c in trace.columns())
        off = np.asarray(plan.offsets, dtype=np.float64)
        y0, y1 = off / scale, (off + sz) / scale
        verts = np.stack([np.stack([lo, y0], 1), np.stack([up, y0], 1),
                          np.stack([up, y1], 1), np.stack([lo, y1], 1)], 1)
        size_scale, size_unit = byte_unit(int(sz.max()))
        norm = LogNorm(vmin=sz.min() / size_scale, vmax=max(sz.max(), sz.min() * 1.01) / size_scale)
        cmap = plt.get_cmap("viridis")
        ax.add_collection(PolyCollection(list(verts), facecolors=cmap(norm(sz / size_scale)),
                                         edgecolors="black",
                                         linewidths=0.2 if len(trace) < 2000 else 0.0))
        # One bar beside both panels keeps their time axes aligned.
        fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=list(axes), pad=0.01,
                     fraction=0.04, label=f"block size ({size_unit})")
        ax.axhline(plan.peak / scale, color="tab:red", lw=1,
                   label=f"peak {format_bytes(plan.peak)}")
        ax.axhline(lb / scale, color="tab:green", lw=1, ls="--",
                   label=f"lower bound {format_bytes(lb)}")
        ax.set_xlim(min(lo.min(), 0), up.max())
        ax.set_ylim(0, plan.peak / scale * 1.05)
        ax.set_ylabel(f"address ({unit})")
        ax.legend(loc="upper right", fontsize=8)
        name = Path(trace.source).name if trace.source else "trace"
        _title(ax, title or f"{name}\n{plan.method}, {len(trace):,} blocks, peak "
                            f"{format_bytes(plan.peak)} = {plan.ratio:.4f} x lower bound "
                            f"{format_bytes(lb)}")
    ax = axes[-1]
    ticks, live = live_bytes(trace)
    ax.step(ticks, live / scale, where="post", color="tab:blue", lw=1)
    ax.axhline(lb / scale, color="tab:green", lw=1, ls="--")
    ax.set_ylabel(f"live ({unit})")
    ax.set_xlabel("event tick (one per alloc and per free)")
    if plan is None:
        _title(ax, title or f"bytes live over time; lower bound {format_bytes(lb)}")
    return fig


#: Characters per title line: a long trace name and the numbers stay inside the figure.
TITLE_WIDTH = 80


def _title(ax, text: str) -> None:
    """A title wrapped to lines the figure holds (a long file name once cut both edges)."""
    lines = [wrapped for line in text.splitlines()
             for wrapped in textwrap.wrap(line, TITLE_WIDTH, break_on_hyphens=False) or [""]]
    ax.set_title("\n".join(lines), fontsize="medium")
