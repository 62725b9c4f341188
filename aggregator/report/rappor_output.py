"""google/rappor's own output files (``crowdmix report --format rappor``), for its users' scripts.

The three files of google/rappor's ``bin/decode_dist.R``, same names and shapes, in
``<out>/rappor/``: ``results.csv`` (the detected strings, largest estimate first:
``string, estimate, std_error, proportion, prop_std_error, prop_low_95, prop_high_95``,
with rappor's rounding and plain Wald interval), ``metrics.json`` (``sample_size``,
``allocated_mass``, ``num_detected``, ``explained_var``, ``missing_var``,
``total_elapsed_time``) and ``residual.png`` (a histogram of observed minus explained
over the m × k Bloom bits of the cohorts with reports). The residual and variance
shares follow rappor's ``analysis/R/decode.R`` (``PerformInference``) in proportion units;
ŷ is crowdmix's own estimate, so the figures agree in meaning, not digit for digit.
Definitions: docs/design.md, "Aggregator: decode".
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.decode.result import DecodeResult

__all__ = ["RAPPOR_COLUMNS", "rappor_residual", "write_rappor_outputs"]

RAPPOR_COLUMNS = (
    "string",
    "estimate",
    "std_error",
    "proportion",
    "prop_std_error",
    "prop_low_95",
    "prop_high_95",
)


def rappor_residual(
    totals: npt.NDArray[np.int64],
    ones: npt.NDArray[np.int64],
    design: Any,
    proportion: npt.NDArray[np.float64],
    significant: npt.NDArray[np.bool_],
    *,
    f: float,
    p: float,
    q: float,
) -> tuple[npt.NDArray[np.float64], dict[str, float]]:
    """(residual over the bits of cohorts with reports, {explained_var, missing_var, noise_var})."""
    m, k = ones.shape
    p11 = q * (1 - f / 2) + p * f / 2
    p01 = p * (1 - f / 2) + q * f / 2
    n = totals.astype(np.float64)
    has = n > 0
    share = np.zeros((m, k))
    share[has] = ones[has] / n[has, None]
    observed = (share - p01) / (p11 - p01)
    beta = np.where(significant, proportion, 0.0)
    explained = np.asarray(design @ beta, dtype=np.float64).reshape(m, k)
    y, y_hat = observed[has].ravel(), explained[has].ravel()
    residual = y - y_hat
    tss = float(np.sum((y - y.mean()) ** 2)) if y.size else 0.0
    noise = float(np.sum(share[has] * (1 - share[has]) / n[has, None])) / (p11 - p01) ** 2
    if tss <= 0.0:
        return residual, {"explained_var": 0.0, "missing_var": 0.0, "noise_var": 0.0}
    explained_var = float(np.sum((y_hat - y.mean()) ** 2)) / tss
    noise_var = noise / tss
    return residual, {
        "explained_var": round(explained_var, 3),
        "missing_var": round(1.0 - explained_var - noise_var, 3),
        "noise_var": round(noise_var, 3),
    }


def write_rappor_outputs(
    result: DecodeResult,
    out_dir: str | os.PathLike[str],
    *,
    totals: npt.NDArray[np.int64],
    ones: npt.NDArray[np.int64],
    design: Any,
    f: float,
    p: float,
    q: float,
    elapsed_seconds: float,
) -> dict[str, Path]:
    """results.csv, metrics.json and residual.png as google/rappor's decode-dist writes them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = result.num_reports
    rows = []
    for i in np.flatnonzero(result.significant):
        estimate = math.floor(result.proportion[i] * n)
        std = math.floor(result.std_error[i] * n)
        prop, prop_std = estimate / n, std / n
        rows.append(
            (
                result.values[i],
                estimate,
                std,
                prop,
                prop_std,
                max(prop - 1.96 * prop_std, 0.0),
                min(prop + 1.96 * prop_std, 1.0),
            )
        )
    rows.sort(key=lambda r: -r[1])
    paths = {
        "rappor_results": out / "results.csv",
        "rappor_metrics": out / "metrics.json",
        "rappor_residual": out / "residual.png",
    }
    with paths["rappor_results"].open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, quoting=csv.QUOTE_NONNUMERIC)  # as R's write.csv
        w.writerow(RAPPOR_COLUMNS)
        w.writerows(rows)
    residual, shares = rappor_residual(
        totals, ones, design, result.proportion, result.significant, f=f, p=p, q=q
    )
    metrics = {
        "sample_size": n,
        "allocated_mass": float(sum(r[3] for r in rows)),
        "num_detected": len(rows),
        "explained_var": shares["explained_var"],
        "missing_var": shares["missing_var"],
        "total_elapsed_time": elapsed_seconds,
    }
    paths["rappor_metrics"].write_text(json.dumps(metrics) + "\n", encoding="utf-8")
    _residual_histogram(residual, paths["rappor_residual"], m_k=ones.shape)
    return paths


def _residual_histogram(
    residual: npt.NDArray[np.float64], path: Path, *, m_k: tuple[int, int]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=100)
    if residual.size:
        weights = np.full(residual.size, 1.0 / residual.size)  # frequencies, as rappor plots
        ax.hist(residual, bins=min(200, max(10, residual.size // 4)), weights=weights)
    ax.set_title("Histogram of the residual")
    ax.set_xlabel(f"Residual (observed - explained, {m_k[0]} x {m_k[1]} values)")
    ax.set_ylabel("frequency")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
