"""Privacy of a discovery (prefix rounds + a value round): pure math.

Every round r is one shuffled batch of n_r reports of an ε0_r-LDP randomizer (k-RR over
hash buckets or candidates): its central (ε_r, δ) is the generic stronger-clone bound
(Feldman, McMillan, Talwar SODA 2023; Wang et al., VLDB 2024, Lemma 4.4), or for plain
k-RR over a known domain (the value round) the best of it and k-RR's blanket bound
(``amplification.best_amplification``). Rounds of disjoint device groups compose in
*parallel*: the discovery is (max_g ε_g, max_g δ_g)-DP for replacing one device's value
(McSherry, "Privacy integrated queries", SIGMOD 2009, Thm 4, adaptive); within a group
rounds compose sequentially (``history.compose_segments``). ``plan_epsilon0`` inverts
the generic one-round bound: the largest ε0 whose amplified ε over n reports is at most
the target (bisection). Argument: docs/design.md, "Aggregator: accounting", discovery.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from crowdmix.aggregator.accounting.amplification import amplify, best_amplification
from crowdmix.aggregator.accounting.randomizers import KaryRR
from crowdmix.core.basic import MAX_DOMAIN, MAX_EPSILON, BasicParams

if TYPE_CHECKING:
    from crowdmix.aggregator.accounting.history import Segment

__all__ = [
    "DiscoveryGuarantee",
    "RoundCost",
    "discovery_guarantee",
    "plan_epsilon0",
    "round_segment",
]

# Bisection steps: ε0 to ~1e-6 over [0, 30].
_STEPS = 45


def plan_epsilon0(n: int, epsilon: float, delta: float, *, upper: float = 20.0) -> float:
    """The largest ε0 (to within 1e-6, rounded down) whose shuffle of n reports is
    (ε, δ)-DP by the generic bound; ValueError when not even a tiny ε0 is."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not (isinstance(epsilon, int | float) and 0.0 < epsilon < math.inf):
        raise ValueError(f"epsilon must be a positive number, got {epsilon!r}")
    if amplify(upper, n, delta).epsilon <= epsilon:
        return upper
    lo, hi = 0.0, upper
    for _ in range(_STEPS):
        mid = 0.5 * (lo + hi)
        if amplify(mid, n, delta).epsilon <= epsilon:
            lo = mid
        else:
            hi = mid
    if lo <= 0.0:
        raise ValueError(f"no local epsilon meets epsilon={epsilon} over n={n} reports")
    return lo


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundCost:
    """One round as run: its device group, report count and local ε0."""

    round: int
    group: int
    n_reports: int
    epsilon0: float
    # Values of the round's k-RR when it is plain k-RR (a value round: candidates
    # + "none"); None for hashed rounds, which only the generic bound covers.
    domain: int | None = None

    def randomizer(self) -> KaryRR | None:
        """The round's k-RR for its blanket bound, or None (generic bound only)."""
        if self.domain is None or not 2 <= self.domain <= MAX_DOMAIN:
            return None
        if not 0.0 < self.epsilon0 < math.inf:
            return None
        return KaryRR(epsilon0=self.epsilon0, domain=self.domain)

    def basic(self) -> BasicParams | None:
        """The round's mechanism as the ledger records it (None: unknown)."""
        if self.randomizer() is None or not 0.0 < self.epsilon0 <= MAX_EPSILON:
            return None
        assert self.domain is not None
        return BasicParams(mechanism="krr", epsilon=self.epsilon0, domain_size=self.domain)


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveryGuarantee:
    """The discovery's central (ε, δ), each round's, and the worst local ε of one device."""

    epsilon: float
    delta: float
    local_epsilon: float
    per_round: tuple[tuple[int, float], ...]
    argument: str

    def to_dict(self) -> dict[str, object]:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "local_epsilon": self.local_epsilon,
            "per_round": [{"round": r, "epsilon": e} for r, e in self.per_round],
            "argument": self.argument,
        }


def round_segment(cost: RoundCost, delta: float, discovery: str) -> Segment:
    """The ledger segment of one round: one shuffle of its reports, in its group of
    the discovery's partition (so the ledger composes groups in parallel)."""
    from crowdmix.aggregator.accounting.history import Segment
    from crowdmix.aggregator.accounting.local import basic_total_variation

    basic = cost.basic()
    return Segment(
        rounds=1,
        n_amplify=cost.n_reports,
        delta=delta,
        epsilon0=cost.epsilon0,
        # any ε0-LDP randomizer's total variation, or the round's k-RR's
        beta=math.tanh(cost.epsilon0 / 2.0) if basic is None else basic_total_variation(basic),
        basic=basic,
        partition=discovery,
        group=cost.group,
    )


def discovery_guarantee(
    rounds: Sequence[RoundCost], delta: float, *, discovery: str = "discovery"
) -> DiscoveryGuarantee:
    """Parallel across groups, sequential within one (module docstring): the same
    figure the ledger computes from ``round_segment`` of each round."""
    from crowdmix.aggregator.accounting.history import compose_segments

    if not rounds:
        raise ValueError("a discovery has at least one round")
    live = [c for c in rounds if c.n_reports > 0]
    per_round = tuple(
        (
            c.round,
            best_amplification(c.epsilon0, c.n_reports, delta, c.randomizer()).result.epsilon
            if c.n_reports
            else 0.0,
        )
        for c in rounds
    )
    local: dict[int, float] = defaultdict(float)
    for c in rounds:
        local[c.group] += c.epsilon0
    total = compose_segments([round_segment(c, delta, discovery) for c in live])
    sequential = len({c.group for c in live}) < len(live)
    argument = "parallel over disjoint groups" + (", sequential within each" if sequential else "")
    return DiscoveryGuarantee(
        epsilon=total.epsilon,
        delta=total.delta,
        local_epsilon=max(local.values()),
        per_round=per_round,
        argument=argument,
    )
