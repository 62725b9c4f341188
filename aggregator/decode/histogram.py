"""Estimator for shuffled histograms with fake reports.

Y_j reports (real and fake) carry value j, T = Σ_j Y_j; n devices, m fake slots filled
w.p. q uniformly, k-RR probabilities p (true value) and r (each other; p = 1, r = 0
without local randomization), c_j devices holding j: E[Y_j] = c_j·p + (n − c_j)·r + n·m·q/d.
n known: ĉ_j = (Y_j − n·(r + m·q/d))/(p − r). n unknown: n̂ = T/(1 + m·q) and
ĉ_j = (Y_j − a·T)/(p − r), a = (r + m·q/d)/(1 + m·q), both unbiased. Exact variances
(derivation: docs/design.md, "Aggregator: decode") with c_j = clip(ĉ_j, 0, n) plugged in
for standard errors. Proportions are ĉ_j/n (ĉ_j/n̂, a ratio, when n is estimated).
Intervals, p-values and significance as in ``crowdmix.aggregator.decode.basic``; the
distribution answer is the Euclidean projection onto the simplex (Norm-Sub). Counting is
one ``np.bincount`` per batch (``histogram_counts``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.decode.basic import unbiased_table
from crowdmix.aggregator.decode.errors import NoReportsError, ParamsMismatchError
from crowdmix.aggregator.decode.result import DecodeResult
from crowdmix.aggregator.decode.stats import (
    Correction,
    IntervalMethod,
)
from crowdmix.core.histogram import HistogramParams

__all__ = ["count_variance", "decode_histogram", "histogram_counts"]

FloatArray = npt.NDArray[np.float64]


def histogram_counts(indexes: npt.ArrayLike, params: HistogramParams) -> npt.NDArray[np.int64]:
    """Y: reports per value from an array of decoded report indexes (ValueError if out of range)."""
    idx = np.asarray(indexes, dtype=np.int64).ravel()
    d = params.domain_size
    if idx.size and (idx.min() < 0 or idx.max() >= d):
        raise ValueError(f"report index out of the domain [0, {d})")
    return np.bincount(idx, minlength=d).astype(np.int64)


def _slot_variance(params: HistogramParams, a: float) -> float:
    q, d = params.fake_probability, params.domain_size
    second = q * ((1.0 - a) ** 2 / d + a * a * (1.0 - 1.0 / d))
    return second - (q * (1.0 / d - a)) ** 2


def _shift(params: HistogramParams) -> float:
    """a: the per-report subtraction when n is estimated from T."""
    m, q, d = params.fake_slots, params.fake_probability, params.domain_size
    return (params.other_probability + m * q / d) / (1.0 + m * q)


def count_variance(
    params: HistogramParams, n: float, true_count: npt.ArrayLike, *, n_known: bool = True
) -> FloatArray:
    """Exact Var(ĉ_j) for n devices of which ``true_count`` hold j (formulas above)."""
    c = np.asarray(true_count, dtype=np.float64)
    p, r = params.keep_probability, params.other_probability
    m, q, d = params.fake_slots, params.fake_probability, params.domain_size
    if n_known:
        fake = n * m * (q / d) * (1.0 - q / d)
    else:
        fake = n * m * _slot_variance(params, _shift(params))
    real = c * p * (1.0 - p) + (n - c) * r * (1.0 - r)
    return np.asarray((real + fake) / (p - r) ** 2, dtype=np.float64)


def decode_histogram(
    counts: npt.ArrayLike,
    params: HistogramParams,
    *,
    num_devices: int | None = None,
    values: Sequence[str] | None = None,
    alpha: float = 0.05,
    correction: Correction = "bonferroni",
    level: float = 0.95,
    interval: IntervalMethod = "wald",
    project: bool = False,
) -> DecodeResult:
    """Unbiased counts of every domain value from Y (reports per value), with SEs and CIs.

    ``num_devices``: the number of devices that reported (known to the
    shuffler); None estimates it as T/(1 + m·q).
    """
    y = np.asarray(counts, dtype=np.int64).ravel()
    d = params.domain_size
    if y.shape != (d,):
        raise ParamsMismatchError(f"expected {d} counts (one per value), got {y.size}")
    if np.any(y < 0):
        raise ParamsMismatchError("counts must be non-negative")
    total = int(y.sum())
    if total == 0:
        raise NoReportsError("there are no reports to decode")
    names = tuple(values) if values is not None else tuple(str(i) for i in range(d))
    if len(names) != d:
        raise ParamsMismatchError(f"{len(names)} value names for a domain of {d}")
    m, q = params.fake_slots, params.fake_probability
    p, r = params.keep_probability, params.other_probability
    span = p - r
    if num_devices is not None:
        if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
            raise ValueError(f"num_devices must be a positive integer, got {num_devices!r}")
        if total < num_devices or total > num_devices * params.max_messages:
            raise ParamsMismatchError(
                f"{total} reports cannot come from {num_devices} devices sending 1 to "
                f"{params.max_messages} each"
            )
        n = float(num_devices)
        count = np.asarray((y - n * (r + m * q / d)) / span, dtype=np.float64)
    else:
        n = total / (1.0 + m * q)
        count = np.asarray((y - _shift(params) * total) / span, dtype=np.float64)
    known = num_devices is not None
    plug = np.clip(count, 0.0, n)
    var = count_variance(params, n, plug, n_known=known)
    proportion = np.asarray(count / n, dtype=np.float64)
    std_error = np.sqrt(np.maximum(var, 0.0)) / n
    null_se = math.sqrt(float(count_variance(params, n, 0.0, n_known=known))) / n
    return unbiased_table(
        names,
        proportion,
        std_error,
        null_se,
        num_reports=round(n),
        method="shuffled-histogram: unbiased estimator"
        + ("" if known else " (devices estimated from the report total)"),
        alpha=alpha,
        correction=correction,
        level=level,
        interval=interval,
        project=project,
        diagnostics={
            "total_reports": total,
            "devices": n,
            "devices_known": known,
            "expected_fakes_per_value": n * m * q / d,
            "keep_probability": p,
            "other_probability": r,
        },
    )
