"""Exact, fast simulation of RAPPOR counts for tests and benchmarks (numpy Generator).

Given how many clients hold each value (one report each), draws the counts
the aggregator would hold, from their exact distribution:

1. each client's cohort is uniform: per value, a multinomial over m cohorts
   (``cohorts="uniform"``), or, as google/rappor's regression tests do,
   clients are shuffled and client i gets cohort i mod m (``"round-robin"``);
2. B_ji = clients in cohort j whose Bloom filter has bit i (from the design
   matrix, i.e. ``crowdmix.core.hashing``);
3. given the Bloom filters, every report bit is an independent Bernoulli —
   p11 where the Bloom bit is 1, p01 where it is 0 (PRR then IRR, one report
   per client) — so c_ji = Binomial(B_ji, p11) + Binomial(N_j − B_ji, p01).

O(values·m + m·k) work instead of per-report encoding.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from crowdmix.aggregator.decode.rappor_model import report_probabilities
from crowdmix.core.params import RapporParams

__all__ = ["simulate_rappor_counts"]


def simulate_rappor_counts(
    value_counts: npt.ArrayLike,
    design: sp.spmatrix,
    params: RapporParams,
    rng: np.random.Generator,
    *,
    cohorts: Literal["uniform", "round-robin"] = "uniform",
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(totals[m], ones[m, k]) for clients holding the design's columns ``value_counts`` times."""
    n_v = np.asarray(value_counts, dtype=np.int64)
    m, k = params.m, params.k
    if design.shape != (m * k, n_v.size):
        raise ValueError(f"design must be ({m * k}, {n_v.size}), got {design.shape}")
    if cohorts == "uniform":
        per_cohort = rng.multinomial(n_v, np.full(m, 1.0 / m))  # (V, m)
    elif cohorts == "round-robin":
        clients = rng.permutation(np.repeat(np.arange(n_v.size), n_v))
        cell = clients * m + np.arange(clients.size) % m
        per_cohort = np.bincount(cell, minlength=n_v.size * m).reshape(n_v.size, m)
    else:
        raise ValueError(f"cohorts must be 'uniform' or 'round-robin', got {cohorts!r}")
    x = sp.csr_matrix(design)
    row_cohort = np.repeat(np.arange(m), k)
    # B[r] = Σ_v X[r, v] · clients of v in the row's cohort
    coo = x.tocoo()
    b = np.bincount(
        coo.row, weights=per_cohort[coo.col, row_cohort[coo.row]] * coo.data, minlength=m * k
    )
    b = np.rint(b).astype(np.int64).reshape(m, k)
    totals = per_cohort.sum(axis=0).astype(np.int64)
    p01, p11 = report_probabilities(params)
    ones = rng.binomial(b, p11) + rng.binomial(totals[:, None] - b, p01)
    return totals, ones.astype(np.int64)
