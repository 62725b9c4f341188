"""RAPPOR decoding: per-cohort Bloom bit counts + candidate values → frequencies
with analytic standard errors (Erlingsson, Pihur, Korolova, CCS 2014, §5;
google/rappor ``analysis/R/decode.R``), improved as described below.

Model. A report's bit reads 1 with probability p01 if its Bloom bit is 0 and
p11 if it is 1 (PRR then IRR; bits independent given the Bloom filter)::

    p11 = q(1 - f/2) + p·f/2        p01 = p(1 - f/2) + q·f/2

In cohort j (N_j reports, c_ji of them with bit i set) the fraction of reports
whose Bloom bit i is set is estimated without bias by

    y_ji = (c_ji/N_j - p01) / (p11 - p01)

and, because every report's bit is an independent Bernoulli(π_ji) draw,
π_ji = p01 + (p11 - p01)·E[y_ji],

    Var(y_ji) = π_ji (1 - π_ji) / (N_j (p11 - p01)^2).

With x_v the fraction of reports carrying candidate v and X the (m·k × C)
0/1 design matrix (row j·k + i is 1 for v when v's Bloom filter in cohort j
has bit i), E[y] = X x.

Fit (what differs from the reference):

1. Weighted least squares with the binomial variances above (the reference
   fits unweighted, so cohorts and bits with more noise count as much as the
   rest); weights are recomputed once from the first fit's π so they do not
   correlate with the noise.
2. Screening with a non-negative LASSO (scikit-learn, sparse X) only when the
   candidates are many; then non-negative least squares (``scipy.optimize.nnls``)
   on the screened set.
3. Analytic standard errors se = sqrt(φ · diag((X_A' W X_A)^-1)) on the active
   set A, where φ = max(1, RSS_w / (rows - |A|)) inflates them when the model
   does not explain the counts (e.g. true values missing from the candidates).
4. One-sided z-tests, a multiple-testing correction over all C candidates,
   and backward elimination: non-significant candidates are dropped and the
   rest refitted until every remaining one is significant (their mass would
   otherwise be mis-attributed to colliding candidates).
5. Wald 95% intervals; detection threshold z_{α/C}·se_0, se_0 the standard
   error of an isolated candidate at the observed noise level.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from aggregator.decode.errors import (
    DecodeWarning,
    IllPosedError,
    NoReportsError,
    ParamsMismatchError,
)
from aggregator.decode.rappor_model import (
    bit_estimates,
    design_matrix,
    detection_threshold,
    report_probabilities,
)
from aggregator.decode.result import DecodeResult
from aggregator.decode.stats import (
    INTERVALS,
    Correction,
    IntervalMethod,
    critical_z,
    one_sided_p_values,
    report_intervals,
    significant,
)
from aggregator.decode.wls import (
    fit_nnls,
    inverse_diagonal,
    lasso_screen,
)
from client.params import RapporParams

__all__ = [
    "DecodeOptions",
    "bit_estimates",
    "decode_rappor",
    "design_matrix",
    "detection_threshold",
    "report_probabilities",
]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeOptions:
    """Tuning of the RAPPOR decoder (defaults are what bench/accuracy.py measured)."""

    alpha: float = 0.05
    correction: Correction = "bonferroni"
    level: float = 0.95
    #: Intervals of detected rows: "selective" (selection-adjusted) or "wald".
    interval: IntervalMethod = "selective"
    #: LASSO screening runs when candidates exceed this share of the equations.
    screen_above: float = 0.2
    #: LASSO penalty as a z-score of an isolated null candidate's score.
    screen_z: float = 2.0
    #: At most this share of the equations survive screening.
    max_support: float = 0.5
    #: Candidates with estimate/se below this are pruned before testing (0: never).
    prune_z: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.correction not in ("bonferroni", "bh", "none"):
            raise ValueError(f"correction must be bonferroni, bh or none, got {self.correction!r}")
        if not 0.0 < self.level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {self.level}")
        if self.interval not in INTERVALS:
            raise ValueError(f"interval must be wald or selective, got {self.interval!r}")
        if self.screen_z < 0 or self.screen_above <= 0 or not 0 < self.max_support <= 1:
            raise ValueError("screen_z >= 0, screen_above > 0 and 0 < max_support <= 1 required")


def _check_inputs(
    totals: npt.NDArray[Any],
    ones: npt.NDArray[Any],
    params: RapporParams,
    x: sp.spmatrix,
    values: Sequence[str],
) -> None:
    m, k = params.m, params.k
    if totals.shape != (m,) or ones.shape != (m, k):
        raise ParamsMismatchError(
            f"counts have {totals.shape[0]} cohorts × {ones.shape[-1]} bits but params say "
            f"m={m}, k={k}"
        )
    if x.shape[0] != m * k:
        raise ParamsMismatchError(f"design matrix has {x.shape[0]} rows, expected m·k = {m * k}")
    if x.shape[1] != len(values):
        raise ParamsMismatchError(f"{x.shape[1]} design columns for {len(values)} candidates")
    if len(values) == 0:
        raise IllPosedError("no candidate values to decode against")
    if np.any(totals < 0) or np.any(ones < 0) or np.any(ones > totals[:, None]):
        raise ParamsMismatchError("bit counts must be between 0 and their cohort's report total")


def _duplicate_columns(x: sp.csc_matrix, values: Sequence[str]) -> list[list[str]]:
    """Groups of candidates whose Bloom bits agree in every used cohort."""
    seen: dict[bytes, list[int]] = {}
    indptr, indices = x.indptr, x.indices
    for v in range(x.shape[1]):
        key = np.sort(indices[indptr[v] : indptr[v + 1]]).tobytes()
        seen.setdefault(key, []).append(v)
    return [[values[i] for i in group] for group in seen.values() if len(group) > 1]


def decode_rappor(
    totals: npt.ArrayLike,
    ones: npt.ArrayLike,
    params: RapporParams,
    design: sp.spmatrix,
    candidates: Sequence[str],
    options: DecodeOptions | None = None,
) -> DecodeResult:
    """Frequencies of ``candidates`` from per-cohort counts (see the module docstring)."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]  # via scikit-learn

    # The matrices are small (rows × a few hundred): threaded BLAS only adds
    # contention (measured 5× slower on a busy 2-core box), so decode on one core.
    with threadpool_limits(limits=1, user_api="blas"):
        return _decode_rappor(totals, ones, params, design, candidates, options)


def _decode_rappor(
    totals: npt.ArrayLike,
    ones: npt.ArrayLike,
    params: RapporParams,
    design: sp.spmatrix,
    candidates: Sequence[str],
    options: DecodeOptions | None,
) -> DecodeResult:
    opts = options if options is not None else DecodeOptions()
    started = time.perf_counter()
    tot = np.asarray(totals)
    cnt = np.asarray(ones)
    values = tuple(str(v) for v in candidates)
    x_all = sp.csc_matrix(design, dtype=np.float64)
    _check_inputs(tot, cnt, params, x_all, values)
    n_reports = int(tot.sum())
    if n_reports == 0:
        raise NoReportsError("there are no reports to decode")
    notes: list[str] = []
    empty = np.flatnonzero(tot == 0)
    if empty.size:
        notes.append(
            f"{empty.size} of {params.m} cohorts have no reports and were left out "
            f"(first: {empty[:5].tolist()}); estimates rest on the other cohorts"
        )
    y, _ = bit_estimates(tot, cnt, params)
    used = np.repeat(tot > 0, params.k)
    rows = np.flatnonzero(used)
    x = x_all[rows]
    c = len(values)
    dups = _duplicate_columns(x, values)
    if dups:
        shown = "; ".join(" = ".join(g[:4]) for g in dups[:5])
        raise IllPosedError(
            f"{sum(len(g) for g in dups)} candidates have identical Bloom bits in every cohort "
            f"and cannot be told apart ({shown}); remove duplicates or use more cohorts/bits"
        )
    if c > rows.size:
        notes.append(
            f"{c} candidates but only {rows.size} equations: relying on sparsity "
            f"(LASSO screening); values the counts cannot separate are not reported"
        )
    y_obs = y.ravel()[rows]
    p01, p11 = report_probabilities(params)
    span = p11 - p01
    n_of_row = np.repeat(tot.astype(np.float64), params.k)[rows]

    # A report of a value outside the candidates sets each bit with probability
    # b = 1 - (1 - 1/k)^h; with u = 1 - Σx such reports, E[y] = b + (X - b)·x.
    background = 1.0 - (1.0 - 1.0 / params.k) ** params.h

    def whiten(pi: FloatArray) -> tuple[sp.csc_matrix, FloatArray, FloatArray, FloatArray]:
        pi = np.clip(pi, p01, p11)
        sw = np.sqrt(n_of_row) * span / np.sqrt(pi * (1 - pi))
        xw = sp.csc_matrix(sp.diags(sw) @ x)
        offset = sw * background
        # ‖xw_v - offset‖ without densifying xw
        sq = np.asarray(xw.multiply(xw).sum(axis=0)).ravel()
        norms = np.sqrt(np.maximum(sq - 2 * (xw.T @ offset) + offset @ offset, 0.0))
        return xw, sw * y_obs - offset, offset, norms

    # Stage 0: weights from the observed bit rates, candidate screening.
    xw, target, offset, norms = whiten(p01 + span * y_obs)
    flat = norms <= 1e-9 * max(float(norms.max()), 1e-300)
    if flat.any():
        raise IllPosedError(
            f"{int(flat.sum())} candidate(s) (e.g. {values[int(np.flatnonzero(flat)[0])]!r}) set "
            f"every bit a value outside the candidates would (k={params.k}, h={params.h}): "
            "their frequency cannot be estimated from these counts"
        )
    screened = c > opts.screen_above * rows.size
    t_screen = time.perf_counter()
    support = (
        lasso_screen(
            xw, target + offset, norms, screen_z=opts.screen_z, max_support=opts.max_support
        )
        if screened
        else np.arange(c)
    )
    t_screen = time.perf_counter() - t_screen
    n_screened = int(support.size)
    fit = fit_nnls(xw[:, support].toarray(), target, offset, support)
    # Stage 1: re-weight from the fitted bit rates (noise-free weights), refit.
    fitted = background * (1 - fit.beta.sum()) + np.asarray(x[:, support] @ fit.beta).ravel()
    xw, target, offset, norms = whiten(p01 + span * fitted)
    fit = fit_nnls(xw[:, support].toarray(), target, offset, support)
    # Stage 2: prune candidates whose estimates are indistinguishable from zero
    # (z < prune_z) and refit, until none is pruned: dropping them lowers the
    # others' variance inflation from collisions (see the module docstring).
    for _ in range(20):
        z = np.where(np.isfinite(fit.std_error), fit.beta / fit.std_error, 0.0)
        keep = z >= opts.prune_z
        if keep.all() or not keep.any():
            break
        support = support[keep]
        fit = fit_nnls(xw[:, support].toarray(), target, offset, support)

    proportion = np.zeros(c)
    std_error = np.full(c, np.inf)
    p_value = np.ones(c)
    proportion[support] = fit.beta
    std_error[support] = fit.std_error
    p_value[support] = one_sided_p_values(fit.beta, fit.std_error)
    is_sig = significant(p_value, alpha=opts.alpha, correction=opts.correction)
    if is_sig.any():
        xa = xw[:, np.flatnonzero(is_sig)].toarray() - offset[:, None]
        if not np.all(np.isfinite(inverse_diagonal(xa.T @ xa))):
            raise IllPosedError(
                "the significant candidates are collinear in the design (the counts cannot "
                "separate them); use more cohorts or Bloom bits, or fewer candidates"
            )
    # Candidates not in the fit: the SE an isolated candidate would have.
    null_se = np.sqrt(fit.dispersion) / np.maximum(norms, 1e-300)
    unfitted = ~np.isfinite(std_error)
    std_error[unfitted] = null_se[unfitted]
    ci_low, ci_high = report_intervals(
        proportion,
        std_error,
        is_sig,
        method=opts.interval,
        alpha=opts.alpha,
        correction=opts.correction,
        level=opts.level,
    )
    tests = c if opts.correction == "bonferroni" else 1
    threshold = critical_z(opts.alpha / tests) * float(np.median(null_se))
    for note in notes:
        warnings.warn(note, DecodeWarning, stacklevel=3)
    return DecodeResult(
        values=values,
        proportion=proportion,
        std_error=std_error,
        ci_low=ci_low,
        ci_high=ci_high,
        p_value=p_value,
        significant=is_sig,
        num_reports=n_reports,
        num_cohorts=int((tot > 0).sum()),
        detection_threshold=threshold,
        method="rappor: weighted NNLS" + (" after LASSO screening" if screened else ""),
        alpha=opts.alpha,
        correction=opts.correction,
        ci_method=opts.interval,
        warnings=tuple(notes),
        diagnostics={
            "screened": n_screened,
            "screen_seconds": t_screen,
            "fitted": int(support.size),
            "dispersion": fit.dispersion,
            "unexplained_mass": float(1.0 - fit.beta.sum()),
            "equations": int(rows.size),
            "decode_seconds": time.perf_counter() - started,
        },
    )
