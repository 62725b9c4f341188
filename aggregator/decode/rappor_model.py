"""The RAPPOR observation model shared by the decoder, the simulator and planners.

A report bit reads 1 with probability p01 if its Bloom bit is 0 and p11 if it
is 1 (Erlingsson, Pihur, Korolova, CCS 2014; google/rappor ``decode.R``)::

    p11 = q(1 - f/2) + p·f/2        p01 = p(1 - f/2) + q·f/2

and the design matrix X (m·k × C) holds the candidates' Bloom bits, hashed by
``crowdmix.core.hashing`` (the one definition the encoders use).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from crowdmix.aggregator.decode.stats import critical_z
from crowdmix.core.hashing import bloom_int
from crowdmix.core.params import Hashing, RapporParams

__all__ = ["bit_estimates", "design_matrix", "detection_threshold", "report_probabilities"]

FloatArray = npt.NDArray[np.float64]


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

    Hashing is ``crowdmix.core.hashing.bloom_int``: the one definition the encoders use.
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
