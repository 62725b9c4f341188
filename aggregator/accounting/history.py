"""Composition over time: (ε, δ) of many shuffled rounds that need not be alike. Pure math.

A *segment* is what one release adds: ``rounds`` windows, each a shuffle of ``n_amplify``
reports of one ε0-LDP randomizer. The statement of one release and the ledger's running
total both call this module. Fresh randomness: each round is dominated by the generic
stronger clone pair (``pairs``; Feldman, McMillan, Talwar SODA 2023; Wang et al. VLDB 2024,
Lemma 4.4), the product of pairs dominates the adaptive composition (Zhu, Dong, Wang,
AISTATS 2022), and the PLDs are composed with losses rounded up (Koskela et al. 2020;
Doroshenko et al. 2022); large n enters as per-round (ε_r, δ/(2R)) under Kairouz–Oh–
Viswanath 2015. Memoised PRR (RAPPOR f > 0): rounds under one PRR form a group bounded by
amplifying min(ε_K, ε_∞) (per-report cohorts: the IRR bound K·k·max(ln(q/p),
ln((1-p)/(1-q)))); groups add by basic composition (Dwork, Roth 2014, Thm 3.16); disjoint
device groups compose in parallel (McSherry, SIGMOD 2009, Thm 4). Every figure is an
upper bound or ∞. Proof: docs/design.md, "Aggregator: accounting", composition over time.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from crowdmix.core.basic import BasicParams
from crowdmix.core.params import RapporParams

if TYPE_CHECKING:
    from crowdmix.aggregator.accounting.randomizers import Randomizer

__all__ = [
    "Composed",
    "Segment",
    "SharedCoinsError",
    "compose_segments",
    "round_pair",
    "segment_from_dict",
    "segment_to_dict",
]


class SharedCoinsError(ValueError):
    """Two groups of rounds share PRR coins under different f: no bound holds."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """What one release adds: ``rounds`` shuffles of ``n_amplify`` reports each."""

    rounds: int
    n_amplify: int
    delta: float
    epsilon0: float
    beta: float
    rappor: RapporParams | None = None
    # The basic mechanism's params (None for RAPPOR, and for a generic ε0-LDP
    # randomizer): with them the mechanism's blanket bound is used.
    basic: BasicParams | None = None
    hashing: str = "mmh3"
    cohort_per_report: bool = False
    # Per round: probability that an estimated crowd was smaller than n_amplify
    # (charged to δ once per round, on top of ``delta``).
    crowd_failure: float = 0.0
    # Disjoint device groups: segments of one partition with different groups
    # never share a device ("" = every device may be in every segment).
    partition: str = ""
    group: int = 0

    def __post_init__(self) -> None:
        for name in ("rounds", "n_amplify"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
        if math.isnan(self.epsilon0) or self.epsilon0 < 0.0:
            raise ValueError(f"epsilon0 must be non-negative, got {self.epsilon0!r}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {self.beta!r}")
        if not 0.0 <= self.crowd_failure < 1.0:
            raise ValueError(f"crowd_failure must be in [0, 1), got {self.crowd_failure!r}")
        if not isinstance(self.partition, str) or len(self.partition) > 256:
            raise ValueError(f"partition must be a string of at most 256, got {self.partition!r}")
        g = self.group
        if isinstance(g, bool) or not isinstance(g, int) or g < 0:
            raise ValueError(f"group must be a non-negative integer, got {g!r}")

    @property
    def fresh(self) -> bool:
        """Fresh randomness every round (no PRR shared between rounds)."""
        return self.rappor is None or self.rappor.f == 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Composed:
    """(ε, δ) of all segments together; ``parts`` says which argument bounds what."""

    epsilon: float
    delta: float
    argument: str
    parts: tuple[tuple[str, float, float], ...] = ()
    candidates: dict[str, float] = field(default_factory=dict)


def round_pair(epsilon0: float) -> Any:
    """The clone pair dominating one shuffled round: the generic stronger clone
    (module docstring; never a mechanism-specific (p, β, q) pair)."""
    from crowdmix.aggregator.accounting.pairs import ClonePair

    return ClonePair.stronger_clone(epsilon0)


def _best_amplify(
    epsilon0: float, n: int, delta: float, randomizer: Randomizer | None = None
) -> float:
    """One-round shuffle bound: ``amplification.best_amplification`` (the generic
    stronger clone, and the randomizer's blanket bound when it is known)."""
    from crowdmix.aggregator.accounting.amplification import best_amplification

    if math.isinf(epsilon0):
        return math.inf
    return best_amplification(epsilon0, n, delta, randomizer).result.epsilon


def _report_randomizer(s: Segment) -> Randomizer | None:
    """The randomizer of one report of ``s`` (fresh randomness), for its blanket bound."""
    from crowdmix.aggregator.accounting.randomizers import randomizer_of

    if s.rappor is not None and s.cohort_per_report and s.rappor.m > 1:
        return None
    basic = s.basic
    if basic is not None and basic.mechanism == "krr" and 0.0 < s.epsilon0 < math.inf:
        # the ε0 the release charged (a basic metric's basic_epsilon; a heavy-hitter
        # value round's realised ε0, at most its configured one)
        from crowdmix.aggregator.accounting.randomizers import KaryRR

        return KaryRR(epsilon0=s.epsilon0, domain=basic.domain_size)
    return randomizer_of(basic=basic, rappor=s.rappor)


@lru_cache(maxsize=32)
def _pair_pld(epsilon0: float, n: int, tail: float) -> Any:
    from crowdmix.aggregator.accounting.pld import shuffle_pld

    return shuffle_pld(round_pair(epsilon0), n, tail=tail)


@lru_cache(maxsize=32)
def _blanket_pld(randomizer: Randomizer, n: int, tail: float) -> Any:
    """``blanket_pld``, computed once per randomizer, crowd and tail (whatever the
    number of rounds it is composed over)."""
    from crowdmix.aggregator.accounting.blanket_pld import blanket_pld

    return blanket_pld(randomizer, n, tail=tail)


@lru_cache(maxsize=4)  # a composed PLD can hold tens of MB
def _rounds_pld(epsilon0: float, n: int, tail: float, randomizer: Randomizer | None, k: int) -> Any:
    """``k`` rounds of ``_round_pld`` composed (PLDs are immutable: shared, not copied)."""
    one = _round_pld(epsilon0, n, tail, randomizer, k)
    return one.self_compose(k) if k > 1 else one


@lru_cache(maxsize=32)
def _round_pld(epsilon0: float, n: int, tail: float, randomizer: Randomizer | None, k: int) -> Any:
    """The PLD of one round: the randomizer's blanket pair (``blanket_pld``) where it
    gives the smaller ε over the ``k`` rounds' share of δ, else the generic pair.
    Both dominate the round, so either choice is an upper bound."""
    generic = _pair_pld(epsilon0, n, tail)
    if randomizer is None:
        return generic
    blanket = _blanket_pld(randomizer, n, tail)
    if blanket is None:
        return generic
    probe = 1e-6 / max(1, k)
    better = blanket.get_epsilon_for_delta(probe) < generic.get_epsilon_for_delta(probe)
    return blanket if better else generic


def _pld_part(segs: Sequence[Segment], delta: float) -> tuple[float, str]:
    """ε of every round of ``segs`` (fresh randomness) composed, at ``delta``."""
    from crowdmix.aggregator.accounting.composition import compose_optimal
    from crowdmix.aggregator.accounting.pld import MAX_PLD_N

    total_rounds = sum(s.rounds for s in segs)
    if any(math.isinf(s.epsilon0) for s in segs):
        return math.inf, "no-bound"
    if all(s.epsilon0 == 0.0 for s in segs):
        return 0.0, "pld-composition"
    if total_rounds == 1:  # nothing to compose: the round's own (tighter) figure
        (one,) = segs
        return _best_amplify(one.epsilon0, one.n_amplify, delta, _report_randomizer(one)), (
            "single-release"
        )
    by_pair: dict[tuple[float, int, Any], int] = defaultdict(int)
    by_round: dict[tuple[float, int, Any], int] = defaultdict(int)
    for s in segs:
        key = (s.epsilon0, s.n_amplify, _report_randomizer(s))
        if 2 <= s.n_amplify <= MAX_PLD_N and 0.0 < s.epsilon0 <= 50.0:
            by_pair[key] += s.rounds
        elif s.epsilon0 > 0.0:
            by_round[key] += s.rounds
    fallback_rounds = sum(by_round.values())
    per_round = delta / (2.0 * max(1, fallback_rounds))
    if not by_pair and len(by_round) == 1:
        # All alike and past the PLD's reach: KOV's exact optimal composition.
        ((eps0, n, rand), k) = next(iter(by_round.items()))
        eps_r = _best_amplify(eps0, n, per_round, rand)
        if k * per_round < delta:
            return compose_optimal(eps_r, per_round, k, delta), "optimal-composition"
        return k * eps_r, "basic-composition"
    tail = min(1e-12, delta * 1e-4 / total_rounds)
    pairs = tuple(sorted(by_pair.items(), key=lambda kv: kv[0][:2]))
    rounds = tuple(sorted(by_round.items(), key=lambda kv: kv[0][:2]))
    return _composed_epsilon(pairs, rounds, tail, per_round, delta), "pld-composition"


_Rounds = tuple[tuple[tuple[float, int, Any], int], ...]  # ((ε0, n, randomizer), rounds) …


@lru_cache(maxsize=256)
def _composed_epsilon(
    pairs: _Rounds, rounds: _Rounds, tail: float, per_round: float, delta: float
) -> float:
    """ε at ``delta`` of the PLDs of ``pairs`` and the (ε_r, ``per_round``) rounds of
    ``rounds`` composed in this order (a ledger recomposes the same rounds often)."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld_mod

    from crowdmix.aggregator.accounting.pld import GRID

    composed: Any = None
    for (eps0, n, rand), k in pairs:
        part = _rounds_pld(eps0, n, tail, rand, k)
        composed = part if composed is None else composed.compose(part)
    for (eps0, n, rand), k in rounds:
        eps_r = _best_amplify(eps0, n, per_round, rand)
        one = pld_mod.from_privacy_parameters(
            common.DifferentialPrivacyParameters(eps_r, per_round),
            value_discretization_interval=GRID,
        )
        part = one.self_compose(k) if k > 1 else one
        composed = part if composed is None else composed.compose(part)
    assert composed is not None  # some segment has ε0 > 0
    return float(composed.get_epsilon_for_delta(delta))


def _memo_part(segs: Sequence[Segment], delta: float) -> tuple[float, str, dict[str, float]]:
    """ε of one group of rounds over one memoised PRR (module docstring)."""
    from crowdmix.aggregator.accounting import local

    first = segs[0].rappor
    assert first is not None
    k_total = sum(s.rounds for s in segs)
    n = min(s.n_amplify for s in segs)
    same = all(s.rappor == first for s in segs)
    cands: dict[str, float] = {}
    eps_inf = local.epsilon_inf(first)
    m = max(s.rappor.m for s in segs if s.rappor is not None)
    if any(s.cohort_per_report for s in segs) and m > 1 and k_total > 1:
        eps_irr = k_total * _irr_all_bits(segs)
        if math.isinf(eps_irr):
            return math.inf, "no-bound", cands
        cands["cohort-irr"] = _best_amplify(eps_irr, n, delta)
        return cands["cohort-irr"], "cohort-irr", cands
    if not math.isinf(eps_inf):
        from crowdmix.aggregator.accounting.randomizers import randomizer_of

        # One group shares k, h, m and f (``_check_shared_coins``): one PRR.
        prr = randomizer_of(rappor=first, prr_only=True)
        cands["memoised-prr-inf"] = _best_amplify(eps_inf, n, delta, prr)
    if same:
        eps_k = local.epsilon_k(first, k_total)
        if not math.isinf(eps_k):
            # One round is one report (ε_1 = ε_k): its own randomizer's bound applies.
            single = _report_randomizer(segs[0]) if k_total == 1 else None
            cands["memoised-prr-k"] = _best_amplify(eps_k, n, delta, single)
    if not cands:
        return math.inf, "no-bound", cands
    name = min(cands, key=lambda key: cands[key])
    return cands[name], name, cands


def _irr_all_bits(segs: Sequence[Segment]) -> float:
    """ε of one report's IRR over all k bits, whatever PRR it randomizes:
    k · max(ln(q/p), ln((1-p)/(1-q))), the largest over the group's params.

    With the cohort drawn per report the PRR argument fails: the PRR is keyed by
    the Bloom bytes, not the cohort, so two cohorts whose Bloom filters of one value
    coincide share coins, and the linked PRRs of two values are not within c·ε_∞
    (one forces equal PRRs, the other does not: the ratio is unbounded before the
    IRR). What holds for any PRR outputs: P(o | v) ≤ max_s Π_i P(o_i | s_i) and
    P(o | v') ≥ min_s Π_i P(o_i | s_i), so K reports are K·(this)-LDP, whatever the
    coins (``tests/accounting/test_history.py`` enumerates a case past 2·ε_∞)."""
    worst = 0.0
    for s in segs:
        assert s.rappor is not None
        p, q, k = s.rappor.p, s.rappor.q, s.rappor.k
        if p <= 0.0 or q >= 1.0:
            return math.inf
        worst = max(worst, k * max(math.log(q / p), math.log((1.0 - p) / (1.0 - q))))
    return worst


def _prr_key(s: Segment) -> tuple[str, int, int, bool, int]:
    # f = 0 has no PRR coins (the "PRR" is the Bloom filter itself): its own group.
    # m is part of the key: a client's cohort (secret mod m) and so its Bloom filter
    # change with m, so rounds under different m are not one memoised PRR.
    assert s.rappor is not None
    return (s.hashing, s.rappor.k, s.rappor.h, s.rappor.f == 0.0, s.rappor.m)


def _coin_key(s: Segment) -> tuple[str, int]:
    """What a client's PRR coins depend on besides (secret, metric, Bloom bits):
    the Bloom filter's byte string — ceil(k/8) bytes (mmh3), or the 4-byte integer
    of google/rappor's HMAC rule. Not k, h, f or m (client/rappor.py)."""
    assert s.rappor is not None
    return (s.hashing, 4 if s.hashing == "rappor-md5" else -(-s.rappor.k // 8))


def _check_shared_coins(segments: Sequence[Segment]) -> None:
    """Refuse PRR parameters that change within one coin key (SharedCoinsError).

    Releases under one metric whose Bloom filters have the same byte length draw
    their PRR coins from one keyed PRF of the Bloom bytes, whatever k, h, f and m
    are: the h = 1 filter is a subset of the h = 2 filter (and equal to it for ~1/k
    of values), different k with the same byte length share the uniform word, a
    change of m moves some clients to another cohort's filter and keeps the others
    on the same one. Their joint view is then neither one memoised PRR nor
    independent PRRs (with different f it can reveal a Bloom bit exactly; even with
    the same f, a filter coinciding under two parameter sets makes the two "PRRs"
    equal, which no per-group figure covers), so no bound is claimed. Fixing this
    in the PRF input (hashing k, h, f, m into it) would change the reports of the
    wire-compatible google/rappor mode and the golden vectors, so the ledger refuses
    instead; a new metric name gives independent coins (the PRF is keyed on it).
    """
    seen: dict[tuple[str, int], set[tuple[int, int, float, int]]] = defaultdict(set)
    for s in segments:
        if s.rappor is not None and s.rappor.f > 0.0:
            r = s.rappor
            seen[_coin_key(s)].add((r.k, r.h, r.f, r.m))
    for (hashing, nbytes), params in seen.items():
        if len(params) > 1:
            listed = "; ".join(f"k={k}, h={h}, f={f}, m={m}" for k, h, f, m in sorted(params))
            raise SharedCoinsError(
                f"releases with a memoised PRR over {nbytes}-byte Bloom filters ({hashing}) "
                f"under different PRR parameters ({listed}) share their PRR coins (the coins "
                "depend only on the client secret, the metric and the Bloom bytes): their "
                "joint view can reveal Bloom bits, so no bound holds; record the new "
                "parameters under a new metric name"
            )


def compose_segments(segments: Sequence[Segment]) -> Composed:
    """(ε, δ) of all ``segments`` together (module docstring): segments of a
    partition in parallel across its groups, everything else as one sequence,
    and the parts added (basic composition)."""
    import dataclasses

    plain = [s for s in segments if not s.partition]
    parts_by: dict[str, dict[int, list[Segment]]] = defaultdict(lambda: defaultdict(list))
    for s in segments:
        if s.partition:
            parts_by[s.partition][s.group].append(dataclasses.replace(s, partition="", group=0))
    if not parts_by:
        return _compose_sequence(plain)
    base = _compose_sequence(plain)
    eps, delta = base.epsilon, base.delta
    parts = list(base.parts)
    for name, groups in sorted(parts_by.items()):
        worst = [_compose_group(g) for _, g in sorted(groups.items())]
        g_eps, g_delta = max(c.epsilon for c in worst), max(c.delta for c in worst)
        parts.append((f"parallel-groups:{name}", g_eps, g_delta))
        eps, delta = eps + g_eps, delta + g_delta
    argument = parts[0][0] if len(parts) == 1 else "basic-composition"
    return Composed(
        epsilon=eps,
        delta=min(1.0, delta),
        argument=argument,
        parts=tuple(parts),
        candidates=dict(base.candidates),
    )


def _compose_group(segments: Sequence[Segment]) -> Composed:
    """One group's rounds: a single fresh round is its own shuffle bound (the best of
    the generic and its randomizer's blanket bound, as ``_pld_part``), more compose."""
    if len(segments) == 1 and segments[0].rounds == 1 and segments[0].fresh:
        s = segments[0]
        eps = _best_amplify(s.epsilon0, s.n_amplify, s.delta, _report_randomizer(s))
        delta = min(1.0, s.delta + s.crowd_failure)
        return Composed(epsilon=eps, delta=delta, argument="single-release")
    return _compose_sequence(segments)


def _compose_sequence(segments: Sequence[Segment]) -> Composed:
    """(ε, δ) of ``segments`` that may all touch every device (module docstring);
    δ adds across the independent parts, each part uses the largest δ of its segments.

    RAPPOR f = 0 groups may go either way (into the PLD, or bounded alone by the
    memoised-k argument); both strategies are evaluated for all such groups at
    once and (min ε, max δ) is returned. Each strategy is non-decreasing as
    segments are added, so the result is too — a per-group choice would not be
    (moving a group into the PLD can lower the sum).
    """
    if not segments:
        return Composed(epsilon=0.0, delta=0.0, argument="none")
    _check_shared_coins(segments)
    groups: dict[tuple[str, int, int, bool, int], list[Segment]] = defaultdict(list)
    fresh: list[Segment] = []
    for s in segments:
        if s.fresh and s.rappor is None:
            fresh.append(s)
        else:
            groups[_prr_key(s)].append(s)
    fixed: list[tuple[str, float, float]] = []  # memoised-PRR groups (f > 0)
    f0_memo: list[tuple[str, float, float]] = []  # f = 0 groups bounded alone
    f0_segments: list[Segment] = []
    cands: dict[str, float] = {}
    for segs in groups.values():
        fs = {s.rappor.f for s in segs if s.rappor is not None}
        delta = max(s.delta for s in segs)
        eps, name, group_cands = _memo_part(segs, delta)
        cands.update(group_cands)
        if fs == {0.0}:
            f0_memo.append((name, eps, delta))
            f0_segments.extend(segs)
        else:
            fixed.append((name, eps, delta))

    def pld_parts(pool: list[Segment]) -> list[tuple[str, float, float]]:
        if not pool:
            return []
        delta = max(s.delta for s in pool)
        eps, name = _pld_part(pool, delta)
        cands.setdefault(name, eps)
        return [(name, eps, delta)]

    strategies = [fixed + pld_parts(fresh + f0_segments)]
    if f0_segments:
        strategies.append(fixed + f0_memo + pld_parts(fresh))
    failures = math.fsum(s.rounds * s.crowd_failure for s in segments)
    totals = [
        (
            math.fsum(e for _, e, _ in parts),
            min(1.0, math.fsum(d for _, _, d in parts) + failures),
            parts,
        )
        for parts in strategies
    ]
    eps_total, _, parts = min(totals, key=lambda t: t[0])
    delta_total = max(d for _, d, _ in totals)  # the chosen strategy's δ is at most this
    argument = parts[0][0] if len(parts) == 1 else "basic-composition"
    return Composed(
        epsilon=eps_total,
        delta=delta_total,
        argument=argument,
        parts=tuple(parts),
        candidates=cands,
    )


def segment_to_dict(seg: Segment) -> dict[str, Any]:
    """JSON form of a segment (as stored in a ledger entry)."""
    r = seg.rappor
    return {
        "rounds": seg.rounds,
        "n_amplify": seg.n_amplify,
        "delta": seg.delta,
        "epsilon0": None if math.isinf(seg.epsilon0) else seg.epsilon0,
        "beta": seg.beta,
        "rappor": None
        if r is None
        else {"k": r.k, "h": r.h, "m": r.m, "f": r.f, "p": r.p, "q": r.q},
        "basic": None
        if seg.basic is None
        else {
            "mechanism": seg.basic.mechanism,
            "epsilon": seg.basic.epsilon,
            "domain_size": seg.basic.domain_size,
        },
        "hashing": seg.hashing,
        "cohort_per_report": seg.cohort_per_report,
        "crowd_failure": seg.crowd_failure,
        **({"partition": seg.partition, "group": seg.group} if seg.partition else {}),
    }


def segment_from_dict(data: Any) -> Segment:
    """Inverse of ``segment_to_dict``; ValueError/KeyError/TypeError on bad data."""
    from crowdmix.core.errors import ParamsError

    r = data["rappor"]
    eps0 = data["epsilon0"]
    b = data["basic"]
    try:
        rappor = None if r is None else RapporParams(**{k: r[k] for k in "khmfpq"})
        basic = (
            None
            if b is None
            else BasicParams(
                mechanism=b["mechanism"], epsilon=b["epsilon"], domain_size=b["domain_size"]
            )
        )
    except ParamsError as exc:
        raise ValueError(str(exc)) from None
    return Segment(
        rounds=data["rounds"],
        n_amplify=data["n_amplify"],
        delta=float(data["delta"]),
        epsilon0=math.inf if eps0 is None else float(eps0),
        beta=float(data["beta"]),
        rappor=rappor,
        basic=basic,
        hashing=str(data["hashing"]),
        cohort_per_report=bool(data["cohort_per_report"]),
        crowd_failure=float(data["crowd_failure"]),
        partition=str(data.get("partition", "")),
        group=int(data.get("group", 0)),
    )
