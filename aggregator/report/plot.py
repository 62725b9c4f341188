"""The report's chart: top values as horizontal bars with 95% interval whiskers.

Both answers are drawn: the bars are the detection answer's estimates (detected
values in colour, the others in grey, the detection threshold dashed), and a
diamond with a thin whisker is each value's share in the distribution answer. The
title names the metric, its windows (numbers and dates) and the release's ε.

The x axis is logarithmic for a long tail (``scale="auto"``: the largest share shown
is at least ``LONG_TAIL`` times the smallest positive one), or as asked. What is drawn
is decided by :func:`plot_layout`, a pure function; :func:`plot_estimates` draws it
with matplotlib's non-interactive Agg backend (no display needed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.decode.result import DecodeResult

__all__ = ["LONG_TAIL", "SCALES", "PlotLayout", "plot_estimates", "plot_layout"]

SCALES = ("auto", "linear", "log")
#: ``scale="auto"`` draws a log axis when the largest share shown is this many times
#: the smallest positive one: on a linear axis those rows would be invisible slivers.
LONG_TAIL = 100.0


@dataclass(frozen=True, slots=True)
class PlotLayout:
    """What the chart shows: its rows (indexes into the result), title lines, scale."""

    rows: npt.NDArray[np.intp]
    title: str
    subtitle: str
    xlabel: str
    log: bool
    distribution: bool  # the distribution answer is drawn too


def plot_layout(
    result: DecodeResult,
    *,
    top: int = 20,
    title: str = "",
    scale: str = "auto",
    subject: str = "reports",
    total_reports: int | None = None,
) -> PlotLayout:
    """The chart of the ``top`` rows (significant first, then by estimate).

    ``subject`` is what the shares are of: "reports", or "devices" for a shuffled
    histogram (its decoder estimates devices from ``total_reports`` reports)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    rows = result.order()[:top]
    shown = np.concatenate(
        [result.proportion[rows], result.distribution[rows]]
        if result.distribution is not None
        else [result.proportion[rows]]
    )
    positive = shown[shown > 0]
    long_tail = positive.size > 1 and positive.max() >= LONG_TAIL * positive.min()
    log = scale == "log" or (scale == "auto" and bool(long_tail))
    n = result.num_reports
    if subject == "devices" and total_reports is not None:
        volume = f"{_count(total_reports, 'report')} from an estimated {_count(n, 'device')}"
    else:
        volume = _count(n, subject.rstrip("s"))
    candidates = len(result.values)
    drawn = result.distribution is not None
    subtitle = (
        f"{volume} · {result.detected} of {_count(candidates, 'candidate')} detected "
        f"· allocated {result.allocated_mass:.1%}\n"
        "bars: estimate (grey: not significant) · dashed: detection threshold"
        + (" · ◆ distribution answer" if drawn else "")
    )
    xlabel = f"share of {subject} (%), whiskers: 95% interval" + (", log scale" if log else "")
    return PlotLayout(
        rows=rows, title=title, subtitle=subtitle, xlabel=xlabel, log=log, distribution=drawn
    )


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def plot_estimates(
    result: DecodeResult, path: str | os.PathLike[str], layout: PlotLayout | None = None
) -> PlotLayout:
    """Write a PNG of ``layout`` (default: :func:`plot_layout`'s); returns the layout drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout = layout if layout is not None else plot_layout(result)
    order = layout.rows
    labels = [v if len(v) <= 32 else v[:31] + "…" for v in (result.values[i] for i in order)]
    est = result.proportion[order] * 100
    lo = result.ci_low[order] * 100
    hi = result.ci_high[order] * 100
    sig = result.significant[order]
    height = max(2.5, 0.38 * len(order) + 1.6)
    fig, ax = plt.subplots(figsize=(8.5, height), dpi=110)
    y = np.arange(len(order))[::-1]
    colors = np.where(sig, "#1f77b4", "#b0b0b0")
    ax.barh(y, est, color=colors, height=0.65)
    err = np.vstack([np.maximum(est - lo, 0), np.maximum(hi - est, 0)])
    ax.errorbar(est, y, xerr=err, fmt="none", ecolor="#333333", elinewidth=1, capsize=3)
    if layout.distribution:
        assert result.distribution is not None  # layout.distribution says so
        d = result.distribution[order] * 100
        d_lo = (result.distribution_low if result.distribution_low is not None else
                result.distribution)[order] * 100  # fmt: skip
        d_hi = (result.distribution_high if result.distribution_high is not None else
                result.distribution)[order] * 100  # fmt: skip
        derr = np.vstack([np.maximum(d - d_lo, 0), np.maximum(d_hi - d, 0)])
        ax.errorbar(d, y - 0.22, xerr=derr, fmt="D", color="#ff7f0e", markersize=4,
                    elinewidth=0.8, capsize=2)  # fmt: skip
    ax.set_yticks(y, labels)
    ax.axvline(result.detection_threshold * 100, color="#d62728", linestyle="--", linewidth=1)
    ax.set_xlabel(layout.xlabel)
    if layout.log:
        positive = np.concatenate([est, d if layout.distribution else est])
        positive = positive[positive > 0]
        floor = float(positive.min()) / 2 if positive.size else 1e-3
        ax.set_xscale("log")
        ax.set_xlim(left=floor)
    else:
        ax.set_xlim(left=0)
    ax.set_title(
        f"{layout.title}\n{layout.subtitle}" if layout.title else layout.subtitle, fontsize=9.5
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return layout
