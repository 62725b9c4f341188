"""The report's chart: top values as horizontal bars with 95% interval whiskers.

Matplotlib with the non-interactive Agg backend (no display needed). Detected
values are drawn in colour, non-significant ones (shown only to fill the top
list) in grey, with the detection threshold as a dashed line.
"""

from __future__ import annotations

import os

import numpy as np

from crowdmix.aggregator.decode.result import DecodeResult

__all__ = ["plot_estimates"]


def plot_estimates(
    result: DecodeResult,
    path: str | os.PathLike[str],
    *,
    top: int = 20,
    title: str = "",
) -> None:
    """Write a PNG of the ``top`` rows (significant first, then by estimate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = result.order()[:top]
    labels = [v if len(v) <= 32 else v[:31] + "…" for v in (result.values[i] for i in order)]
    est = result.proportion[order] * 100
    lo = result.ci_low[order] * 100
    hi = result.ci_high[order] * 100
    sig = result.significant[order]
    height = max(2.5, 0.38 * len(order) + 1.4)
    fig, ax = plt.subplots(figsize=(8.5, height), dpi=110)
    y = np.arange(len(order))[::-1]
    colors = np.where(sig, "#1f77b4", "#b0b0b0")
    ax.barh(y, est, color=colors, height=0.65)
    err = np.vstack([np.maximum(est - lo, 0), np.maximum(hi - est, 0)])
    ax.errorbar(est, y, xerr=err, fmt="none", ecolor="#333333", elinewidth=1, capsize=3)
    ax.set_yticks(y, labels)
    ax.axvline(result.detection_threshold * 100, color="#d62728", linestyle="--", linewidth=1)
    ax.set_xlabel("share of reports (%), bars: estimate, whiskers: 95% interval")
    ax.set_xlim(left=0)
    detected = int(result.significant.sum())
    # two short lines: one long line was cut off at the figure's edge
    n = result.num_reports
    subtitle = (
        f"{n:,} {'report' if n == 1 else 'reports'} · {detected} of {len(result.values)} "
        f"{'candidate' if len(result.values) == 1 else 'candidates'} "
        f"detected · allocated {result.allocated_mass:.1%}\n"
        "grey: not significant · dashed: detection threshold"
    )
    ax.set_title(f"{title}\n{subtitle}" if title else subtitle, fontsize=9.5)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
