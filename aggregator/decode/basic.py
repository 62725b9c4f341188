"""Closed-form estimators for the basic mechanisms (Wang, Blocki, Li, Jha, "Locally
Differentially Private Protocols for Frequency Estimation", USENIX Security 2017, §3–4).

A report supports value v w.p. p* when the client holds v and q* otherwise. With S_v
reports supporting v out of n (``ones[0, v]``, ``totals[0]``)::

    ĉ_v = (S_v − n·q*) / (p* − q*)                           (unbiased)
    Var(ĉ_v) = n·q*(1−q*)/(p*−q*)² + c_v·(1−p*−q*)/(p*−q*)    (Wang et al., eq. 2)

with the plug-in max(ĉ_v, 0) for c_v. (p*, q*): binary-rr e^ε/(e^ε+1), 1/(e^ε+1);
krr e^ε/(e^ε+d−1), 1/(e^ε+d−1); oue 1/2, 1/(e^ε+1); olh e^ε/(e^ε+g−1), 1/g
(g = round(e^ε)+1). Optionally proportions are projected onto the simplex (Duchi,
Shalev-Shwartz, Singer, Chandra, ICML 2008), trading unbiasedness for lower total error;
standard errors stay those of the unbiased estimator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.decode.errors import NoReportsError, ParamsMismatchError
from crowdmix.aggregator.decode.result import DecodeResult
from crowdmix.aggregator.decode.stats import (
    Correction,
    IntervalMethod,
    critical_z,
    one_sided_p_values,
    report_intervals,
    significant,
)
from crowdmix.core.basic import BasicParams

__all__ = ["decode_basic", "project_to_simplex", "support_probabilities"]

FloatArray = npt.NDArray[np.float64]


def support_probabilities(params: BasicParams) -> tuple[float, float]:
    """(p*, q*): P(a report supports v | client holds v), P(… | client holds another value)."""
    e = math.exp(params.epsilon)
    mech = params.mechanism
    if mech == "binary-rr":
        return e / (e + 1.0), 1.0 / (e + 1.0)
    if mech == "krr":
        d = params.domain_size
        return e / (e + d - 1.0), 1.0 / (e + d - 1.0)
    if mech == "oue":
        return 0.5, params.oue_q
    g = params.olh_buckets
    return params.keep_probability, 1.0 / g


def project_to_simplex(v: npt.ArrayLike) -> FloatArray:
    """argmin ‖x − v‖₂ over {x >= 0, Σx = 1} (sort-based, O(d log d))."""
    v = np.asarray(v, dtype=np.float64)
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    idx = np.arange(1, v.size + 1)
    rho = int(np.flatnonzero(u - css / idx > 0)[-1])
    theta = css[rho] / (rho + 1.0)
    return np.asarray(np.maximum(v - theta, 0.0), dtype=np.float64)


def decode_basic(
    totals: npt.ArrayLike,
    ones: npt.ArrayLike,
    params: BasicParams,
    values: Sequence[str] | None = None,
    *,
    alpha: float = 0.05,
    correction: Correction = "bonferroni",
    level: float = 0.95,
    project: bool = False,
    interval: IntervalMethod = "wald",
) -> DecodeResult:
    """Frequencies of every domain value from a basic mechanism's supports."""
    tot = np.asarray(totals, dtype=np.int64).ravel()
    sup = np.asarray(ones, dtype=np.int64)
    d = params.domain_size
    width = 1 if params.mechanism == "binary-rr" else d
    if tot.shape != (1,) or sup.shape != (1, width):
        raise ParamsMismatchError(
            f"{params.mechanism} counts must be totals[1], ones[1, {width}]; "
            f"got {tot.shape}, {sup.shape}"
        )
    n = int(tot[0])
    if n == 0:
        raise NoReportsError("there are no reports to decode")
    if np.any(sup < 0) or np.any(sup > n):
        raise ParamsMismatchError("supports must be between 0 and the number of reports")
    if params.mechanism == "binary-rr":
        support = np.array([n - sup[0, 0], sup[0, 0]], dtype=np.float64)
    else:
        support = sup[0].astype(np.float64)
    names = tuple(values) if values is not None else tuple(str(i) for i in range(d))
    if len(names) != d:
        raise ParamsMismatchError(f"{len(names)} value names for a domain of {d}")
    ps, qs = support_probabilities(params)
    span = ps - qs
    count = (support - n * qs) / span
    var = n * qs * (1 - qs) / span**2 + np.maximum(count, 0.0) * (1 - ps - qs) / span
    proportion = count / n
    std_error = np.sqrt(np.maximum(var, 0.0)) / n
    null_se = math.sqrt(qs * (1 - qs) / n) / span
    return unbiased_table(
        names,
        proportion,
        std_error,
        null_se,
        num_reports=n,
        method=f"{params.mechanism}: unbiased estimator" + (" + simplex projection" * project),
        alpha=alpha,
        correction=correction,
        level=level,
        interval=interval,
        project=project,
        diagnostics={"p_star": ps, "q_star": qs},
    )


def unbiased_table(
    names: tuple[str, ...],
    proportion: FloatArray,
    std_error: FloatArray,
    null_se: float,
    *,
    num_reports: int,
    method: str,
    alpha: float,
    correction: Correction,
    level: float,
    interval: IntervalMethod,
    project: bool = False,
    diagnostics: dict[str, Any] | None = None,
) -> DecodeResult:
    """The decoded table of a closed-form unbiased estimator (one row per domain value):
    one-sided tests against 0, intervals, and the distribution answer.

    Intervals are those of the unbiased estimator; the distribution answer is the
    Euclidean projection onto the simplex (Norm-Sub, Wang et al., NDSS 2020) with
    the interval it falls in. ``project`` reports the projection as the estimate,
    and widens each row's interval to contain it (low <= estimate <= high always).
    ``null_se`` is the standard error of a value nobody holds (detection threshold).
    """
    p_value = one_sided_p_values(proportion, std_error)
    is_sig = significant(p_value, alpha=alpha, correction=correction)
    ci_low, ci_high = report_intervals(
        proportion,
        std_error,
        is_sig,
        method=interval,
        alpha=alpha,
        correction=correction,
        level=level,
    )
    dist = project_to_simplex(proportion)
    dist_low = np.minimum(np.maximum(ci_low, 0.0), dist)
    dist_high = np.maximum(np.minimum(ci_high, 1.0), dist)
    if project:
        proportion = dist
        ci_low, ci_high = np.minimum(ci_low, proportion), np.maximum(ci_high, proportion)
    tests = len(names) if correction == "bonferroni" else 1
    return DecodeResult(
        values=names,
        proportion=proportion,
        std_error=std_error,
        ci_low=ci_low,
        ci_high=np.maximum(np.minimum(ci_high, 1.0), proportion),
        p_value=p_value,
        significant=is_sig,
        num_reports=num_reports,
        num_cohorts=1,
        detection_threshold=critical_z(alpha / tests) * null_se,
        method=method,
        alpha=alpha,
        correction=correction,
        ci_method=interval,
        distribution=dist,
        distribution_low=dist_low,
        distribution_high=dist_high,
        diagnostics=diagnostics or {},
    )
