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

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scipy.optimize import nnls

from aggregator.decode.errors import (
    DecodeWarning,
    IllPosedError,
    NoReportsError,
    ParamsMismatchError,
)
from aggregator.decode.result import DecodeResult
from aggregator.decode.stats import (
    Correction,
    confidence_interval,
    critical_z,
    one_sided_p_values,
    selective_interval,
    significant,
)
from client.hashing import bloom_int
from client.params import Hashing, RapporParams

__all__ = [
    "DecodeOptions",
    "bit_estimates",
    "decode_rappor",
    "design_matrix",
    "detection_threshold",
    "report_probabilities",
]

FloatArray = npt.NDArray[np.float64]
# Below this the Gram matrix of the final support is treated as singular.
_MIN_EIGEN_RATIO = 1e-10


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeOptions:
    """Tuning of the RAPPOR decoder (defaults are what bench/accuracy.py measured)."""

    alpha: float = 0.05
    correction: Correction = "bonferroni"
    level: float = 0.95
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
        if self.screen_z < 0 or self.screen_above <= 0 or not 0 < self.max_support <= 1:
            raise ValueError("screen_z >= 0, screen_above > 0 and 0 < max_support <= 1 required")


def report_probabilities(params: RapporParams) -> tuple[float, float]:
    """(p01, p11): P(report bit 1 | Bloom bit 0) and P(report bit 1 | Bloom bit 1)."""
    f, p, q = params.f, params.p, params.q
    return p * (1 - f / 2) + q * f / 2, q * (1 - f / 2) + p * f / 2


def bit_estimates(
    totals: npt.ArrayLike, ones: npt.ArrayLike, params: RapporParams
) -> tuple[FloatArray, FloatArray]:
    """Unbiased Bloom bit fractions y (m, k) and their binomial variances.

    Variances use π clipped to [p01, p11] (its possible range); cohorts with
    no reports get y = 0 and variance inf.
    """
    tot = np.asarray(totals, dtype=np.float64)
    c = np.asarray(ones, dtype=np.float64)
    p01, p11 = report_probabilities(params)
    span = p11 - p01
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = c / tot[:, None]
        y = np.where(tot[:, None] > 0, (frac - p01) / span, 0.0)
        pi = np.clip(frac, p01, p11)
        var = np.where(tot[:, None] > 0, pi * (1 - pi) / (tot[:, None] * span**2), np.inf)
    return y, var


def design_matrix(
    candidates: Sequence[str | bytes], params: RapporParams, hashing: Hashing = "mmh3"
) -> sp.csc_matrix:
    """X (m·k × C), X[j·k + i, v] = 1 when candidate v's Bloom filter in cohort j has bit i.

    Hashing is ``client.hashing.bloom_int``: the one definition the encoders use.
    """
    params.check_hashing(hashing)
    k, m = params.k, params.m
    rows: list[int] = []
    cols: list[int] = []
    for v, value in enumerate(candidates):
        for cohort in range(m):
            bloom = bloom_int(value, cohort, params, hashing)
            base = cohort * k
            while bloom:
                low = bloom & -bloom
                rows.append(base + low.bit_length() - 1)
                cols.append(v)
                bloom ^= low
    data = np.ones(len(rows), dtype=np.float64)
    return sp.csc_matrix((data, (rows, cols)), shape=(m * k, len(candidates)))


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


def _lasso_screen(
    xw: sp.csc_matrix, yw: FloatArray, col_norms: FloatArray, options: DecodeOptions
) -> npt.NDArray[np.intp]:
    """Candidates a non-negative LASSO keeps (sklearn objective ‖y−Xb‖²/2n + α‖b‖₁).

    A null candidate enters when |x_v' r|/n > α; x_v' r has sd ‖x_v‖, so
    α = screen_z·median‖x_v‖/n admits it with probability Φ̄(screen_z).
    """
    from sklearn.linear_model import Lasso

    n_rows = xw.shape[0]
    cap = max(1, int(options.max_support * n_rows))
    alpha = max(options.screen_z, 1e-3) * float(np.median(col_norms)) / n_rows
    keep = np.arange(0)
    for _ in range(12):
        model = Lasso(
            alpha=alpha,
            positive=True,
            fit_intercept=True,
            max_iter=2000,
            tol=1e-4,
            selection="cyclic",
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarning: screening needs no precision
            model.fit(xw, yw)
        keep = np.flatnonzero(model.coef_ > 0)
        if keep.size <= cap:
            return keep
        alpha *= 1.5
    return keep[np.argsort(-model.coef_[keep])[:cap]]


def _sum_std_error(a: FloatArray, beta: FloatArray) -> float:
    """Standard error of Σβ over the active columns (unit-variance whitened rows)."""
    active = beta > 0
    if not active.any():
        return 0.0
    aa = a[:, active]
    try:
        sol = np.linalg.solve(aa.T @ aa, np.ones(int(active.sum())))
    except np.linalg.LinAlgError:
        return math.inf
    return math.sqrt(max(float(np.sum(sol)), 0.0))


def _inverse_diagonal(gram: FloatArray) -> FloatArray:
    """diag(G^-1) for a Gram matrix; inf for directions G cannot resolve (collinear columns)."""
    try:
        chol = np.linalg.cholesky(gram)
        d = np.diag(chol)
        if d.min() ** 2 > _MIN_EIGEN_RATIO * np.max(np.diag(gram)):
            inv_l = np.linalg.solve(chol, np.eye(gram.shape[0]))
            return np.asarray(np.einsum("ij,ij->j", inv_l, inv_l), dtype=np.float64)
    except np.linalg.LinAlgError:
        pass
    diag = np.diag(np.linalg.pinv(gram, hermitian=True))
    # pinv gives finite variances for unresolvable directions; call them infinite
    w, v = np.linalg.eigh(gram)
    null = w <= _MIN_EIGEN_RATIO * max(float(w[-1]), 1e-300)
    unresolved = np.any(np.abs(v[:, null]) > 1e-6, axis=1)
    return np.where(unresolved, np.inf, np.maximum(diag, 0.0))


@dataclass(slots=True)
class _Fit:
    support: npt.NDArray[np.intp]  # candidate indexes fitted
    beta: FloatArray  # per support entry (>= 0)
    std_error: FloatArray  # per support entry (inf where beta == 0)
    dispersion: float
    rss: float


def _nnls_normal(gram: FloatArray, corr: FloatArray, a: FloatArray, t: FloatArray) -> FloatArray:
    """argmin_{β>=0} ‖aβ − t‖² through the small normal equations when a is tall.

    With G = a'a = R'R (Cholesky), ‖aβ − t‖² = ‖Rβ − R'⁻¹a't‖² + const, an
    NNLS problem with as many rows as columns (8192 → 245 rows: ~10× faster).
    Falls back to the tall problem when G is not numerically positive definite.
    """
    maxiter = 50 * max(10, gram.shape[0])
    if a.shape[0] > 2 * a.shape[1]:
        try:
            upper = np.linalg.cholesky(gram).T
            rhs = np.linalg.solve(upper.T, corr)
            beta, _ = nnls(upper, rhs, maxiter=maxiter)
            return np.asarray(beta, dtype=np.float64)
        except (np.linalg.LinAlgError, RuntimeError):
            pass
    beta, _ = nnls(a, t, maxiter=maxiter)
    return np.asarray(beta, dtype=np.float64)


def _fit(
    xd: FloatArray, target: FloatArray, offset: FloatArray, support: npt.NDArray[np.intp]
) -> _Fit:
    """NNLS of ``target`` on centred whitened columns ``xd - offset`` and analytic SEs."""
    n_rows = xd.shape[0]
    if support.size == 0:
        rss = float(target @ target)
        return _Fit(support, np.zeros(0), np.zeros(0), max(1.0, rss / n_rows), rss)
    a = xd - offset[:, None]
    gram = a.T @ a
    corr = a.T @ target
    beta = _nnls_normal(gram, corr, a, target)
    if beta.sum() > 1.0 + 3.0 * _sum_std_error(a, beta):
        # Frequencies cannot sum past 1. Only an excess beyond noise is corrected
        # (clamping every excess would bias all estimates down when Σx = 1):
        # refit with Σβ = 1 as a heavily weighted extra equation w·(1'β − 1).
        w2 = 1e6 * float(np.mean(np.diag(gram)))
        beta = _nnls_normal(
            gram + w2,
            corr + w2,
            np.vstack([a, np.full((1, a.shape[1]), math.sqrt(w2))]),
            np.append(target, math.sqrt(w2)),
        )
    active = beta > 0
    resid = target - a @ beta
    rss = float(resid @ resid)
    dof = max(1, n_rows - int(active.sum()))
    dispersion = max(1.0, rss / dof)
    se = np.full(support.size, np.inf)
    if active.any():
        aa = a[:, active]
        se[active] = np.sqrt(dispersion * _inverse_diagonal(aa.T @ aa))
    return _Fit(support, beta, se, dispersion, rss)


def _selection_cutoff(
    p_value: FloatArray, is_sig: npt.NDArray[np.bool_], opts: DecodeOptions
) -> float:
    """The z a candidate's β̂/se had to pass to be reported under ``opts``' test."""
    c = p_value.size
    if opts.correction == "bonferroni":
        return critical_z(opts.alpha / c)
    if opts.correction == "bh":
        return critical_z(int(is_sig.sum()) * opts.alpha / c)
    return critical_z(opts.alpha)


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
    screened = c > opts.screen_above * rows.size
    t_screen = time.perf_counter()
    support = _lasso_screen(xw, target + offset, norms, opts) if screened else np.arange(c)
    t_screen = time.perf_counter() - t_screen
    n_screened = int(support.size)
    fit = _fit(xw[:, support].toarray(), target, offset, support)
    # Stage 1: re-weight from the fitted bit rates (noise-free weights), refit.
    fitted = background * (1 - fit.beta.sum()) + np.asarray(x[:, support] @ fit.beta).ravel()
    xw, target, offset, norms = whiten(p01 + span * fitted)
    fit = _fit(xw[:, support].toarray(), target, offset, support)
    # Stage 2: prune candidates whose estimates are indistinguishable from zero
    # (z < prune_z) and refit, until none is pruned: dropping them lowers the
    # others' variance inflation from collisions (see the module docstring).
    for _ in range(20):
        z = np.where(np.isfinite(fit.std_error), fit.beta / fit.std_error, 0.0)
        keep = z >= opts.prune_z
        if keep.all() or not keep.any():
            break
        support = support[keep]
        fit = _fit(xw[:, support].toarray(), target, offset, support)

    proportion = np.zeros(c)
    std_error = np.full(c, np.inf)
    p_value = np.ones(c)
    proportion[support] = fit.beta
    std_error[support] = fit.std_error
    p_value[support] = one_sided_p_values(fit.beta, fit.std_error)
    is_sig = significant(p_value, alpha=opts.alpha, correction=opts.correction)
    if is_sig.any():
        xa = xw[:, np.flatnonzero(is_sig)].toarray() - offset[:, None]
        if not np.all(np.isfinite(_inverse_diagonal(xa.T @ xa))):
            raise IllPosedError(
                "the significant candidates are collinear in the design (the counts cannot "
                "separate them); use more cohorts or Bloom bits, or fewer candidates"
            )
    # Candidates not in the fit: the SE an isolated candidate would have.
    null_se = np.sqrt(fit.dispersion) / np.maximum(norms, 1e-300)
    unfitted = ~np.isfinite(std_error)
    std_error[unfitted] = null_se[unfitted]
    ci_low, ci_high = confidence_interval(proportion, std_error, opts.level)
    if is_sig.any():
        # Detected values were reported because β̂/se passed the test: condition on it.
        cutoff = _selection_cutoff(p_value, is_sig, opts)
        lo, hi = selective_interval(proportion[is_sig], std_error[is_sig], cutoff, opts.level)
        ci_low[is_sig], ci_high[is_sig] = lo, hi
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


def detection_threshold(
    params: RapporParams, num_reports: int, *, num_candidates: int = 1, alpha: float = 0.05
) -> float:
    """Smallest proportion detected (at 50% power) for these params and n, before data.

    An isolated candidate has h Bloom bits in each cohort, each estimated with
    variance ≈ p*(1-p*)/(N_j (p11-p01)^2) when rare (π ≈ p01 = p*), so
    se_0 = sqrt(p01(1-p01) / (h·n)) / (p11 - p01); threshold = z_{α/C}·se_0.
    """
    if num_reports < 1:
        raise ValueError(f"num_reports must be positive, got {num_reports}")
    p01, p11 = report_probabilities(params)
    se0 = math.sqrt(p01 * (1 - p01) / (params.h * num_reports)) / (p11 - p01)
    return critical_z(alpha / max(1, num_candidates)) * se0
