"""Random-effects (ridge) fit of candidates the test did not detect: mass where it finds little.

Whitened model (``crowdmix.aggregator.decode.rappor``): t = A_F β_F + A_R β_R + ε,
ε ~ N(0, φI), A the centred whitened design, F fixed candidates, R the others with
prior β_R,v ~ N(μ, τ²) (Henderson's mixed model, Biometrics 1975: the posterior
mean is a ridge fit shrinking towards μ, λ = φ/τ²). μ, β_F: least squares on
[A_F, A_R·1]; τ² by moments, E‖r‖² = φ(rows − p) + τ²·tr(A_R'MA_R). Then
(A_R'M_F A_R + λI)δ = A_R'M_F(t − μA_R1), β_R = μ + δ, by conjugate gradients on
sparse products. sd_v = (‖a_v‖²/φ + 1/τ²)^-1/2 (diagonal only: a lower bound).

``spread_pays``: shares are barely resolved, so the answer is close to an even
split. An even share μ beats none in L1 iff E|β − μ| < μ; for spike-and-slab β
(0 w.p. π₀) E|β − μ| = 2π₀μ and τ²/μ² = π₀/(1 − π₀): iff π₀ < ½, i.e. τ < μ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, cg

__all__ = ["RandomEffects", "norm_sub", "random_effects_fit"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class RandomEffects:
    """Posterior of the random candidates' shares (``others``) and the fixed ones' fit."""

    others: npt.NDArray[np.intp]
    mean: FloatArray  # posterior mean of β_R (may be negative)
    sd: FloatArray  # diagonal posterior sd (a lower bound)
    mu: float
    tau2: float
    total: float  # Σ posterior mean of β_R
    total_sd: float  # sd of that total (μ's uncertainty and the diagonal terms)

    @property
    def spread_pays(self) -> bool:
        """τ < μ: an even share beats none in L1 (see the module docstring)."""
        return self.mu > 0.0 and self.tau2 < self.mu**2


def random_effects_fit(
    xw: sp.csc_matrix,
    offset: FloatArray,
    target: FloatArray,
    norms: FloatArray,
    fixed: npt.NDArray[np.intp],
    *,
    dispersion: float = 1.0,
) -> RandomEffects:
    """Fit the model of the module docstring; ``norms`` are the columns' ‖a_v‖."""
    rows, c = xw.shape
    is_fixed = np.zeros(c, dtype=bool)
    is_fixed[fixed] = True
    others = np.flatnonzero(~is_fixed)
    if others.size == 0:
        empty = np.zeros(0)
        return RandomEffects(others, empty, empty, 0.0, 0.0, 0.0, 0.0)
    xr = xw[:, others]
    off_r_sum = offset * others.size

    def a_r(v: FloatArray) -> FloatArray:  # A_R v
        return np.asarray(xr @ v).ravel() - offset * float(v.sum())

    def a_r_t(u: FloatArray) -> FloatArray:  # A_R' u
        return np.asarray(xr.T @ u).ravel() - float(offset @ u)

    ones_col = np.asarray(xr.sum(axis=1)).ravel() - off_r_sum  # A_R 1
    a_f = xw[:, fixed].toarray() - offset[:, None] if fixed.size else np.zeros((rows, 0))
    basis = np.column_stack([a_f, ones_col])
    q, _ = np.linalg.qr(basis)
    coef, *_ = np.linalg.lstsq(basis, target, rcond=None)
    mu = float(coef[-1])
    resid = target - basis @ coef
    qf = np.linalg.qr(a_f)[0] if fixed.size else np.zeros((rows, 0))
    proj = np.asarray(xr.T @ q) - (offset @ q)[None, :]  # A_R' Q, C_R × p
    trace = float(np.sum(norms[others] ** 2) - np.sum(proj**2))
    p = basis.shape[1]
    tau2 = max(0.0, (float(resid @ resid) - dispersion * (rows - p)) / max(trace, 1e-300))
    mu_sd = float(np.sqrt(dispersion / max(float(ones_col @ ones_col), 1e-300)))
    if tau2 <= 0.0:
        mean = np.full(others.size, mu)
        sd = np.full(others.size, mu_sd)
        return RandomEffects(others, mean, sd, mu, 0.0, mu * others.size, mu_sd * others.size)
    lam = dispersion / tau2

    def m_f(u: FloatArray) -> FloatArray:  # residual projector of the fixed columns
        return np.asarray(u - qf @ (qf.T @ u), dtype=np.float64) if qf.shape[1] else u

    def normal(v: FloatArray) -> FloatArray:
        return np.asarray(a_r_t(m_f(a_r(v))) + lam * v, dtype=np.float64)

    op = LinearOperator((others.size, others.size), matvec=normal, dtype=np.float64)
    rhs = a_r_t(m_f(target - mu * ones_col))
    delta, _ = cg(op, rhs, rtol=1e-6, maxiter=200)
    mean = mu + delta
    sd = 1.0 / np.sqrt(norms[others] ** 2 / dispersion + 1.0 / tau2)
    total_sd = float(np.sqrt((mu_sd * others.size) ** 2 + np.sum(sd**2)))
    return RandomEffects(others, mean, sd, mu, tau2, float(mean.sum()), total_sd)


def norm_sub(values: FloatArray, total: float) -> FloatArray:
    """max(x − c, 0) with c chosen so the result sums to ``total`` (Norm-Sub; Wang,
    Lopuhaä-Zwakenberg, Li, Škorić, Li, NDSS 2020); 0 everywhere when total <= 0."""
    x = np.asarray(values, dtype=np.float64)
    if total <= 0.0 or x.size == 0:
        return np.zeros_like(x)
    desc = np.sort(x)[::-1]
    csum = np.cumsum(desc)
    # with the top j entries positive: c_j = (csum_j − total)/j, valid when desc[j-1] > c_j
    j = np.arange(1, x.size + 1)
    c = (csum - total) / j
    ok = desc > c
    k = int(np.flatnonzero(ok)[-1]) if ok.any() else 0
    return np.asarray(np.maximum(x - c[k], 0.0), dtype=np.float64)
