"""Decoding discovery rounds: exact supports, unbiased estimates, a small discovery."""

from __future__ import annotations

import math

import numpy as np
import pytest

from crowdmix.aggregator.discovery import (
    DiscoveryPlan,
    DiscoveryState,
    advance,
    decode_prefix_round,
    decode_value_round,
    discovered,
)
from crowdmix.aggregator.discovery.prefixes import child_symbols, valid_children
from crowdmix.aggregator.discovery.simulate import simulate_prefix_counts, simulate_value_counts
from crowdmix.core.discovery import (
    PrefixRound,
    SymbolMap,
    ValueRound,
    prefix_bucket,
    prefix_key,
)

SM = SymbolMap(alphabet="abc", max_length=4)  # a b c OTHER END = 0..4


def _bernstein(n: int, fail: float) -> float:
    """t with P(|Σ X_i − E| ≥ t) ≤ fail for n independent X_i in [0, 1] (Bernstein:
    2·exp(−t²/(2(n/4 + t/3))))."""
    log = math.log(2.0 / fail)
    return (log / 3 + math.sqrt((log / 3) ** 2 + 2 * log * n / 4)) * 1.0


def test_valid_children_follow_the_symbol_rules() -> None:
    r = PrefixRound(symbols=SM, start=3, stop=5, epsilon=2.0, seeds=4)
    valid = valid_children(r, np.array([False, True]))
    parents = np.array([[0, 1, 2], [0, 4, 4]], dtype=np.uint8)
    open_ok = {child_symbols(r, parents, 0, e)[3:] for e in np.flatnonzero(valid[0])}
    # position 3 any symbol; position 4 (the last) only END or OTHER; after END only END
    assert open_ok == {bytes([s, t]) for s in range(4) for t in (3, 4)} | {bytes([4, 4])}
    assert [child_symbols(r, parents, 1, e) for e in np.flatnonzero(valid[1])] == [
        bytes([0, 4, 4, 4, 4])
    ]


def test_supports_equal_a_brute_force_count() -> None:
    r = PrefixRound(symbols=SM, start=1, stop=3, epsilon=2.5, seeds=64)
    g = r.buckets
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 3, size=r.cells) * (rng.random(r.cells) < 0.3)
    parents = np.array([[0], [2], [4]], dtype=np.uint8)  # the last one is closed
    est = decode_prefix_round(r, parents, counts, correct_heaviest=0)
    n = int(counts.sum())
    p, q1 = r.keep_probability, 1.0 / g
    support = est.count * (p - q1) + n * q1
    for k in range(3):
        for e in range(r.extensions):
            if not est.valid[k, e]:
                assert math.isnan(est.count[k, e])
                continue
            sym = child_symbols(r, parents, k, e)
            prefix, hi, lo = r.split(sym + bytes(5 - len(sym)))
            key = prefix_key(1, 3, hi, prefix)
            brute = sum(int(counts[s * g + prefix_bucket(s, key, lo, g)]) for s in range(r.seeds))
            assert support[k, e] == pytest.approx(brute, abs=1e-6)


def test_prefix_estimates_are_unbiased_within_bernstein_bounds() -> None:
    # Each report's support of child c is an independent Bernoulli given the holders,
    # with mean φ·p + (1 − φ)·q' (φ: share of the S seeds on which c and the holder's
    # prefix collide, computed exactly below). Bernstein at 1e-9 per check, 25 checks:
    # false-failure probability ≤ 2.5e-8.
    r = PrefixRound(symbols=SM, start=0, stop=2, epsilon=3.0, seeds=512)
    g, p = r.buckets, r.keep_probability
    q_other = (1 - p) / (g - 1)
    values = ["ab", "ca", "b", "cc", "a", "ba"]
    share = np.array([0.4, 0.2, 0.15, 0.1, 0.1, 0.05])
    symbols = [SM.symbols(v) for v in values]
    n = 40_000
    holders = np.repeat(np.arange(len(values)), (share * n).astype(int))
    rng = np.random.default_rng(11)
    counts = simulate_prefix_counts(r, symbols, holders, rng)
    root = np.zeros((1, 0), dtype=np.uint8)
    est = decode_prefix_round(r, root, counts, correct_heaviest=0)
    seeds = range(r.seeds)
    held = np.bincount(holders, minlength=len(values))

    def buckets(sym: bytes) -> np.ndarray:
        prefix, hi, lo = r.split(sym)
        key = prefix_key(0, 2, hi, prefix)
        return np.array([prefix_bucket(s, key, lo, g) for s in seeds])

    of_value = [buckets(s) for s in symbols]
    t = _bernstein(n, 1e-9)
    for e in np.flatnonzero(est.valid[0]):
        child = child_symbols(r, root, 0, int(e)) + bytes([4, 4, 4])
        mine = buckets(child)
        expected = sum(
            held[i] * (phi * p + (1 - phi) * q_other)
            for i, phi in enumerate(float(np.mean(mine == b)) for b in of_value)
        )
        support = est.count[0, e] * (p - 1.0 / g) + n / g
        assert abs(support - expected) <= t


def test_value_round_estimates_are_unbiased() -> None:
    # k-RR counts: each output count is Binomial-sum of independent reports;
    # Bernstein at 1e-9 per check, 4 checks: ≤ 4e-9.
    r = ValueRound(symbols=SM, epsilon=2.0, candidates=("ab", "c", "bca"))
    symbols = [SM.symbols(v) for v in ("ab", "c", "bca", "aaa")]
    held = np.array([5000, 3000, 1500, 500])
    holders = np.repeat(np.arange(4), held)
    counts = simulate_value_counts(r, symbols, holders, np.random.default_rng(5))
    est = decode_value_round(r, counts)
    n = int(held.sum())
    p = r.keep_probability
    q = (1 - p) / 3
    t = _bernstein(n, 1e-9) / (p - q)
    truth = np.array([5000, 3000, 1500])
    assert np.all(np.abs(est.count - truth) <= t)
    assert abs(est.none - 500) <= t
    with pytest.raises(ValueError, match="entries"):
        decode_value_round(r, np.zeros(3))


def test_a_small_discovery_finds_the_top_values() -> None:
    # Fixed seed: a deterministic run (no statistical claim), n = 60k over 40 values.
    values = [
        "".join("abc"[(i * 7 + j * 3 + i // 3) % 3] for j in range(1 + i % 4)) + "abc"[i % 3]
        for i in range(40)
    ]
    values = list(dict.fromkeys(v[:4] for v in values))  # all within max_length
    w = np.arange(1, len(values) + 1, dtype=float) ** -1.2
    rng = np.random.default_rng(21)
    holders = rng.choice(len(values), size=60_000, p=w / w.sum())
    symbols = [SM.symbols(v) for v in values]
    plan = DiscoveryPlan(
        symbols=SM,
        spans=(2, 4, 5),
        keep=20,
        candidates=12,
        seeds=256,
        weights=(0.25, 0.25, 0.25, 0.25),
    )
    groups = np.array_split(rng.permutation(holders), 4)
    state = DiscoveryState()
    for i in range(3):
        rnd = plan.prefix_round(i, 4.0)
        counts = simulate_prefix_counts(rnd, symbols, groups[i], rng)
        state = advance(plan, state, decode_prefix_round(rnd, state.parent_array(), counts))
        state = DiscoveryState.from_dict(state.to_dict())  # what the report job stores
    vr = plan.value_round(4.0, state.final_candidates(plan))
    table = discovered(
        plan, state, decode_value_round(vr, simulate_value_counts(vr, symbols, groups[3], rng))
    )
    truth = [values[i] for i in np.argsort(-np.bincount(holders))[:5]]
    assert set(truth) <= set(table.top(8))
    assert np.all(table.ci_low <= table.share) and np.all(table.share <= table.ci_high)


def test_bad_counts_are_refused() -> None:
    r = PrefixRound(symbols=SM, start=0, stop=2, epsilon=2.0, seeds=4)
    root = np.zeros((1, 0), dtype=np.uint8)
    with pytest.raises(ValueError, match="entries"):
        decode_prefix_round(r, root, np.zeros(5))
    with pytest.raises(ValueError, match="non-negative"):
        decode_prefix_round(r, root, -np.ones(r.cells))
    with pytest.raises(ValueError, match="parents"):
        decode_prefix_round(r, np.zeros((1, 2), dtype=np.uint8), np.zeros(r.cells))
