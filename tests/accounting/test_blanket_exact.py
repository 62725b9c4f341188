"""The blanket bounds hold for the real shuffled mechanisms, exhaustively.

Tiny cells (k-ary RR, OUE, OLH over a small prime, RAPPOR bit vectors with one
and two hashes; n = 3–6) are enumerated exactly: every data set (victim value
x0 vs x1, every multiset of the others' values), the exact law of the shuffled
output, and both hockey-stick divergences. At every ε of a grid and at the
bound's own ε for the cell's δ, the bound's δ(ε) must be at least the exact
worst δ(ε). The same harness rejects the (p, β, q) variation-ratio pair (a
negative control: a harness that passed it could not catch an invalid bound),
and shows two shortcuts an OUE-specific bound cannot take: reading only the
reports' bits at the victim's two values, and taking the lower bound's data set
(every other user one third value) as the worst. Deterministic (no sampling):
no false failures.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pytest

from crowdmix.aggregator.accounting.amplification import epsilon_from_profile
from crowdmix.aggregator.accounting.blanket import krr_given, mixture
from crowdmix.aggregator.accounting.pairs import ClonePair
from crowdmix.aggregator.accounting.randomizers import (
    BitVector,
    KaryRR,
    LocalHashing,
    olh_collision,
)

Randomizer = Callable[[int], Sequence[float]]
EPS_GRID = (0.0, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5)
# Float rounding in the enumeration itself (sums of ~1e4 products); every failure
# of a wrong bound seen is many orders larger (the negative control's is ≥ 1e-4).
ROUNDING = 1e-12


def krr(d: int, eps: float) -> Randomizer:
    e = math.exp(eps)
    return lambda x: [e / (e + d - 1) if y == x else 1 / (e + d - 1) for y in range(d)]


def unary(d: int, on: float, off: float) -> Randomizer:
    """Bit j of the output is 1 w.p. ``on`` if j == x else ``off`` (OUE; and a PRR
    over one-hot Bloom filters, h = 1). Outputs are the 2^d bit patterns."""

    def r(x: int) -> list[float]:
        out = []
        for y in range(2**d):
            pr = 1.0
            for j in range(d):
                pj = on if j == x else off
                pr *= pj if (y >> j) & 1 else 1.0 - pj
            out.append(pr)
        return out

    return r


def exact_deltas(r: Randomizer, domain: int, n: int, eps: Sequence[float]) -> np.ndarray:
    """max over data sets and ordered victim pairs of the exact δ(ε), per ε."""
    worst = np.zeros(len(eps))
    for _, d in data_set_deltas(r, domain, n, eps):
        worst = np.maximum(worst, d)
    return worst


def data_set_deltas(
    r: Randomizer, domain: int, n: int, eps: Sequence[float]
) -> Iterator[tuple[tuple[tuple[int, ...], int, int], np.ndarray]]:
    """((others' values, victim's a, victim's b), exact δ(ε) of P_a against P_b per
    ε) for every multiset of the others' values and ordered victim pair."""
    rows = {x: np.asarray(r(x), dtype=np.float64) for x in range(domain)}
    for others in itertools.combinations_with_replacement(range(domain), n - 1):
        laws = victim_laws(rows, others, range(domain))
        for a, b in itertools.permutations(range(domain), 2):
            yield (others, a, b), hockey_stick(laws[a], laws[b], eps)


def victim_laws(
    rows: Mapping[int, np.ndarray], others: Sequence[int], victims: Iterable[int]
) -> dict[int, np.ndarray]:
    """The law of the shuffled output (the histogram of the reports, coded as an integer
    in base n + 1) when the others hold ``others`` and the victim each of ``victims``,
    on one support: the others' histogram law is convolved once. ``rows[x]``: the
    report's law of value x."""
    weights = (len(others) + 2) ** np.arange(len(next(iter(rows.values()))), dtype=np.int64)

    def add(keys: np.ndarray, probs: np.ndarray, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        nz = np.nonzero(row)[0]
        ks = (keys[:, None] + weights[nz][None, :]).ravel()
        ps = (probs[:, None] * row[nz][None, :]).ravel()
        uniq, inv = np.unique(ks, return_inverse=True)
        return uniq, np.bincount(inv, weights=ps)

    keys, probs = np.zeros(1, dtype=np.int64), np.ones(1)
    for x in others:
        keys, probs = add(keys, probs, rows[x])
    support = np.unique((keys[:, None] + weights[None, :]).ravel())
    laws = {}
    for v in victims:
        k, p = add(keys, probs, rows[v])
        laws[v] = np.zeros(len(support))
        laws[v][np.searchsorted(support, k)] = p
    return laws


def hockey_stick(pa: np.ndarray, pb: np.ndarray, eps: Sequence[float]) -> np.ndarray:
    """δ(ε) of law ``pa`` against ``pb``, per ε: Σ max(pa − e^ε·pb, 0)."""
    scale = np.exp(np.asarray(eps, dtype=np.float64))
    out: np.ndarray = np.maximum(pa[None, :] - scale[:, None] * pb[None, :], 0.0).sum(1)
    return out


def olh(prime: int, buckets: int, eps: float) -> Randomizer:
    """OLH with H(x) = ((a·x + b) mod P) mod g, (a, b) uniform: outputs (a, b, y)."""
    e = math.exp(eps)
    s = e + buckets - 1
    hashes = [(a, b) for a in range(1, prime) for b in range(prime)]

    def r(x: int) -> list[float]:
        out = []
        for a, b in hashes:
            hx = ((a * x + b) % prime) % buckets
            for y in range(buckets):
                out.append((e if y == hx else 1.0) / s / len(hashes))
        return out

    return r


def bloom(k: int, sets: Sequence[Sequence[int]], p: float, q: float) -> Randomizer:
    """Bit vectors over k positions: value i sets ``sets[i]``; bit j is 1 w.p. q if
    j is in the value's set, else p, independently (RAPPOR's p*, q*)."""

    def r(x: int) -> list[float]:
        hot = set(sets[x])
        out = []
        for y in range(2**k):
            pr = 1.0
            for j in range(k):
                pj = q if j in hot else p
                pr *= pj if (y >> j) & 1 else 1.0 - pj
            out.append(pr)
        return out

    return r


# Every (name, randomizer description, enumerated mechanism, domain, n, δ).
CELLS = [
    ("3-RR", KaryRR(epsilon0=1.5, domain=3), krr(3, 1.5), 3, 6, 0.05),
    ("4-RR", KaryRR(epsilon0=2.0, domain=4), krr(4, 2.0), 4, 5, 0.05),
    ("5-RR", KaryRR(epsilon0=1.0, domain=5), krr(5, 1.0), 5, 4, 0.1),
    ("binary RR", KaryRR(epsilon0=1.0, domain=2), krr(2, 1.0), 2, 6, 0.05),
    ("OUE d=3", BitVector(p=1 / (math.e**2 + 1), q=0.5, bits=1), None, 3, 5, 1e-3),
    ("OUE d=4", BitVector(p=1 / (math.e + 1), q=0.5, bits=1), None, 4, 4, 0.01),
    pytest.param(  # 40 outputs: the largest enumeration, seconds, left to the full check
        "OLH P=5 g=2",
        LocalHashing(epsilon0=1.0, buckets=2, prime=5),
        olh(5, 2, 1.0),
        3,
        4,
        0.05,
        marks=pytest.mark.slow,
    ),
    (
        "RAPPOR h=1 k=3",
        BitVector(p=0.3125, q=0.6875, bits=1),
        bloom(3, [[0], [1], [2]], 0.3125, 0.6875),
        3,
        5,
        0.05,
    ),
    (
        "RAPPOR h=2 k=4",
        BitVector(p=0.25, q=0.75, bits=2),
        bloom(4, [[0, 1], [1, 2], [2, 3], [0], [3]], 0.25, 0.75),
        5,
        4,
        0.1,
    ),
]


@pytest.mark.parametrize(("name", "rand", "mech", "domain", "n", "delta"), CELLS)
def test_blanket_bound_is_above_the_exact_shuffled_mechanism(
    name: str, rand: object, mech: Randomizer | None, domain: int, n: int, delta: float
) -> None:
    if mech is None:  # OUE: the true bit is 1 w.p. 1/2, every other w.p. p
        assert isinstance(rand, BitVector)
        mech = unary(domain, 0.5, rand.p)
    profile = rand.profile(n, delta)  # type: ignore[attr-defined]
    at_delta = epsilon_from_profile(profile, delta, rand.epsilon0)  # type: ignore[attr-defined]
    grid = sorted({*EPS_GRID, at_delta})
    exact = exact_deltas(mech, domain, n, grid)
    for eps, ex in zip(grid, exact, strict=True):
        bound = profile.delta(eps)
        assert bound >= ex - ROUNDING, f"{name}: at ε = {eps} the bound's δ {bound} < exact {ex}"
    assert exact[grid.index(at_delta)] <= delta, f"{name}: ε = {at_delta} misses δ = {delta}"


def test_the_harness_rejects_the_variation_ratio_pair() -> None:
    # OUE d = 3, ε0 = 2, n = 5: the (p, β, q) pair with OUE's β = ½·tanh(ε0/2)
    # (α = β/(e^ε0 − 1), r = α) is not a dominating pair; the harness must see it.
    eps0, n = 2.0, 5
    e = math.exp(eps0)
    beta = 0.5 * math.tanh(eps0 / 2)
    alpha = beta / (e - 1)
    invalid = ClonePair(p=e, alpha=alpha, r=alpha)
    grid = [0.1, 0.2, 0.35, 0.5, 0.75, 1.0]
    exact = exact_deltas(unary(3, 0.5, 1 / (e + 1)), 3, n, grid)
    ev = invalid.evaluate(n, 1e-3)
    gaps = [ex - (ev.delta(eps) - ev.tail) for eps, ex in zip(grid, exact, strict=True)]
    assert max(gaps) > 1e-4, f"the variation-ratio pair should understate δ: gaps {gaps}"


def test_the_harness_rejects_a_blanket_that_counts_every_user_as_cover() -> None:
    # 3-RR, ε0 = 1.5, n = 6 with γ = 1 instead of 3/(e^1.5 + 2): too much cover.
    fake = mixture(5, 1.0, lambda m: krr_given(1.5, 3, m, 0.05), 0.05)
    grid = [0.1, 0.35, 0.75]
    exact = exact_deltas(krr(3, 1.5), 3, 6, grid)
    assert max(ex - fake.delta(eps) for eps, ex in zip(grid, exact, strict=True)) > 1e-2


def test_oue_is_not_a_post_processing_of_its_reports_victim_bit_pairs() -> None:
    # OUE d = 3, ε0 = 1, n = 3: the multiset of each report's (b_x0, b_x1) alone (a
    # tempting reduction) understates δ. Another user's own bit is a label: 1 w.p.
    # ½ in its report, p in the victim's, so it points at the victim's report.
    p = 1 / (math.e + 1)
    grid = [0.1, 0.2, 0.35, 0.5]
    real = exact_deltas(unary(3, 0.5, p), 3, 3, grid)
    pairs = exact_deltas(unary(2, 0.5, p), 3, 3, grid)  # value 2 sets neither bit
    assert max(real - pairs) > 5e-3, f"the pairs should understate δ: {real - pairs}"


def test_oue_worst_data_set_is_not_always_every_other_user_a_third_value() -> None:
    # OUE d = 4, ε0 = 1, n = 4: the lower bound's data set (victim 0 vs 1, others all
    # 2) has the largest δ at small ε, but at ε = 0.9 "others all hold the victim's
    # value" has 4.4× its δ: a bound that reads only that data set is no bound.
    p = 1 / (math.e + 1)
    grid = [0.2, 0.5, 0.9]
    deltas = dict(data_set_deltas(unary(4, 0.5, p), 4, 4, grid))
    third = deltas[((2, 2, 2), 0, 1)]
    same = deltas[((0, 0, 0), 0, 1)]
    worst = np.max(np.array(list(deltas.values())), axis=0)
    assert worst[0] == pytest.approx(third[0], rel=1e-12)
    assert same[-1] > 4.0 * third[-1] > 1e-3, (same, third)


def test_olh_collision_is_exact_for_a_small_prime() -> None:
    prime, g = 7, 3
    same = sum(
        ((a * 0 + b) % prime) % g == ((a * 1 + b) % prime) % g
        for a in range(1, prime)
        for b in range(prime)
    )
    assert olh_collision(g, prime) == pytest.approx(same / (prime * (prime - 1)), abs=0)
