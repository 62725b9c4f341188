"""Non-negative weighted least squares with analytic standard errors, and
LASSO screening — the numerical core of the RAPPOR decoder.

Rows are already whitened (unit noise variance), so for the active set A of
the NNLS solution Cov(β_A) ≈ φ·(A'A)^-1 with φ = max(1, RSS/(rows − |A|)).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scipy.linalg import blas, lapack
from scipy.optimize import nnls

__all__ = [
    "MIN_EIGEN_RATIO",
    "Fit",
    "centred_gram",
    "fit_nnls",
    "inverse_diagonal",
    "lasso_screen",
    "nnls_normal",
    "spd_inverse",
    "sum_std_error",
    "symmetric_product",
]

FloatArray = npt.NDArray[np.float64]
#: Below this (relative) eigenvalue a Gram matrix is treated as singular.
MIN_EIGEN_RATIO = 1e-10


def lasso_screen(
    xw: sp.csc_matrix, yw: FloatArray, col_norms: FloatArray, *, screen_z: float, max_support: float
) -> npt.NDArray[np.intp]:
    """Candidates a non-negative LASSO keeps (sklearn objective ‖y−Xb‖²/2n + α‖b‖₁).

    A null candidate enters when |x_v' r|/n > α; x_v' r has sd ‖x_v‖, so
    α = screen_z·median‖x_v‖/n admits it with probability Φ̄(screen_z).
    """
    from sklearn.linear_model import Lasso

    n_rows = xw.shape[0]
    cap = max(1, int(max_support * n_rows))
    alpha = max(screen_z, 1e-3) * float(np.median(col_norms)) / n_rows
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


def sum_std_error(a: FloatArray, beta: FloatArray) -> float:
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


def centred_gram(xs: sp.spmatrix, offset: FloatArray) -> FloatArray:
    """A'A for A = xs − offset·1' without densifying xs (xs is sparse: m·h ones per column)."""
    u = np.asarray(xs.T @ offset).ravel()
    gram = np.asarray((xs.T @ xs).toarray(), dtype=np.float64)
    gram -= u[:, None]
    gram -= u[None, :]
    gram += float(offset @ offset)
    return gram


def spd_inverse(gram: FloatArray) -> FloatArray | None:
    """G^-1 of a well-conditioned Gram matrix (Cholesky, LAPACK potrf/potri), its lower
    triangle only (use ``np.diag`` and ``symmetric_product``); None otherwise."""
    chol, info = lapack.dpotrf(gram, lower=1)
    if info != 0:
        return None
    d = np.diag(chol)
    if d.min() ** 2 <= MIN_EIGEN_RATIO * np.max(np.diag(gram)):
        return None
    inv, info = lapack.dpotri(chol, lower=1)  # fills the lower triangle
    return np.asarray(inv, dtype=np.float64) if info == 0 else None


def symmetric_product(lower: FloatArray, vector: FloatArray) -> FloatArray:
    """S·v for the symmetric S whose lower triangle is ``lower`` (BLAS symv)."""
    return np.asarray(blas.dsymv(1.0, lower, vector, lower=1), dtype=np.float64)


def inverse_diagonal(gram: FloatArray) -> FloatArray:
    """diag(G^-1) for a Gram matrix; inf for directions G cannot resolve (collinear columns)."""
    inv = spd_inverse(gram)
    if inv is not None:
        return np.diag(inv).copy()
    diag = np.diag(np.linalg.pinv(gram, hermitian=True))
    # pinv gives finite variances for unresolvable directions; call them infinite
    w, v = np.linalg.eigh(gram)
    null = w <= MIN_EIGEN_RATIO * max(float(w[-1]), 1e-300)
    unresolved = np.any(np.abs(v[:, null]) > 1e-6, axis=1)
    return np.where(unresolved, np.inf, np.maximum(diag, 0.0))


@dataclass(slots=True)
class Fit:
    support: npt.NDArray[np.intp]  # candidate indexes fitted
    beta: FloatArray  # per support entry (>= 0)
    std_error: FloatArray  # per support entry (inf where beta == 0)
    dispersion: float
    rss: float


def nnls_normal(gram: FloatArray, corr: FloatArray, a: FloatArray, t: FloatArray) -> FloatArray:
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


def fit_nnls(
    xd: FloatArray, target: FloatArray, offset: FloatArray, support: npt.NDArray[np.intp]
) -> Fit:
    """NNLS of ``target`` on centred whitened columns ``xd - offset`` and analytic SEs."""
    n_rows = xd.shape[0]
    if support.size == 0:
        rss = float(target @ target)
        return Fit(support, np.zeros(0), np.zeros(0), max(1.0, rss / n_rows), rss)
    a = xd - offset[:, None]
    gram = a.T @ a
    corr = a.T @ target
    beta = nnls_normal(gram, corr, a, target)
    if beta.sum() > 1.0 + 3.0 * sum_std_error(a, beta):
        # Frequencies cannot sum past 1. Only an excess beyond noise is corrected
        # (clamping every excess would bias all estimates down when Σx = 1):
        # refit with Σβ = 1 as a heavily weighted extra equation w·(1'β − 1).
        w2 = 1e6 * float(np.mean(np.diag(gram)))
        beta = nnls_normal(
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
        se[active] = np.sqrt(dispersion * inverse_diagonal(aa.T @ aa))
    return Fit(support, beta, se, dispersion, rss)
