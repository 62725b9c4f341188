"""The round job of a discovery: what a window serves, and what its counts make.

``DiscoverySettings`` is a heavy-hitters metric's plan and privacy target; every
round's ε0 is fixed from it before any report is made (``epsilon0s``: the largest
whose generic shuffle bound over ``min_batch`` reports meets the target: no shuffler
releases fewer, so every batch of every round meets it, whichever shuffler releases
it and whenever it arrives; parallel composition over disjoint batches).
``round_params`` gives the params the devices of the next round encode with
(served by ``GetConfig`` for that round's window); ``absorb`` decodes a round's
counts and returns the next state, and after the value round the result table and
the privacy guarantee, computed from the report counts actually received.
``simulate`` runs a whole discovery in memory (benchmarks, the ``discover`` command);
``settings_of`` reads a registry entry, ``cells_bound`` sizes its count vector.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.accounting.discovery import (
    DiscoveryGuarantee,
    RoundCost,
    discovery_guarantee,
    plan_epsilon0,
)
from crowdmix.aggregator.accounting.local import round_epsilon
from crowdmix.aggregator.discovery.plan import (
    DiscoveredValues,
    DiscoveryPlan,
    DiscoveryState,
    advance,
    discovered,
)
from crowdmix.aggregator.discovery.prefixes import decode_prefix_round
from crowdmix.aggregator.discovery.values import decode_value_round
from crowdmix.core.discovery import HeavyHittersParams, PrefixRound, ValueRound

__all__ = [
    "DiscoverySettings",
    "RoundOutcome",
    "absorb",
    "cells_bound",
    "round_params",
    "settings_of",
    "simulate",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoverySettings:
    """A discovery's plan, central target (ε, δ), the devices expected over all rounds
    and ``min_batch``: the fewest reports any batch of a round holds (the shuffle
    policy's release rule), the crowd every round's ε0 is planned over."""

    plan: DiscoveryPlan
    epsilon: float
    delta: float
    devices: int
    min_batch: int

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and 0.0 < self.epsilon < math.inf):
            raise ValueError(f"epsilon must be a positive number, got {self.epsilon!r}")
        if not (isinstance(self.delta, int | float) and 0.0 < self.delta < 1.0):
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
        d = self.devices
        if isinstance(d, bool) or not isinstance(d, int) or d < self.plan.rounds:
            raise ValueError(f"devices must be an integer >= {self.plan.rounds}, got {d!r}")
        m = self.min_batch
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"min_batch must be a positive integer, got {m!r}")
        smallest = min(self.group_size(r) for r in range(self.plan.rounds))
        if m > smallest:
            raise ValueError(
                f"min_batch ({m}) exceeds the smallest expected round group (devices x min "
                f"weight = {smallest}): its rounds would never be released"
            )

    def group_size(self, r: int) -> int:
        """Devices expected in round r's group: ⌊devices·weights[r]⌋."""
        return max(1, int(self.devices * self.plan.weights[r]))

    def epsilon0s(self) -> tuple[float, ...]:
        """Each round's local ε0: ``plan_epsilon0`` over ``min_batch`` reports."""
        eps0 = _epsilon0(self.min_batch, float(self.epsilon), float(self.delta))
        return (eps0,) * self.plan.rounds


@functools.lru_cache(maxsize=64)
def settings_of(params: HeavyHittersParams, min_batch: int) -> DiscoverySettings:
    """The discovery a heavy-hitters registry entry states (``min_batch``: its shuffle
    policy's)."""
    plan = DiscoveryPlan(
        symbols=params.symbols,
        spans=params.spans,
        keep=params.keep,
        candidates=params.candidates,
        seeds=params.seeds,
        weights=params.weights,
    )
    return DiscoverySettings(
        plan=plan,
        epsilon=params.epsilon,
        delta=params.delta,
        devices=params.devices,
        min_batch=min_batch,
    )


@functools.lru_cache(maxsize=64)
def cells_bound(params: HeavyHittersParams, min_batch: int) -> int:
    """The most index values any round of ``params`` (with ``min_batch``) takes (every
    prefix round's S·g, the value round's C + 1): the metric's count vector per window."""
    settings = settings_of(params, min_batch)
    eps0 = settings.epsilon0s()
    plan = settings.plan
    try:
        prefix = [plan.prefix_round(r, eps0[r]).cells for r in range(len(plan.spans))]
    except ValueError as exc:
        raise ValueError(
            f"the target (ε={params.epsilon}, δ={params.delta}) over batches of min_batch = "
            f"{min_batch} reports leaves a round local ε0 = {min(eps0):.4g}, too small for "
            f"its hashing ({exc}): raise min_batch (and devices), or the target"
        ) from None
    return max(*prefix, plan.candidates + 1)


@functools.lru_cache(maxsize=128)
def _epsilon0(n: int, epsilon: float, delta: float) -> float:
    return plan_epsilon0(n, epsilon, delta)


def round_params(settings: DiscoverySettings, state: DiscoveryState) -> PrefixRound | ValueRound:
    """What the devices of round ``state.next_round`` encode with."""
    r = state.next_round
    plan = settings.plan
    if r > len(plan.spans):
        raise ValueError(f"the discovery is finished (it has {plan.rounds} rounds)")
    eps0 = settings.epsilon0s()[r]
    if r < len(plan.spans):
        return plan.prefix_round(r, eps0)
    candidates = state.final_candidates(plan)
    if not candidates:
        raise ValueError("no complete value was found in the prefix rounds: nothing to estimate")
    return plan.value_round(eps0, candidates)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundOutcome:
    """After one round: the next state, that round's cost, and (after the value round)
    the result table and the whole discovery's guarantee."""

    state: DiscoveryState
    cost: RoundCost
    table: DiscoveredValues | None = None
    guarantee: DiscoveryGuarantee | None = None


def absorb(
    settings: DiscoverySettings,
    state: DiscoveryState,
    counts: npt.ArrayLike,
    *,
    crowd: int | None = None,
) -> RoundOutcome:
    """Decode round ``state.next_round`` from its counts (one per report index).
    ``crowd``: the reports of the round's smallest shuffle when it was shuffled in
    several batches (disjoint devices: the round is as private as that one); the
    round's cost then counts that many reports."""
    params = round_params(settings, state)
    c = np.asarray(counts)
    n = int(c.sum()) if c.size else 0
    if crowd is not None:
        n = min(n, crowd)
    cost = RoundCost(
        round=state.next_round,
        group=state.next_round,
        n_reports=n,
        # what the devices' keep probability realises (at most the planned ε0)
        epsilon0=round_epsilon(params),
        # A value round is plain k-RR over its cells: k-RR's blanket bound applies to it.
        domain=params.cells if isinstance(params, ValueRound) else None,
    )
    costs = (*state.costs, (cost.round, cost.group, cost.n_reports, cost.epsilon0))
    if isinstance(params, PrefixRound):
        est = decode_prefix_round(params, state.parent_array(), c)
        nxt = replace(advance(settings.plan, state, est), costs=costs)
        return RoundOutcome(state=nxt, cost=cost)
    table = discovered(settings.plan, state, decode_value_round(params, c))
    done = replace(state, next_round=state.next_round + 1, costs=costs)
    rounds = [RoundCost(round=r, group=g, n_reports=k, epsilon0=e) for r, g, k, e in costs]
    rounds[-1] = cost  # this value round, with its domain
    guarantee = discovery_guarantee(rounds, settings.delta)
    return RoundOutcome(state=done, cost=cost, table=table, guarantee=guarantee)


def simulate(
    settings: DiscoverySettings,
    symbols: list[bytes],
    holders: npt.ArrayLike,
    rng: np.random.Generator,
) -> RoundOutcome:
    """A whole discovery in memory: the devices ``holders`` (indexes into ``symbols``)
    split at random into the plan's groups, each round simulated and absorbed."""
    from crowdmix.aggregator.discovery.simulate import (
        simulate_prefix_counts,
        simulate_value_counts,
    )

    h = np.asarray(holders)
    order = rng.permutation(h.size)
    cuts = np.floor(np.cumsum((0.0, *settings.plan.weights)) * h.size).astype(np.int64)
    state = DiscoveryState()
    outcome: RoundOutcome | None = None
    for r in range(settings.plan.rounds):
        group = h[order[cuts[r] : cuts[r + 1]]]
        params = round_params(settings, state)
        if isinstance(params, PrefixRound):
            counts = simulate_prefix_counts(params, symbols, group, rng)
        else:
            counts = simulate_value_counts(params, symbols, group, rng)
        outcome = absorb(settings, state, counts)
        state = outcome.state
    assert outcome is not None  # a plan has at least two rounds
    return outcome
