"""The bins of the blanket mixture over m ~ Bin(n − 1, γ), checked exhaustively.

Each bin uses δ at its smallest m, so the binned figure is an upper bound only if
the bins cover every m once (the mass under the first bin charged whole) and each
weight is its bin's CDF mass. Small crowds get one bin per m unless the spaced
bins are forced (``_EXACT_BINS`` set to 0): then every m's δ_m, computed here by
direct enumeration of the victim's report and the m blanket draws (not by the
module's pair), is summed with its own weight, and the binned figure must not
fall below it. Deterministic (exact enumeration): no false failures.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import special, stats

from crowdmix.aggregator.accounting import blanket
from crowdmix.aggregator.accounting.blanket import (
    Profile,
    bins,
    bit_vector_given,
    krr_given,
    mixture,
)
from crowdmix.aggregator.accounting.pairs import binom_window
from crowdmix.aggregator.accounting.randomizers import (
    BitVector,
    KaryRR,
    LocalHashing,
    olh_collision,
)

DELTA = 1e-6
EPS = (0.0, 0.02, 0.1, 0.3, 0.8)


def krr_exact(eps0: float, d: int, m: int, eps: tuple[float, ...]) -> np.ndarray:
    """δ_m of k-RR: the victim (x0 w.p. e^ε0/s, x1 w.p. 1/s) and m uniform draws,
    every (N0, N1) enumerated, trinomial weights from log-gammas."""
    e, s = math.exp(eps0), math.exp(eps0) + d - 1.0
    a = np.arange(m + 2, dtype=np.float64)
    n0, n1 = np.meshgrid(a, a, indexing="ij")

    def tri(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        rest = m - x - y
        ok = (x >= 0) & (y >= 0) & (rest >= 0) & ((rest == 0) | (d > 2))
        out = np.zeros_like(x)
        xx, yy, rr = x[ok], y[ok], rest[ok]
        log = special.gammaln(m + 1) - special.gammaln(xx + 1) - special.gammaln(yy + 1)
        log -= special.gammaln(rr + 1)
        log += (xx + yy) * math.log(1.0 / d) + (rr * math.log((d - 2.0) / d) if d > 2 else 0.0)
        out[ok] = np.exp(log)
        return out

    both, one0, one1 = tri(n0, n1), tri(n0 - 1, n1), tri(n0, n1 - 1)
    p = (e * one0 + one1 + (d - 2) * both) / s
    q = (one0 + e * one1 + (d - 2) * both) / s
    return np.array([np.maximum(p - math.exp(x) * q, 0.0).sum() for x in eps])


def oue_exact(p: float, m: int, eps: tuple[float, ...]) -> np.ndarray:
    """δ_m of OUE: E[(X − e^ε·Y)_+]/(m+1), X and Y independent sums of r(bit) over
    m+1 Bern(p) bits, r(1) = ½/p, r(0) = ½/(1−p), every pair of counts enumerated."""
    draws = m + 1
    k = np.arange(draws + 1, dtype=np.float64)
    pk = stats.binom.pmf(k, draws, p)
    v = draws * 0.5 / (1.0 - p) + (0.5 / p - 0.5 / (1.0 - p)) * k
    joint = pk[:, None] * pk[None, :]
    return np.array(
        [
            (joint * np.maximum(v[:, None] - math.exp(x) * v[None, :], 0.0)).sum() / draws
            for x in eps
        ]
    )


def exhaustive(
    others: int, gamma: float, given: Callable[[int], np.ndarray], scale: float = 1.0
) -> np.ndarray:
    weights = stats.binom.pmf(np.arange(others + 1), others, gamma)
    return scale * sum((w * given(m) for m, w in enumerate(weights) if w > 0.0), np.zeros(len(EPS)))


CASES = [
    (kind, eps0, n)
    # γ near 1 (ε0 = 0.05, d = 50) and near 0 (ε0 = 7), tiny and wider windows of m.
    for kind, eps0 in (("krr2", 1.0), ("krr50", 0.05), ("krr3", 7.0), ("olh4", 2.0), ("oue", 1.0))
    for n in (2, 7, 60, 200)
]


@pytest.mark.parametrize(("kind", "eps0", "n"), CASES)
def test_forced_spaced_bins_stay_above_the_exhaustive_mixture(
    kind: str, eps0: float, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blanket, "_EXACT_BINS", 0)
    scale = 1.0
    cache: dict[object, object] = {}
    if kind.startswith("krr"):
        d = int(kind[3:])
        gamma = KaryRR(epsilon0=eps0, domain=d).blanket_mass
        exact = exhaustive(n - 1, gamma, lambda m: krr_exact(eps0, d, m, EPS))
        given: Callable[[int], Profile] = lambda m: krr_given(eps0, d, m, DELTA)  # noqa: E731
    elif kind == "olh4":
        kappa = olh_collision(4)
        scale, gamma = (
            1.0 - kappa,
            LocalHashing(epsilon0=eps0, buckets=4).blanket_mass * (1 - kappa),
        )
        exact = exhaustive(n - 1, gamma, lambda m: krr_exact(eps0, 4, m, EPS), scale)
        given = lambda m: krr_given(eps0, 4, m, DELTA)  # noqa: E731
    else:
        p = 1.0 / (math.exp(eps0) + 1.0)
        gamma = BitVector(p=p, q=0.5, bits=1).blanket_mass
        exact = exhaustive(n - 1, gamma, lambda m: oue_exact(p, m, EPS))
        given = lambda m: bit_vector_given(p, 0.5, (1, 1), m, DELTA, cache)  # noqa: E731
    for count in (1, 2, 3, 7, 32):
        binned = mixture(n - 1, gamma, given, DELTA, scale=scale, max_bins=count)
        for x, low in zip(EPS, exact, strict=True):
            assert binned.delta(x) >= low, (count, x, binned.delta(x), low)


@pytest.mark.parametrize("forced", [False, True])
@pytest.mark.parametrize("others", [1, 2, 5, 49, 400, 4000, 10**5])
def test_bins_cover_every_m_once_with_their_cdf_mass(
    forced: bool, others: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if forced:
        monkeypatch.setattr(blanket, "_EXACT_BINS", 0)
    for gamma in (1e-9, 1e-3, 0.3, 0.5, 0.999, 1.0 - 1e-9):
        pmf = stats.binom.pmf(np.arange(others + 1), others, gamma)
        for count, delta in itertools.product((1, 2, 3, 7, 32), (1e-3, 1e-10)):
            edges, weights, below = bins(others, gamma, delta, count)
            lo, _ = binom_window(others, gamma, blanket.TAIL_FRACTION * delta)
            assert all(isinstance(e, int) for e in edges)
            assert edges == sorted(set(edges)) and edges[0] == lo
            assert edges[-1] <= others and len(weights) == len(edges)
            mass = np.add.reduceat(pmf, edges)  # each bin's m, the last to others
            # A difference of two CDF values is exact to a few ulps of 1.
            assert np.allclose(weights, mass, rtol=1e-9, atol=1e-15)
            # The mass under the first bin is charged whole.
            assert below == pytest.approx(pmf[: edges[0]].sum(), rel=1e-9, abs=1e-300)
            assert abs(below + sum(weights) - 1.0) < 1e-12


def test_bins_refuse_a_count_below_one() -> None:
    with pytest.raises(ValueError, match="max_bins"):
        bins(4000, 0.5, DELTA, 0)
