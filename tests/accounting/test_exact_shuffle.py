"""Every published figure is >= the exact ε of the real shuffled mechanism.

The lower bounds elsewhere are valid but not worst cases (they project onto two
counts). Here tiny cells are enumerated exactly: every data set (victim value x0
vs x1, every multiset of the other n−1 users' values), the exact distribution of
the shuffled output (the histogram of the n reports), and, for R rounds of fresh
randomness, the exact R-fold product. The figures crowdmix publishes for those
cells — per release (``privacy_statement(...).central``, ``amplify``) and
composed (the statement over R rounds, the ledger after R releases) — must hold:
the exact δ of every data set at the published ε is at most the published δ.
An (ε, δ) pair with that property is exactly "ε ≥ the real mechanism's ε at δ".

These are counterexamples: with the (p, β, q)
variation-ratio pair (removed) the OUE, 3-RR and PRR cells and the 5-RR n = 100
regression failed. Deterministic (no sampling): no false failures.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from crowdmix.aggregator.accounting import (
    MemoryLedgerStore,
    PrivacyLedger,
    amplify,
    privacy_statement,
    record_release,
)
from crowdmix.core.basic import BasicParams
from crowdmix.core.params import RapporParams
from crowdmix.core.registry import MetricConfig, ShufflePolicy
from tests.accounting.test_blanket_exact import Randomizer, krr, unary, victim_laws

ANY_BATCH = ShufflePolicy(min_batch=1, max_batch=10**6)


def worst_delta(r: Randomizer, domain: int, n: int, eps: float, rounds: int = 1) -> float:
    """max over data sets of the exact δ(ε) of ``rounds`` independent shuffles."""
    worst = 0.0
    e = math.exp(eps)
    rows = {x: np.asarray(r(x), dtype=np.float64) for x in range(domain)}
    for others in itertools.combinations_with_replacement(range(domain), n - 1):
        composed = {}
        for v, p in victim_laws(rows, others, range(domain)).items():
            c = p
            for _ in range(rounds - 1):
                c = np.outer(c, p).ravel()
            composed[v] = c
        for a, b in itertools.permutations(range(domain), 2):
            worst = max(worst, float(np.maximum(composed[a] - e * composed[b], 0.0).sum()))
    return worst


def basic(mechanism: str, eps: float, d: int) -> MetricConfig:
    params = BasicParams(mechanism=mechanism, epsilon=eps, domain_size=d)  # type: ignore[arg-type]
    return MetricConfig(name="m", basic=params, shuffle=ANY_BATCH)


def published(metric: MetricConfig, n: int, delta: float, rounds: int) -> dict[str, float]:
    """Every figure crowdmix publishes for ``rounds`` releases of n reports each."""
    one = privacy_statement(metric, n, delta=delta, batch_sizes=[n])
    figures = {"central": one.central.epsilon}
    if metric.basic is not None:
        figures["amplify"] = amplify(metric.basic.epsilon, n, delta).epsilon
    if rounds > 1:
        many = privacy_statement(metric, n * rounds, delta=delta, batch_sizes=[n] * rounds,
                                 rounds=rounds)  # fmt: skip
        figures["longitudinal"] = many.longitudinal.epsilon
        assert many.longitudinal.delta <= delta
        ledger = PrivacyLedger(MemoryLedgerStore())
        for w in range(rounds):
            _, (total, total_delta) = record_release(
                ledger, metric, n, release_id=f"w{w}", window=w, delta=delta, batch_sizes=[n]
            )
        assert total_delta <= delta
        figures["ledger"] = total
    return figures


CELLS = [
    # (name, metric, randomizer, domain, n, δ, rounds)
    ("3-RR", basic("krr", 1.5, 3), krr(3, 1.5), 3, 6, 0.05, 2),
    ("4-RR", basic("krr", 2.0, 4), krr(4, 2.0), 4, 5, 0.05, 2),
    ("OUE d=3", basic("oue", 2.0, 3), None, 3, 6, 1e-3, 1),
]


@pytest.mark.parametrize(("name", "metric", "r", "domain", "n", "delta", "rounds"), CELLS)
def test_published_figures_hold_for_the_exact_shuffled_mechanism(
    name: str,
    metric: MetricConfig,
    r: Randomizer | None,
    domain: int,
    n: int,
    delta: float,
    rounds: int,
) -> None:
    if r is None:  # OUE: bit x is 1 w.p. 1/2, every other bit w.p. 1/(e^ε+1)
        r = unary(domain, 0.5, 1.0 / (math.exp(2.0) + 1.0))
    figures = published(metric, n, delta, rounds)
    for what, eps in figures.items():
        k = rounds if what in ("longitudinal", "ledger") else 1
        exact = worst_delta(r, domain, n, eps, rounds=k)
        assert exact <= delta, f"{name}: {what} ε = {eps} but the exact δ there is {exact}"


def test_memoised_prr_figures_hold_for_the_exact_shuffled_prr() -> None:
    # p = 0, q = 1: the report *is* the PRR (ε_1 = ε_∞), the same in every round, so
    # R shuffled rounds reveal exactly one shuffled PRR: every figure, per release and
    # over any number of rounds, must be >= its exact ε. Bloom filters: every one-hot
    # filter of k = 3 bits (h = 1), a superset of the ones values hash to.
    f, n, delta = 0.4, 6, 0.08
    params = RapporParams(k=3, h=1, m=1, f=f, p=0.0, q=1.0)
    metric = MetricConfig(name="m", rappor=params, shuffle=ANY_BATCH)
    figures = published(metric, n, delta, rounds=3)
    r = unary(3, 1 - f / 2, f / 2)
    for what, eps in figures.items():
        exact = worst_delta(r, 3, n, eps)
        assert exact <= delta, f"PRR: {what} ε = {eps} but the exact δ there is {exact}"


def test_krr_d5_n100_regression_needs_at_least_1_1564() -> None:
    # Shuffled 5-RR, ε0 = 2, n = 100, δ = 1e-6, victim 0 vs 1 and
    # everyone else 2, exact over the full (N0, N1, N2): needs ε ≥ 1.15643; the
    # (p, β, q) pair stated 1.13527.
    from scipy.special import gammaln

    eps0, d, n, delta = 2.0, 5, 100, 1e-6
    e = math.exp(eps0)
    s, m = e + d - 1, n - 1
    i = np.arange(n + 1)
    a, b, c = np.meshgrid(i, i, i, indexing="ij")
    rest = m - a - b - c
    ok = rest >= 0
    rr = np.where(ok, rest, 0)
    log_coef = gammaln(m + 1) - gammaln(a + 1) - gammaln(b + 1) - gammaln(c + 1) - gammaln(rr + 1)
    log_pmf = (
        log_coef + (a + b) * math.log(1 / s) + c * math.log(e / s) + rr * math.log((d - 3) / s)
    )
    base = np.where(ok, np.exp(log_pmf), 0.0)  # the others' (N0, N1, N2)

    def shift(x: np.ndarray, axis: int) -> np.ndarray:
        out = np.zeros_like(x)
        src, dst = [slice(None)] * 3, [slice(None)] * 3
        src[axis], dst[axis] = slice(0, n), slice(1, n + 1)
        out[tuple(dst)] = x[tuple(src)]
        return out

    b0, b1, b2 = shift(base, 0), shift(base, 1), shift(base, 2)
    p = e / s * b0 + 1 / s * b1 + 1 / s * b2 + (d - 3) / s * base  # victim holds 0
    q = 1 / s * b0 + e / s * b1 + 1 / s * b2 + (d - 3) / s * base  # victim holds 1

    def exact_delta(eps: float) -> float:
        x = math.exp(eps)
        return float(max(np.maximum(p - x * q, 0).sum(), np.maximum(q - x * p, 0).sum()))

    assert exact_delta(1.1564) > delta  # the mechanism needs more than 1.1564
    figures = published(basic("krr", eps0, d), n, delta, rounds=1)
    for what, eps in figures.items():
        assert eps >= 1.1564, what
        assert exact_delta(eps) <= delta, what
