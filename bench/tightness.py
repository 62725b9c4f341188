"""Tightness of the privacy figures: ours vs the best lower bound we can compute.

Each row: the figure crowdmix states (an upper bound, the generic stronger
clone since the soundness fix), the figure it printed before that fix where it
differs (the (p, β, q) variation-ratio pair, which is not a dominating pair and
understated ε: the 5-RR n = 100 row's "before" is below the exact lower bound),
and a lower bound — the exact privacy of a concrete
mechanism on a concrete data set (or a post-processing of its output),
evaluated exactly and rounded down (``_lower_root``) or by an optimistic PLD
(losses rounded down, tails dropped). Every valid upper bound is ≥ the lower
bound; the ratio says how much room is left. δ = 1e-6 throughout.

    .venv/bin/python bench/tightness.py
"""

from __future__ import annotations

import math
import time

from crowdmix.aggregator.accounting.amplification import (
    _lower_root,
    amplify,
    shuffled_rr_lower_bound,
)
from crowdmix.aggregator.accounting.history import Segment, compose_segments
from crowdmix.aggregator.accounting.local import basic_total_variation, epsilon_inf
from crowdmix.aggregator.accounting.pairs import ClonePair
from crowdmix.aggregator.accounting.pld import shuffle_pld
from crowdmix.aggregator.accounting.statement import privacy_statement
from crowdmix.core.basic import BasicParams
from crowdmix.core.params import RapporParams
from crowdmix.core.registry import MetricConfig

DELTA = 1e-6


def krr_pair(eps: float, d: int) -> ClonePair:
    e = math.exp(eps)
    return ClonePair(p=e, alpha=1.0 / (e + d - 1), r=1.0 / (e + d - 1))


def optimistic(parts: list[tuple[ClonePair, int, int]]) -> float:
    composed = None
    for pair, n, rounds in parts:
        one = shuffle_pld(pair, n, tail=1e-14, pessimistic=False)
        one = one.self_compose(rounds) if rounds > 1 else one
        composed = one if composed is None else composed.compose(one)
    assert composed is not None
    return float(composed.get_epsilon_for_delta(DELTA))


def krr_segment(eps: float, d: int, n: int, rounds: int) -> Segment:
    beta = basic_total_variation(BasicParams(mechanism="krr", epsilon=eps, domain_size=d))
    return Segment(rounds=rounds, n_amplify=n, delta=DELTA, epsilon0=eps, beta=beta)


def rows() -> list[tuple[str, float, float | None, float]]:
    out: list[tuple[str, float, float | None, float]] = []
    # 0. the review's regression: exact over the full (N0, N1, N2), victim 0 vs 1,
    # everyone else 2 (tests/accounting/test_exact_shuffle.py); before: 1.1353
    ours = compose_segments([krr_segment(2.0, 5, 100, 1)]).epsilon
    out.append(("k-RR ε=2 d=5, n=100, 1 release", ours, 1.1353, 1.1564))
    # 1. one k-RR release (lower: (N0, N1) of the data set above; before: 0.2297)
    ours = compose_segments([krr_segment(2.0, 5, 2000, 1)]).epsilon
    lower = _lower_root(krr_pair(2.0, 5).evaluate(2000, DELTA), DELTA, 2.0)
    out.append(("k-RR ε=2 d=5, n=2,000, 1 release", ours, 0.2297, lower))
    # 2. ten fresh rounds: stronger-clone PLD (before: the (p, β, q) pair's PLD)
    ours = compose_segments([krr_segment(2.0, 5, 2000, 10)]).epsilon
    lower = optimistic([(krr_pair(2.0, 5), 2000, 10)])
    out.append(("k-RR ε=2 d=5, n=2,000, 10 rounds (PLD)", ours, 0.7867, lower))
    # 3. a ledger: n=2,000 then n=200,000
    ours = compose_segments([krr_segment(2.0, 5, 2000, 1), krr_segment(2.0, 5, 200_000, 1)])
    lower = optimistic([(krr_pair(2.0, 5), 2000, 1), (krr_pair(2.0, 5), 200_000, 1)])
    out.append(("ledger: k-RR n=2,000 then n=200,000", ours.epsilon, 0.2310, lower))
    # 4. OUE ε=2, n=1e4 (lower: reports whose w-bit is 0, bits (x, x') = (1,0) / (0,1))
    oue = MetricConfig(name="o", basic=BasicParams(mechanism="oue", epsilon=2.0, domain_size=8))
    ours = privacy_statement(oue, 10**4, batch_sizes=[10**4]).central.epsilon
    q = 1.0 / (math.exp(2.0) + 1.0)
    pair = ClonePair(p=math.exp(2.0), alpha=(1 - q) * q / 2, r=0.5 * q * (1 - q))
    lower = _lower_root(pair.evaluate(10**4, DELTA), DELTA, 2.0)
    out.append(("OUE ε=2, n=1e4", ours, 0.0788, lower))
    # 5, 6. memoised PRR, any number of rounds: generic (before: the PRR-β pair)
    for h, f, n in ((2, 0.5, 10**5), (2, 0.25, 10**4)):
        params = RapporParams(k=16, h=h, m=1, f=f)
        metric = MetricConfig(name="r", rappor=params)
        lg = privacy_statement(metric, n, batch_sizes=[n], rounds=10**6).longitudinal
        keep, flip = 1 - f / 2, f / 2
        pair = ClonePair(p=(keep / flip) ** (2 * h), alpha=flip ** (2 * h), r=(flip * keep) ** h)
        lower = _lower_root(pair.evaluate(n, DELTA), DELTA, epsilon_inf(params))
        old = {0.5: 0.1221, 0.25: 3.5562}[f]
        out.append((f"RAPPOR PRR h={h} f={f}, n={n:.0e}, ∞ rounds", lg.epsilon, old, lower))
    # 7. generic bound vs the largest known lower bound
    ours = amplify(0.5, 1000, DELTA).epsilon
    lower = max(
        shuffled_rr_lower_bound(0.5, 1000, DELTA),
        shuffled_rr_lower_bound(0.5, 1000, DELTA, domain=2),
    )
    out.append(("generic ε0=0.5, n=1e3 (lower: binary RR)", ours, None, lower))
    return out


def main() -> None:
    started = time.perf_counter()
    print(f"{'cell':<44} {'ours':>9} {'before':>9} {'lower':>9} {'ours/lower':>10}")
    for name, ours, old, lower in rows():
        before = "—" if old is None else f"{old:.4f}"
        ratio = ours / lower if lower > 0 else math.inf
        assert ours >= lower, (name, ours, lower)
        print(f"{name:<44} {ours:>9.4f} {before:>9} {lower:>9.4f} {ratio:>10.2f}")
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
