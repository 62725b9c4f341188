"""The local randomizers the shuffle bounds know by structure, and their blanket profiles.

Each description is a frozen value object with the randomizer's ε0 and
``profile(n, delta)``: an upper bound on δ(ε) of n shuffled reports from the
privacy blanket (``blanket``), or None where no such bound is implemented
(then only the generic bound applies). ``randomizer_of`` maps a metric's
params to its description:

- k-ary RR (and binary RR, d = 2) over d values;
- OLH: a uniform hash (a, b) of the 2-universal family mod P = 2^31 − 1, then
  g-ary RR on the bucket;
- bit vectors: OUE (h = 1), one RAPPOR report (p*, q*, h) and the RAPPOR PRR
  (f/2, 1 − f/2, h), for h ≤ 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from crowdmix.aggregator.accounting.blanket import (
    Profile,
    Worst,
    bit_vector_given,
    krr_given,
    mixture,
    two_bit_points,
)
from crowdmix.aggregator.accounting.local import basic_epsilon
from crowdmix.core.basic import OLH_PRIME

if TYPE_CHECKING:
    from crowdmix.core.basic import BasicParams
    from crowdmix.core.params import RapporParams

__all__ = [
    "BitVector",
    "KaryRR",
    "LocalHashing",
    "Randomizer",
    "olh_collision",
    "randomizer_of",
]

# Bit-vector laws are enumerated exactly; past this many points per law the
# crowd counted is capped (larger crowds are bounded by the cap's δ, still valid).
_MAX_LAW_POINTS = 400_000


def _check_epsilon(epsilon0: float) -> None:
    if isinstance(epsilon0, bool) or not isinstance(epsilon0, int | float):
        raise ValueError(f"epsilon0 must be a number, got {epsilon0!r}")
    if not math.isfinite(epsilon0) or epsilon0 <= 0.0:
        raise ValueError(f"epsilon0 must be finite and positive, got {epsilon0!r}")


def _check_profile_args(n: int, delta: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class KaryRR:
    """k-ary randomized response: the true value w.p. e^ε0/(e^ε0+d−1), else one of
    the other d−1 uniformly (binary RR is d = 2)."""

    epsilon0: float
    domain: int

    def __post_init__(self) -> None:
        _check_epsilon(self.epsilon0)
        if isinstance(self.domain, bool) or not isinstance(self.domain, int) or self.domain < 2:
            raise ValueError(f"domain must be an integer ≥ 2, got {self.domain!r}")

    @property
    def name(self) -> str:
        return f"{self.domain}-ary RR"

    @property
    def blanket_mass(self) -> float:
        """γ = d/(e^ε0 + d − 1): every report is uniform over the d values w.p. γ."""
        return self.domain / (math.exp(self.epsilon0) + self.domain - 1.0)

    def profile(self, n: int, delta: float) -> Profile:
        """Blanket mixture of ``blanket.krr_given`` (exact per m)."""
        _check_profile_args(n, delta)
        return mixture(
            n - 1,
            self.blanket_mass,
            lambda m: krr_given(self.epsilon0, self.domain, m, delta),
            delta,
        )


def olh_collision(buckets: int, prime: int = OLH_PRIME) -> float:
    """κ = P(H(x0) = H(x1)) for H(x) = ((a·x + b) mod P) mod g, a ∈ [1, P), b ∈ [0, P)
    uniform, x0 ≠ x1 < P: (a·x0 + b, a·x1 + b) is uniform over the ordered pairs
    of distinct residues, so κ = Σ_c n_c(n_c − 1)/(P(P − 1)) with n_c the residues
    ≡ c mod g. Exact (integer arithmetic, one rounding)."""
    q, r = divmod(prime, buckets)
    same = r * (q + 1) * q + (buckets - r) * q * (q - 1)
    return same / (prime * (prime - 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalHashing:
    """OLH: a uniform hash H of the family above into g buckets, then g-ary RR on H(x)."""

    epsilon0: float
    buckets: int
    prime: int = OLH_PRIME

    def __post_init__(self) -> None:
        _check_epsilon(self.epsilon0)
        if isinstance(self.buckets, bool) or not isinstance(self.buckets, int) or self.buckets < 2:
            raise ValueError(f"buckets must be an integer ≥ 2, got {self.buckets!r}")
        if isinstance(self.prime, bool) or not isinstance(self.prime, int) or self.prime < 3:
            raise ValueError(f"prime must be an integer ≥ 3, got {self.prime!r}")

    @property
    def name(self) -> str:
        return f"OLH (g = {self.buckets})"

    @property
    def blanket_mass(self) -> float:
        """γ = g/(e^ε0 + g − 1): (H, y) with y uniform over the buckets, w.p. γ."""
        return self.buckets / (math.exp(self.epsilon0) + self.buckets - 1.0)

    def profile(self, n: int, delta: float) -> Profile:
        """δ(ε) ≤ (1 − κ)·Σ_K Bin(K; n−1, γ(1 − κ))·δ^{g-RR}_K(ε).

        Blanket W = (uniform H, uniform y): R(x) ≥ W/(e^ε0+g−1) pointwise, so
        γ = g/(e^ε0+g−1). Among the m+1 draws of δ_m, a draw whose hash collides
        on the victim's pair (H(x0) = H(x1), w.p. κ = ``olh_collision``) has
        g0 = g1, so (g0 − e^ε g1) ≤ 0 there and dropping it only raises the
        positive part. The K others are draws with y uniform given a
        non-colliding hash: exactly g-ary RR's blanket draws, so δ_m ≤
        E_K[(K/(m+1))·δ^{g-RR}_{K−1}] with K ~ Bin(m+1, 1−κ). Since
        Bin(K; m+1, 1−κ)·K/(m+1) = (1−κ)·Bin(K−1; m, 1−κ) and thinning a
        Bin(n−1, γ) by 1−κ gives Bin(n−1, γ(1−κ)), the sum above follows. The
        right side is (P′, Q′): the victim's hash collides w.p. κ (then P′ = Q′),
        else g-ary RR among the thinned cover — a pair of distributions, so it
        also dominates for composition.
        """
        _check_profile_args(n, delta)
        kappa = olh_collision(self.buckets, self.prime)
        return mixture(
            n - 1,
            self.blanket_mass * (1.0 - kappa),
            lambda m: krr_given(self.epsilon0, self.buckets, m, delta),
            delta,
            scale=1.0 - kappa,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BitVector:
    """Value x sets a set B_x of at most ``bits`` positions; every position of the
    report is 1 w.p. ``q`` if in B_x and ``p`` otherwise, independently (p < q)."""

    p: float
    q: float
    bits: int
    label: str = "bit vector"

    def __post_init__(self) -> None:
        for name in ("p", "q"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 < v < 1.0:
                raise ValueError(f"{name} must be in (0, 1), got {v!r}")
        if not self.p < self.q:
            raise ValueError(f"p must be below q, got p={self.p}, q={self.q}")
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or self.bits < 1:
            raise ValueError(f"bits must be a positive integer, got {self.bits!r}")

    @property
    def name(self) -> str:
        return self.label

    @property
    def epsilon0(self) -> float:
        """h·ln(q(1−p)/(p(1−q))): the largest ratio, B0's bits all 1 and B1's all 0."""
        return self.bits * (
            math.log(self.q) + math.log1p(-self.p) - math.log(self.p) - math.log1p(-self.q)
        )

    @property
    def blanket_mass(self) -> float:
        """γ = ((1−q)/(1−p))^h (``blanket.bit_vector_given``)."""
        return math.exp(self.bits * (math.log1p(-self.q) - math.log1p(-self.p)))

    def profile(self, n: int, delta: float) -> Profile | None:
        """Worst over the victim's set sizes (|B0|, |B1|) ∈ {1..h}² of the blanket
        mixture of ``blanket.bit_vector_given``; None for h > 2 (not implemented)
        and for h = 2 crowds whose two-bit laws are too large to enumerate (past
        about 10⁴ blanket draws; a cap at m would still be valid but loose)."""
        _check_profile_args(n, delta)
        if self.bits > 2:
            return None
        cap = None
        if self.bits == 2:
            cap = n - 1
            while cap > 0 and two_bit_points(cap + 1, self.p, delta) > _MAX_LAW_POINTS:
                cap = int(cap * 0.8)
            if cap < 0.5 * (n - 1) * self.blanket_mass:
                return None  # capped at under half its cover: not worth its cost
        sizes = [(a, b) for a in range(1, self.bits + 1) for b in range(1, self.bits + 1)]
        cache: dict[Any, Any] = {}

        def given(ab: tuple[int, int]) -> Callable[[int], Profile]:
            return lambda m: bit_vector_given(self.p, self.q, ab, m, delta, cache)

        parts = [mixture(n - 1, self.blanket_mass, given(ab), delta, max_m=cap) for ab in sizes]
        return parts[0] if len(parts) == 1 else Worst(tuple(parts))


Randomizer = KaryRR | LocalHashing | BitVector


def randomizer_of(
    basic: BasicParams | None = None,
    rappor: RapporParams | None = None,
    *,
    prr_only: bool = False,
) -> Randomizer | None:
    """The description of a metric's randomizer (one report; ``prr_only``: RAPPOR's
    PRR alone, what every memoised report post-processes), or None if unknown."""
    if basic is not None:
        if basic.mechanism in ("krr", "binary-rr"):
            return KaryRR(epsilon0=basic_epsilon(basic), domain=basic.domain_size)
        if basic.mechanism == "olh":
            return LocalHashing(epsilon0=basic_epsilon(basic), buckets=basic.olh_buckets)
        if basic.mechanism == "oue":
            return BitVector(p=basic.oue_q, q=0.5, bits=1, label="OUE")
        return None
    if rappor is not None:
        from crowdmix.core.privacy import p_star, q_star

        if prr_only:
            if rappor.f <= 0.0:
                return None
            return BitVector(
                p=rappor.f / 2.0, q=1.0 - rappor.f / 2.0, bits=rappor.h, label="RAPPOR PRR"
            )
        ps, qs = p_star(rappor), q_star(rappor)
        if not 0.0 < ps < qs < 1.0:
            return None
        return BitVector(p=ps, q=qs, bits=rappor.h, label="RAPPOR report")
    return None
