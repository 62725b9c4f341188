"""RAPPOR decoding: per-cohort Bloom bit counts + candidate values → frequencies with
analytic standard errors (Erlingsson, Pihur, Korolova, CCS 2014, §5; google/rappor
``analysis/R/decode.R``), improved as in docs/design.md, "Aggregator: decode".

Model: a report's bit reads 1 w.p. p11 = q(1 − f/2) + p·f/2 if its Bloom bit is set and
p01 = p(1 − f/2) + q·f/2 if not. In cohort j (N_j reports, c_ji with bit i set)
y_ji = (c_ji/N_j − p01)/(p11 − p01) estimates the share with Bloom bit i set, with
Var(y_ji) = π_ji(1 − π_ji)/(N_j(p11 − p01)²); E[y] = X x for the 0/1 design matrix X.
Fit: weighted least squares, LASSO screening when candidates are many, NNLS, analytic
standard errors inflated by overdispersion, pruning, one-sided tests with a
multiple-testing correction (default Benjamini–Hochberg, FDR 0.1). ``DecodeResult``
gives two answers: the *detected list* (``significant``: which values are present) and
the *distribution* over every candidate (empirical-Bayes shrinkage, ``shrink``, projected
onto {x ≥ 0, Σx ≤ 1}, Norm-Sub: Wang et al., NDSS 2020); where the detected values hold
little of the mass, a random-effects fit (``ridge``) spreads what the counts place.
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

from crowdmix.aggregator.decode.basic import project_to_simplex
from crowdmix.aggregator.decode.errors import (
    DecodeWarning,
    IllPosedError,
    NoReportsError,
    ParamsMismatchError,
)
from crowdmix.aggregator.decode.rappor_model import (
    bit_estimates,
    design_matrix,
    detection_threshold,
    report_probabilities,
)
from crowdmix.aggregator.decode.result import DecodeResult
from crowdmix.aggregator.decode.ridge import norm_sub, random_effects_fit
from crowdmix.aggregator.decode.shrink import npmle_posterior
from crowdmix.aggregator.decode.stats import (
    INTERVALS,
    Correction,
    IntervalMethod,
    confidence_interval,
    critical_z,
    one_sided_p_values,
    report_intervals,
    selection_cutoff,
    significant,
)
from crowdmix.aggregator.decode.wls import (
    Fit,
    centred_gram,
    fit_nnls,
    inverse_diagonal,
    lasso_screen,
    spd_solve,
)
from crowdmix.core.params import RapporParams

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
    """Tuning of the RAPPOR decoder (defaults are what the benches measured).

    The default test is Benjamini–Hochberg at a false discovery rate of 0.1
    after pruning at z < 0.5, chosen on reports encoded by google/rappor's own
    client (bench/accuracy_rappor_client.py, the three development splits): the
    highest level and the largest pruning z (of 0, 0.25, 0.5, 0.75, 1) whose
    false positives stay at or below google/rappor's decoder's on every case
    type of every split; Bonferroni at 0.05 misses far more true values
    (bench/README.md).
    """

    alpha: float = 0.1
    correction: Correction = "bh"
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
    #: Those kept share what values outside the fit put on their bits, so fewer
    #: absent candidates pass the test: at 1.0 more of them did than the
    #: reference's on two of three development splits (unif-overcomplete 10 > 7,
    #: zipf-overcomplete 35 > 32; at 0.5: 7 and 29; bench/README.md).
    prune_z: float = 0.5
    #: The distribution answer fits every candidate without constraints when
    #: candidates are at most this share of the equations (else: detected values).
    full_fit_share: float = 0.5
    #: ... and, when screening was needed, the detected values hold less than
    #: this share of the reports.
    sparse_mass: float = 0.8
    #: After screening, candidates the screen left out whose score on the
    #: residual exceeds this z are added back and refitted (0: never).
    add_z: float = 2.0
    #: When the distribution is the detected values' refit and they hold less
    #: than ``sparse_mass``, the other candidates share the mass left if a
    #: random-effects fit finds it flat (``crowdmix.aggregator.decode.ridge``).
    spread: bool = True
    #: The distribution's summary of each posterior: "mean" or "median".
    summary: str = "mean"
    #: Detected rows' intervals take their width from this multiple of the
    #: standard error (the test's cutoff stays where it was): values outside
    #: the fit (left out of the candidates, or too small to keep) collide with
    #: fitted ones and add error the model's se does not hold. 1.15: the
    #: smallest of 1, 1.15, 1.3, 1.45 covering >= 95% on development cases
    #: (google/rappor's client and bench/accuracy.py --dev; BENCHMARKS.md).
    interval_scale: float = 1.15

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.correction not in ("bonferroni", "bh", "none"):
            raise ValueError(f"correction must be bonferroni, bh or none, got {self.correction!r}")
        if not 0.0 < self.level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {self.level}")
        if self.interval not in INTERVALS:
            raise ValueError(f"interval must be wald or selective, got {self.interval!r}")
        if self.summary not in ("mean", "median"):
            raise ValueError(f"summary must be mean or median, got {self.summary!r}")
        if not self.interval_scale >= 1.0:
            raise ValueError(f"interval_scale must be >= 1, got {self.interval_scale}")
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
    x = x.sorted_indices() if not x.has_sorted_indices else x
    indptr, indices = x.indptr, x.indices
    for v in range(x.shape[1]):
        seen.setdefault(indices[indptr[v] : indptr[v + 1]].tobytes(), []).append(v)
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
    x = sp.csc_matrix(x_all[rows])
    x.sum_duplicates()  # a copy: canonical, so rows scale entry by entry (``whiten``)
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
        xw = sp.csc_matrix((x.data * sw[x.indices], x.indices, x.indptr), shape=x.shape)
        offset = sw * background
        # ‖xw_v - offset‖ without densifying xw
        sq = np.asarray(sp.csc_matrix((xw.data**2, x.indices, x.indptr), shape=x.shape).sum(0))
        sq = sq.ravel()
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
    fit = fit_nnls(xw[:, support], target, offset, support)
    # Stage 1: re-weight from the fitted bit rates (noise-free weights), refit.
    fitted = background * (1 - fit.beta.sum()) + np.asarray(x[:, support] @ fit.beta).ravel()
    xw, target, offset, norms = whiten(p01 + span * fitted)
    # The distribution answer starts from unbiased estimates of every candidate
    # when the candidates are few enough for an unconstrained fit to be stable.
    full_ok = c <= opts.full_fit_share * rows.size
    # (at most 2 000 candidates: 32 MB; beyond, as many bytes as the fits need)
    grams = _Grams(xw, offset, whole=full_ok and c <= 2000)
    fit = fit_nnls(xw[:, support], target, offset, support, grams(support))
    if screened and opts.add_z > 0:
        support, fit = _add_missed(xw, target, offset, norms, support, fit, opts, grams)
    unbiased = (
        _unbiased_fit(xw, target, offset, np.arange(c), rows.size, grams) if not screened else None
    )
    # Stage 2: prune candidates whose estimates are indistinguishable from zero
    # (z < prune_z) and refit, until none is pruned: dropping them lowers the
    # others' variance inflation from collisions (see the module docstring).
    for _ in range(20):
        z = np.where(np.isfinite(fit.std_error), fit.beta / fit.std_error, 0.0)
        keep = z >= opts.prune_z
        if keep.all() or not keep.any():
            break
        support = support[keep]
        fit = fit_nnls(xw[:, support], target, offset, support, grams(support))

    proportion = np.zeros(c)
    std_error = np.full(c, np.inf)
    p_value = np.ones(c)
    proportion[support] = fit.beta
    std_error[support] = fit.std_error
    p_value[support] = one_sided_p_values(fit.beta, fit.std_error)
    is_sig = significant(p_value, alpha=opts.alpha, correction=opts.correction)
    if is_sig.any() and not np.all(np.isfinite(inverse_diagonal(grams(np.flatnonzero(is_sig))))):
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
        width_error=None if opts.interval_scale == 1.0 else opts.interval_scale * std_error,
    )
    dist_from = "all candidates"
    cutoff: float | None = None
    spread_mass = 0.0
    if screened:
        # Many candidates: when the detected values hold most reports (a sparse
        # distribution) refit after selection, on them only; when much mass is
        # spread below the detection threshold (a smooth distribution over many
        # values) and the all-candidate fit exists, shrink that one instead.
        if not full_ok or proportion[is_sig].sum() >= opts.sparse_mass:
            refit = _unbiased_fit(xw, target, offset, np.flatnonzero(is_sig), rows.size, grams)
            # These values are there because they passed the test: their prior
            # is fitted with the truncated likelihood (winner's curse; see
            # aggregator.decode.shrink). The cutoff is the test's, applied to
            # the refit's own z (an approximation: selection used the fit's).
            cutoff = selection_cutoff(
                c, int(is_sig.sum()), alpha=opts.alpha, correction=opts.correction
            )
            dist, dist_low, dist_high = _distribution(
                c, *refit, opts.level, cutoff_z=cutoff, summary=opts.summary
            )
            dist_from = "detected values"
            if opts.spread and proportion[is_sig].sum() < opts.sparse_mass:
                # Little of the mass was detected and the all-candidate fit does
                # not exist: a random-effects fit spreads what the counts say
                # is there, over every candidate if their shares look flat, else
                # over the candidates outside the detected values if theirs do.
                for fixed in (np.zeros(c, dtype=bool), is_sig):
                    spread = _spread(xw, target, offset, norms, fixed, fit.dispersion)
                    if spread is None:
                        continue
                    others, mean, upper = spread
                    room = max(0.0, 1.0 - float(dist[fixed].sum()))
                    share = norm_sub(mean, min(float(mean.sum()), room))
                    dist[~fixed] = 0.0
                    dist[others], dist_low[others] = share, 0.0
                    dist_high[others] = np.maximum(share, upper)
                    spread_mass = float(share.sum())
                    dist_from = (
                        "detected values and the rest spread (random effects)"
                        if fixed.any()
                        else "every candidate (random effects)"
                    )
                    break
        else:
            unbiased = _unbiased_fit(xw, target, offset, np.arange(c), rows.size, grams)
            dist, dist_low, dist_high = _distribution(
                c, *unbiased, opts.level, summary=opts.summary
            )
    else:
        assert unbiased is not None
        dist, dist_low, dist_high = _distribution(c, *unbiased, opts.level, summary=opts.summary)
    # Candidates the distribution's fit left out (share 0) keep the detection
    # answer's Wald upper end: absent from the fit is not proved absent.
    left_out = dist_high <= 0
    dist_high[left_out] = np.maximum(ci_high[left_out], 0.0)
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
        distribution=dist,
        distribution_low=dist_low,
        distribution_high=dist_high,
        warnings=tuple(notes),
        diagnostics={
            "screened": n_screened,
            "screen_seconds": t_screen,
            "fitted": int(support.size),
            "dispersion": fit.dispersion,
            "unexplained_mass": float(1.0 - fit.beta.sum()),
            "equations": int(rows.size),
            "distribution_from": dist_from,
            # z the distribution's values had to pass (their prior is fitted as
            # selected values); None when the distribution involves no selection
            "distribution_selection_z": cutoff,
            # mass the distribution gives candidates outside the detected values
            # from the random-effects fit (0 when it was not used)
            "distribution_spread_mass": spread_mass,
            "distribution_mass": float(dist.sum()),
            "decode_seconds": time.perf_counter() - started,
        },
    )


class _Grams:
    """A'A of subsets of the centred whitened columns A = xw − offset·1'.

    With few candidates (``whole``: an all-candidate fit may be made) the C × C
    Gram is formed once and every subset takes its rows and columns from it;
    otherwise each subset's is formed from its sparse columns (the same sums).
    """

    def __init__(self, xw: sp.csc_matrix, offset: FloatArray, whole: bool) -> None:
        self.xw, self.offset = xw, offset
        self.whole = centred_gram(xw, offset) if whole else None

    def __call__(self, idx: npt.NDArray[np.intp]) -> FloatArray:
        if self.whole is None:
            return centred_gram(self.xw[:, idx], self.offset)
        if idx.size == self.whole.shape[0] and np.array_equal(idx, np.arange(idx.size)):
            return self.whole  # not copied: no caller writes to a Gram
        return np.asarray(self.whole[np.ix_(idx, idx)])


def _unbiased_fit(
    xw: sp.csc_matrix,
    target: FloatArray,
    offset: FloatArray,
    support: npt.NDArray[np.intp],
    n_rows: int,
    grams: _Grams,
) -> tuple[npt.NDArray[np.intp], FloatArray, FloatArray]:
    """Unconstrained WLS on ``support``: (support, β̂, se), se = sqrt(φ·diag((A'A)^-1)).

    Candidates the fit cannot resolve (infinite se) are left out.
    """
    if support.size == 0:
        return support, np.zeros(0), np.zeros(0)
    xs = xw[:, support]
    gram = grams(support)
    corr = np.asarray(xs.T @ target).ravel() - float(offset @ target)
    solved = spd_solve(gram, corr)
    if solved is None:  # collinear: leave out what the fit cannot resolve
        ok = np.isfinite(inverse_diagonal(gram))
        support, xs, corr = support[ok], xs[:, ok], corr[ok]
        gram = gram[np.ix_(ok, ok)]
        solved = spd_solve(gram, corr) if ok.any() else None
        if solved is None:
            return support[:0], np.zeros(0), np.zeros(0)
    beta, var = solved
    resid = target - np.asarray(xs @ beta).ravel() + offset * float(beta.sum())
    dispersion = max(1.0, float(resid @ resid) / max(1, n_rows - support.size))
    return support, beta, np.sqrt(dispersion * var)


def _distribution(
    c: int,
    support: npt.NDArray[np.intp],
    beta: FloatArray,
    std_error: FloatArray,
    level: float,
    cutoff_z: float | None = None,
    summary: str = "mean",
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Every candidate's share: EB posterior means on ``support`` (0 elsewhere),
    projected onto {x >= 0, Σx <= 1}; intervals contain their estimate.
    ``cutoff_z``: ``support`` holds values selected by the test z > cutoff_z."""
    dist, low, high = np.zeros(c), np.zeros(c), np.zeros(c)
    good = np.isfinite(std_error) & (std_error > 0) & np.isfinite(beta)
    if good.any():
        post = npmle_posterior(beta[good], std_error[good], level=level, cutoff_z=cutoff_z)
        idx = support[good]
        # The posterior interval treats the errors as independent (they are
        # not: collisions correlate them), so it is widened to contain the
        # unbiased estimate's Wald interval too.
        wald_low, wald_high = confidence_interval(beta[good], std_error[good], level)
        dist[idx] = post.median if summary == "median" else post.mean
        low[idx] = np.minimum(post.low, np.maximum(wald_low, 0.0))
        high[idx] = np.maximum(post.high, wald_high)
    if dist.sum() > 1.0:
        dist = project_to_simplex(dist)  # Norm-Sub: subtract a constant, clamp at 0
    return dist, np.minimum(low, dist), np.maximum(high, dist)


def _spread(
    xw: sp.csc_matrix,
    target: FloatArray,
    offset: FloatArray,
    norms: FloatArray,
    fixed: npt.NDArray[np.bool_],
    dispersion: float,
) -> tuple[npt.NDArray[np.intp], FloatArray, FloatArray] | None:
    """(candidates outside ``fixed``, their posterior means, 95% upper ends) from a
    random-effects fit, or None unless it finds their total mass present (> 2 sd)
    and their shares flat (τ < μ; see ``crowdmix.aggregator.decode.ridge``)."""
    rest = random_effects_fit(
        xw, offset, target, norms, np.flatnonzero(fixed), dispersion=dispersion
    )
    if rest.others.size == 0 or not rest.spread_pays or rest.total <= 2.0 * rest.total_sd:
        return None
    return rest.others, rest.mean, rest.mean + 1.96 * rest.sd


def _add_missed(
    xw: sp.csc_matrix,
    target: FloatArray,
    offset: FloatArray,
    norms: FloatArray,
    support: npt.NDArray[np.intp],
    fit: Fit,
    opts: DecodeOptions,
    grams: _Grams,
) -> tuple[npt.NDArray[np.intp], Fit]:
    """Add back what LASSO screening missed (its penalty shrinks, so true values
    collide out of the screened set): a KKT check of the NNLS fit on the
    screened set. A left-out candidate v whose whitened, centred column a_v
    correlates with the residual r as z_v = a_v'r / (‖a_v‖·sqrt(φ)) > add_z
    would lower the residual if added; the strongest (at most as many as the
    support holds) are added and the fit is redone, up to 5 rounds.
    """
    cap = max(1, int(opts.max_support * xw.shape[0]))
    for _ in range(5):
        resid = target - np.asarray(xw[:, support] @ fit.beta).ravel()
        resid += offset * float(fit.beta.sum())
        score = (np.asarray(xw.T @ resid).ravel() - offset @ resid) / np.maximum(norms, 1e-300)
        score /= np.sqrt(fit.dispersion)
        score[support] = -np.inf
        room = cap - support.size
        new = np.flatnonzero(score > opts.add_z)
        if new.size == 0 or room <= 0:
            break
        new = new[np.argsort(-score[new])[: min(room, max(1, support.size))]]
        support = np.sort(np.concatenate([support, new]))
        fit = fit_nnls(xw[:, support], target, offset, support, grams(support))
    return support, fit
