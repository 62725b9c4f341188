"""Amplification by shuffling: central (ε, δ) of one shuffled batch. Pure math.

One batch holds n reports, each from an ε0-LDP randomizer, shuffled (bounds and
citations in ``crowdmix.aggregator.accounting.pairs``): ``generic``, the stronger-clone
pair (Feldman, McMillan, Talwar SODA 2023; Wang et al., VLDB 2024, Lemma 4.4) evaluated
exactly, valid for any ε0-LDP randomizer; ``fmt21``, the clone pair (a looser
cross-check); ``fmt21-closed`` (Feldman, McMillan, Talwar, FOCS 2021, Thm 3.2):
ε ≤ ln(1 + (e^ε0−1)/(e^ε0+1)·(8·sqrt(e^ε0·ln(4/δ))/sqrt(n) + 8·e^ε0/n)), valid only when
ε0 ≤ ln(n/(16·ln(4/δ))). ``rappor`` is refused (``VARIATION_RATIO_REFUSAL``): the
variation-ratio pair is not a dominating pair for the shuffled mechanism.
ε is a root search on δ(ε), on the safe side (δ(ε) ≤ δ); ε0 with ``amplified = False``
when no bound beats it. ``best_amplification`` adds a known randomizer's blanket bound and
binary RR's own (``binary_rr``), and takes the smallest. ``shuffled_rr_lower_bound``: the
exact privacy of shuffled RR; every generic bound must be at least this.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal, get_args

from crowdmix.aggregator.accounting.pairs import (
    ClonePair,
    EvaluatedPair,
    check_shuffle_args,
    pmf_error,
    symmetric_hockey_lower,
)

if TYPE_CHECKING:
    from crowdmix.aggregator.accounting.blanket import Profile
    from crowdmix.aggregator.accounting.randomizers import Randomizer

__all__ = [
    "BOUNDS",
    "VARIATION_RATIO_REFUSAL",
    "AmplificationBound",
    "AmplificationResult",
    "BestBound",
    "amplify",
    "amplify_randomizer",
    "best_amplification",
    "best_within",
    "epsilon_from_pair",
    "epsilon_from_profile",
    "fmt21_closed_form",
    "shuffled_rr_lower_bound",
]

AmplificationBound = Literal["generic", "fmt21", "fmt21-closed"]
BOUNDS: tuple[str, ...] = get_args(AmplificationBound)

VARIATION_RATIO_REFUSAL = (
    "the RAPPOR-specific (p, beta, q) variation-ratio bound was removed: it is not a "
    "dominating pair for the shuffled mechanism and understates epsilon (e.g. shuffled "
    "5-ary RR, eps0 = 2, n = 100, delta = 1e-6 needs >= 1.1564, the bound gave 1.1353); "
    "use the generic bound, valid for every eps0-LDP randomizer"
)

# "amplified" means at least this relative gain over ε0.
AMPLIFIED_MARGIN = 1e-3
# Above this ε0 (clone probability < 1e-21) no bound is computed: ε0 is returned.
_NO_CLONES = 50.0
# Relative precision of the root search; the answer is rounded up, never down.
_XTOL = 1e-9
# The blanket's root search stops here (each step costs a whole mixture); rounded up.
_XTOL_PROFILE = 1e-6
# Relative float noise allowed in δ(ε) when reading a profile's monotonicity.
_MONOTONE_SLACK = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class AmplificationResult:
    """Central (ε, δ) of one shuffled batch of n reports of an ε0-LDP randomizer."""

    epsilon: float
    delta: float
    bound: str
    epsilon0: float
    n: int
    amplified: bool

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _result(eps: float, epsilon0: float, n: int, delta: float, bound: str) -> AmplificationResult:
    """``eps`` from ``bound``, or ε0 itself when ``eps`` is within AMPLIFIED_MARGIN of it:
    such a bound only trades δ for a sliver of ε."""
    amplified = eps < epsilon0 * (1.0 - AMPLIFIED_MARGIN)
    return AmplificationResult(
        epsilon=eps if amplified else epsilon0,
        delta=delta,
        bound=bound,
        epsilon0=epsilon0,
        n=n,
        amplified=amplified,
    )


_check = check_shuffle_args


def _safe_root(evaluated: EvaluatedPair | Profile, delta: float, upper: float) -> float:
    """Smallest ε in [0, upper] with δ(ε) ≤ δ, rounded up; ``upper`` if none is below."""
    from scipy.optimize import brentq

    if evaluated.delta(upper) > delta:
        return upper
    # Bracket by stepping down from ε0 rather than starting at ε = 0: cutoffs at
    # Bin(t, ½)'s exact median are where its tail function is slowest (~20× at n = 1e8).
    hi = upper
    while True:
        lo = hi / 4.0
        if lo < 1e-12 * max(upper, 1.0):
            return hi  # δ(hi) ≤ δ already: any ε this small is as good as 0
        if evaluated.delta(lo) > delta:
            break
        hi = lo
    log_target = math.log(delta)

    def gap(eps: float) -> float:
        return math.log(max(evaluated.delta(eps), 1e-300)) - log_target

    root = float(brentq(gap, lo, hi, xtol=1e-15, rtol=_XTOL))
    # brentq's estimate may sit just below the root: step up until δ(ε) ≤ δ holds.
    step = max(root * _XTOL, 1e-15)
    while root < hi and evaluated.delta(root) > delta:
        root = min(hi, root + step)
        step *= 2.0
    return root


def _lower_root(evaluated: EvaluatedPair, delta: float, upper: float) -> float:
    """Largest ε with a lower bound on δ(ε) above δ (the pair's sum less its float
    error), rounded down: an ε the pair certainly needs. Pairs only: a profile's δ
    charges its float error upward, so less its tail it is no lower bound."""
    if not isinstance(evaluated, EvaluatedPair):
        raise TypeError(f"a lower bound needs an EvaluatedPair, got {type(evaluated).__name__}")
    return _bisect_down(evaluated.delta_lower, delta, upper)


def _bisect_down(delta_lower: Callable[[float], float], delta: float, upper: float) -> float:
    """Largest ε in [0, upper] with ``delta_lower(ε)`` > δ, by bisection, rounded down."""
    lo, hi = 0.0, upper
    if delta_lower(0.0) <= delta:
        return 0.0
    while hi - lo > 1e-9 * max(lo, 1e-6):
        mid = 0.5 * (lo + hi)
        if delta_lower(mid) > delta:
            lo = mid
        else:
            hi = mid
    return lo


def epsilon_from_profile(profile: Profile, delta: float, upper: float) -> float:
    """Smallest ε ≤ ``upper`` with profile.delta(ε) ≤ δ, to relative 1e-6 and
    rounded up (``upper`` if none): the returned ε is always checked on the profile.

    A profile with a ``surrogate`` (one bin of a blanket mixture, cheap) gives the
    starting guess; the Illinois method then brackets the root in a few steps
    (each costs a whole mixture)."""
    if profile.delta(upper) > delta:
        return upper
    surrogate = getattr(profile, "surrogate", None)
    guess = upper / 4.0 if surrogate is None else _illinois(surrogate(), delta, upper, upper / 4)
    return _illinois(profile, delta, upper, guess)


def _illinois(profile: Profile, delta: float, upper: float, guess: float) -> float:
    """The root search of ``epsilon_from_profile`` from ``guess`` (δ(upper) ≤ δ)."""
    log_target = math.log(delta)

    def gap(eps: float) -> float:
        return math.log(max(profile.delta(eps), 1e-300)) - log_target

    if gap(upper) > 0.0:
        return upper
    guess = min(max(guess, 1e-12), upper)
    b, fb = min(upper, guess * 1.01), 0.0
    fb = gap(b)
    while fb > 0.0:  # b must satisfy δ(b) ≤ δ
        b = min(upper, b * 1.25)
        fb = gap(b)
    a = min(guess * 0.99, b * 0.99)
    fa = gap(a)
    while fa <= 0.0:  # a must not
        b, fb = a, fa
        a *= 0.8
        if a < 1e-12 * max(upper, 1.0):
            return b  # δ(b) ≤ δ already: any ε this small is as good as 0
        fa = gap(a)
    side = 0
    while b - a > _XTOL_PROFILE * b:
        c = b - fb * (b - a) / (fb - fa) if fb != fa else 0.5 * (a + b)
        c = min(max(c, a + 1e-3 * (b - a)), b - 1e-3 * (b - a))
        fc = gap(c)
        if fc > 0.0:
            a, fa = c, fc
            if side == -1:
                fb *= 0.5
            side = -1
        else:
            b, fb = c, fc
            if side == 1:
                fa *= 0.5
            side = 1
    return b


def amplify_randomizer(randomizer: Randomizer, n: int, delta: float) -> AmplificationResult:
    """Central (ε, δ) of n shuffled reports of a known randomizer by its blanket
    bound (``randomizers``, ``blanket``); ``bound = "none"`` where none is
    implemented, with ε = ε0. Results are cached (the randomizers are frozen)."""
    _check(randomizer.epsilon0, n, delta)
    return _amplify_randomizer(randomizer, n, float(delta))


@lru_cache(maxsize=256)
def _amplify_randomizer(randomizer: Randomizer, n: int, delta: float) -> AmplificationResult:
    eps0 = randomizer.epsilon0
    profile = None if eps0 > _NO_CLONES else _profile(randomizer, n, delta)
    return _blanket_result(randomizer, n, delta, profile)


_PROFILES = threading.local()
_KEPT_PROFILES = 4  # a profile's built bins can hold ~16 MB of laws


def _profile(randomizer: Randomizer, n: int, delta: float) -> Profile | None:
    """``randomizer.profile(n, delta)``, kept for the last few (randomizer, n, δ) of
    this thread: ``best_within`` reads one profile at many targets and the root
    search reads it again, and a profile keeps the bins it has built. Reading a
    kept profile gives the same floats as a fresh one; per thread because an
    ``EvaluatedPair`` keeps a cache that one thread may use at a time."""
    kept: OrderedDict[tuple[Randomizer, int, float], Profile | None] | None
    kept = getattr(_PROFILES, "kept", None)
    if kept is None:
        kept = _PROFILES.kept = OrderedDict()
    key = (randomizer, n, delta)
    if key in kept:
        kept.move_to_end(key)
        return kept[key]
    profile = kept[key] = randomizer.profile(n, delta)
    while len(kept) > _KEPT_PROFILES:
        kept.popitem(last=False)
    return profile


def _blanket_result(
    randomizer: Randomizer, n: int, delta: float, profile: Profile | None
) -> AmplificationResult:
    eps0 = randomizer.epsilon0
    eps = eps0 if profile is None else epsilon_from_profile(profile, delta, eps0)
    return _result(eps, eps0, n, delta, "blanket" if profile is not None else "none")


@dataclass(frozen=True, slots=True, kw_only=True)
class BestBound:
    """The smallest valid figure for one shuffled batch and every bound tried."""

    result: AmplificationResult
    candidates: dict[str, float]


def best_amplification(
    epsilon0: float, n: int, delta: float, randomizer: Randomizer | None = None
) -> BestBound:
    """The one place that picks the bound: the generic stronger clone (any
    ε0-LDP randomizer) and, when the randomizer is known and ε0 is its ε0, its
    blanket bound and, for binary RR, ``binary_rr``'s bound over every data set;
    the smallest ε wins (all are proved upper bounds)."""
    generic = amplify(epsilon0, n, delta, bound="generic")
    cands = {"generic": generic.epsilon}
    best = generic
    if randomizer is not None and epsilon0 > 0.0:
        if not math.isclose(randomizer.epsilon0, epsilon0, rel_tol=1e-9):
            raise ValueError(
                f"randomizer {randomizer.name} has ε0 = {randomizer.epsilon0}, not {epsilon0}"
            )
        specific = amplify_randomizer(randomizer, n, delta)
        if specific.bound == "blanket":
            cands["blanket"] = specific.epsilon
            if specific.epsilon < best.epsilon:
                best = specific
        binary = _binary_rr(randomizer, n, delta)
        if binary is not None:
            cands["binary-rr"] = binary.epsilon
            if binary.epsilon < best.epsilon:
                best = binary
    return BestBound(result=best, candidates=cands)


def _binary_rr(randomizer: Randomizer, n: int, delta: float) -> AmplificationResult | None:
    """``binary_rr.binary_rr_epsilon`` as a result, for binary RR (k-ary RR with
    k = 2) only; None for every other randomizer."""
    from crowdmix.aggregator.accounting.binary_rr import binary_rr_epsilon
    from crowdmix.aggregator.accounting.randomizers import KaryRR

    if not isinstance(randomizer, KaryRR) or randomizer.domain != 2:
        return None
    eps0 = randomizer.epsilon0
    return _result(binary_rr_epsilon(eps0, n, float(delta)), eps0, n, float(delta), "binary-rr")


@lru_cache(maxsize=1024)
def best_within(
    epsilon0: float, n: int, delta: float, target: float, randomizer: Randomizer | None = None
) -> bool:
    """Whether ``best_amplification(epsilon0, n, delta, randomizer).result.epsilon``
    is at most ``target``: the same answer, mostly without its root search.

    The generic bound is cheap and decides first. Else the blanket profile is
    read at ``target``: δ(ε) does not increase with ε and the root search returns
    an ε with δ(ε) ≤ δ, so δ(target) > δ means the blanket's ε is above target
    (``blanket.exceeds`` builds the heaviest bins first: often they suffice); and
    δ(target·(1 − 3·_XTOL_PROFILE)) ≤ δ means the search's bracket [a, b] (δ(a) > δ,
    b − a ≤ _XTOL_PROFILE·b) ends with b < target. Float margins keep both sides
    strict; anything in between runs the search itself. Binary RR's own bound
    (``binary_rr``, cached) decides first where it applies. Cached."""
    from crowdmix.aggregator.accounting.blanket import exceeds

    if amplify(epsilon0, n, delta).epsilon <= target:
        return True
    if randomizer is None or epsilon0 <= 0.0:
        return False
    if not math.isclose(randomizer.epsilon0, epsilon0, rel_tol=1e-9):
        raise ValueError(
            f"randomizer {randomizer.name} has ε0 = {randomizer.epsilon0}, not {epsilon0}"
        )
    binary = _binary_rr(randomizer, n, float(delta))
    if binary is not None and binary.epsilon <= target:
        return True  # else the smallest is the blanket's or the generic's: as below
    eps0 = randomizer.epsilon0
    if eps0 > _NO_CLONES:
        return False  # no blanket bound: the generic one stands, above target
    edge = target >= eps0 * (1.0 - AMPLIFIED_MARGIN) * (1.0 - 1e-5) or target < 1e-9 * eps0
    if edge:  # "no amplification" rounding or a vanishing target: decide in full
        return best_amplification(epsilon0, n, delta, randomizer).result.epsilon <= target
    profile = _profile(randomizer, n, float(delta))
    if profile is None:
        return False
    if exceeds(profile, target, delta * (1.0 + _MONOTONE_SLACK)):
        return False
    if profile.delta(target * (1.0 - 3.0 * _XTOL_PROFILE)) <= delta * (1.0 - _MONOTONE_SLACK):
        return True
    return _blanket_result(randomizer, n, float(delta), profile).epsilon <= target


def epsilon_from_pair(pair: ClonePair, n: int, delta: float, upper: float) -> float:
    """ε of n shuffled reports dominated by ``pair``, capped at ``upper`` (= ε0)."""
    return _safe_root(pair.evaluate(n, delta), delta, upper)


def fmt21_closed_form(epsilon0: float, n: int, delta: float) -> float | None:
    """FMT21's closed form, or None outside its regime ε0 ≤ ln(n/(16 ln(4/δ)))."""
    _check(epsilon0, n, delta)
    log4d = math.log(4.0 / delta)
    if n <= 16.0 * log4d or epsilon0 > math.log(n / (16.0 * log4d)):
        return None
    e = math.exp(epsilon0)
    inner = 8.0 * math.sqrt(e * log4d) / math.sqrt(n) + 8.0 * e / n
    return math.log1p(math.tanh(epsilon0 / 2.0) * inner)


def amplify(
    epsilon0: float,
    n: int,
    delta: float,
    *,
    bound: str = "generic",
) -> AmplificationResult:
    """Central (ε, δ) after shuffling n reports of an ε0-LDP randomizer (cached)."""
    _check(epsilon0, n, delta)
    if bound == "rappor":
        raise ValueError(VARIATION_RATIO_REFUSAL)
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {', '.join(BOUNDS)}, got {bound!r}")
    return _amplify(float(epsilon0), n, float(delta), bound)


@lru_cache(maxsize=1024)
def _amplify(epsilon0: float, n: int, delta: float, bound: str) -> AmplificationResult:
    eps: float = epsilon0
    if epsilon0 == 0.0:
        eps = 0.0
    elif epsilon0 > _NO_CLONES:
        eps = epsilon0  # clone probability ~e^−ε0: nothing to hide among; ε0 itself is valid
    elif bound == "fmt21-closed":
        closed = fmt21_closed_form(epsilon0, n, delta)
        eps = epsilon0 if closed is None else min(epsilon0, closed)
    else:
        if bound == "generic":
            pair = ClonePair.stronger_clone(epsilon0)
        else:
            pair = ClonePair.clones_fmt21(epsilon0)
        eps = epsilon_from_pair(pair, n, delta, epsilon0)
    return _result(eps, epsilon0, n, delta, bound)


def _binary_rr_counts(epsilon0: float, n: int, lo: int, hi: int) -> tuple[Any, Any, float]:
    """Shuffled binary RR, others all holding 0: the probabilities of k = lo..hi ones
    with the victim holding 0 (p) and 1 (q), and their relative float error (``pmf_error``
    of the weights), for ``symmetric_hockey_lower``."""
    import numpy as np
    from scipy import stats

    flip = 1.0 / (math.exp(epsilon0) + 1.0)
    k = np.arange(lo, hi + 1, dtype=np.float64)
    base = np.exp(stats.binom.logpmf(k, n - 1, flip))  # others' count of ones
    shifted = np.exp(stats.binom.logpmf(k - 1.0, n - 1, flip))  # count k−1
    p = (1.0 - flip) * base + flip * shifted  # victim holds 0
    q = flip * base + (1.0 - flip) * shifted  # victim holds 1
    return p, q, pmf_error(max(n - 1, 1), flip) + 8.0 * math.ulp(1.0)


def shuffled_rr_lower_bound(epsilon0: float, n: int, delta: float, *, domain: int = 3) -> float:
    """ε that shuffled randomized response (a real ε0-LDP mechanism) needs, rounded down.

    ``domain=3``: k-ary RR over {0, 1, 2}, the victim holding 0 or 1 and every
    other user 2. Its shuffled output is exactly the counts (N0, N1) of a
    clone pair with p = e^ε0, α = r = 1/(e^ε0+2), so pairs.py evaluates it
    exactly (0.11702 at ε0 = 4, n = 1e5, δ = 1e-6; the stronger clone gives
    0.11815). ``domain=2``: binary RR with every other user holding 0 (weaker:
    0.0847 there; summed over all n+1 counts, so for n up to a few million).
    No correct generic bound is below either.
    """
    _check(epsilon0, n, delta)
    if domain not in (2, 3):
        raise ValueError(f"domain must be 2 or 3, got {domain!r}")
    if epsilon0 == 0.0:
        return 0.0
    if domain == 3:
        e = math.exp(epsilon0)
        pair = ClonePair(p=e, alpha=1.0 / (e + 2.0), r=1.0 / (e + 2.0))
        return _lower_root(pair.evaluate(n, delta), delta, epsilon0)
    # max(D(P‖Q), D(Q‖P)) from below: each side's positive terms less their float error
    # (pmf_error of the weights, times the magnitudes p + e·q summed there).
    p, q, rel = _binary_rr_counts(epsilon0, n, 0, n)
    return _bisect_down(
        lambda eps: symmetric_hockey_lower(p, q, math.exp(eps), rel), delta, epsilon0
    )
