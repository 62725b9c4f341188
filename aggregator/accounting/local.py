"""Local (per-client) privacy of one client's reports: pure math, no state.

RAPPOR (Erlingsson, Pihur, Korolova, CCS 2014; p*, q*, ε_1, ε_∞ in ``crowdmix.core.privacy``):
``epsilon_k``, k reports over one memoised PRR: with R(x) = ((1−f/2)x + f/2)/((f/2)x +
1−f/2), ε_k = h·[ln R((q/p)^k) − ln R(((1−q)/(1−p))^k)] (computed in log space);
``total_variation``, β of one report for the worst pair (disjoint Bloom bits):
β = ½ Σ_{j1,j2} |B(j1;h,q*)B(j2;h,p*) − B(j1;h,p*)B(j2;h,q*)|;
``prr_total_variation``, the same sum with p* → f/2, q* → 1 − f/2.
Basic mechanisms (Wang, Blocki, Li, Jha, USENIX Security 2017): ε as configured; β is
(e^ε−1)/(e^ε+1) generic, (e^ε−1)/(e^ε+d−1) for k-RR, ½·tanh(ε/2) for OUE, and
≤ (e^ε−1)/(e^ε+g−1) for OLH; a heavy-hitter round's ε is what its keep probability
realises, never above the configured (``round_epsilon``). β parametrises the
variation-ratio bound (Wang et al., VLDB 2024). Derivations: docs/design.md,
"Aggregator: accounting", local privacy.
"""

from __future__ import annotations

import math
from typing import Any

from crowdmix.core.basic import BasicParams
from crowdmix.core.discovery import PrefixRound, ValueRound
from crowdmix.core.params import RapporParams
from crowdmix.core.privacy import epsilon_inf, epsilon_one, p_star, q_star

__all__ = [
    "basic_epsilon",
    "basic_total_variation",
    "epsilon_inf",
    "epsilon_k",
    "epsilon_one",
    "generic_total_variation",
    "prr_total_variation",
    "realised_epsilon",
    "round_epsilon",
    "total_variation",
]


def _log_r(f: float, log_x: float) -> float:
    """ln R(e^log_x) with R(x) = ((1-f/2)x + f/2) / ((f/2)x + 1-f/2).

    Written with e^{-|log_x|} ≤ 1 so a huge k·ln(q/p) never cancels against itself.
    """
    if f == 0.0:  # no PRR: R(x) = x
        return log_x
    keep, flip = 1.0 - f / 2.0, f / 2.0
    if log_x >= 0.0:
        small = math.exp(-log_x)
        return math.log(keep + flip * small) - math.log(flip + keep * small)
    small = math.exp(log_x)
    return math.log(keep * small + flip) - math.log(flip * small + keep)


def epsilon_k(params: RapporParams, k: int) -> float:
    """ε_k: the LDP level of k reports of one value over one memoised PRR.

    ``k`` = 0 gives 0; inf when p = 0 or q = 1 and f = 0 (the IRR then reveals bits).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    if k == 0:
        return 0.0
    p, q, f = params.p, params.q, params.f
    if p <= 0.0 or q >= 1.0:
        # (q/p)^k or ((1-q)/(1-p))^k is infinite/zero: R saturates at its PRR limit.
        if f <= 0.0:
            return math.inf
        up = math.log1p(-f / 2) - math.log(f / 2) if p <= 0.0 else None
        down = math.log(f / 2) - math.log1p(-f / 2) if q >= 1.0 else None
        if up is None:
            up = _log_r(f, k * (math.log(q) - math.log(p)))
        if down is None:
            down = _log_r(f, k * (math.log1p(-q) - math.log1p(-p)))
        return min(params.h * (up - down), epsilon_inf(params))
    up = _log_r(f, k * (math.log(q) - math.log(p)))
    down = _log_r(f, k * (math.log1p(-q) - math.log1p(-p)))
    # R maps into [(f/2)/(1-f/2), (1-f/2)/(f/2)], so ε_k ≤ ε_∞ exactly; clip the
    # last-ulp rounding of the log-space sums (and keep ε_k ≥ ε_1 the same way: k ≥ 1
    # reports reveal at least one does, so rounding may never put ε_k below ε_1).
    return max(min(params.h * (up - down), epsilon_inf(params)), epsilon_one(params))


def _binom_pmf(n: int, p: float) -> list[float]:
    return [math.comb(n, j) * p**j * (1.0 - p) ** (n - j) for j in range(n + 1)]


def _tv_disjoint(h: int, ps: float, qs: float) -> float:
    b_q, b_p = _binom_pmf(h, qs), _binom_pmf(h, ps)
    total = 0.0
    for j1 in range(h + 1):
        for j2 in range(h + 1):
            total += abs(b_q[j1] * b_p[j2] - b_p[j1] * b_q[j2])
    return min(1.0, 0.5 * total)


def total_variation(params: RapporParams) -> float:
    """β: exact TV distance between one report's distributions, worst-case values."""
    return _tv_disjoint(params.h, p_star(params), q_star(params))


def prr_total_variation(params: RapporParams) -> float:
    """β of the PRR alone (bit kept w.p. 1 − f/2), worst-case values; 1 when f = 0."""
    if params.f == 0.0:
        return 1.0
    return _tv_disjoint(params.h, params.f / 2.0, 1.0 - params.f / 2.0)


def generic_total_variation(epsilon: float) -> float:
    """β = (e^ε−1)/(e^ε+1): the largest TV distance any ε-LDP randomizer can have."""
    if epsilon == math.inf:
        return 1.0
    return math.tanh(epsilon / 2.0)


def basic_epsilon(params: BasicParams) -> float:
    """ε of one report of a basic mechanism, as the devices realise it: the configured ε,
    or more where the float probabilities the SDKs draw with exactly give more.

    The encoders draw Bernoulli(p) exactly for the float p they compute (k-RR, binary RR
    and OLH: keep = e^ε/(e^ε+n−1); OUE: q = 1/(e^ε+1)), so the mechanism's ε is
    ln(keep·(n−1)/(1−keep)), resp. ln((1−q)/q), of that float: up to ~1e-12 above ε. It is
    taken one ulp toward the larger ε (an SDK whose exp differs by an ulp is covered),
    evaluated on exact rationals and rounded up.
    """
    from fractions import Fraction

    if params.mechanism == "oue":
        q = Fraction(math.nextafter(params.oue_q, 0.0))
        return max(params.epsilon, _log_up((1 - q) / q))
    n = params.olh_buckets if params.mechanism == "olh" else params.domain_size
    return realised_epsilon(params.keep_probability, n, params.epsilon)


def realised_epsilon(keep: float, n: int, configured: float) -> float:
    """ε of n-ary randomized response that keeps the value w.p. the float ``keep`` (and
    moves to each other value w.p. (1 − keep)/(n − 1)), one ulp toward the larger ε,
    rounded up; never below ``configured`` (``basic_epsilon``)."""
    from fractions import Fraction

    up = Fraction(math.nextafter(keep, 1.0))
    if up >= 1:
        return math.inf
    return max(configured, _log_up(up * (n - 1) / (1 - up)))


def round_epsilon(params: PrefixRound | ValueRound) -> float:
    """ε0 of one report of a heavy-hitter round as the devices realise it: n-ary RR (n = g
    buckets, or C + 1 cells) keeping the value w.p. exactly the float
    ``params.keep_probability``, ln(keep·(n−1)/(1−keep)) on exact rationals, rounded up.
    That keep is proved at most e^ε/(e^ε + n − 1) (``core.discovery.keep_probability``:
    the same integers in every SDK), so the realised ε is at most the configured one and
    the charge is capped there; the rounding up alone could otherwise cross it."""
    from fractions import Fraction

    n = params.buckets if isinstance(params, PrefixRound) else params.cells
    keep = Fraction(params.keep_probability)
    return min(params.epsilon, _log_up(keep * (n - 1) / (1 - keep)))


def _log_up(ratio: Any) -> float:
    """ln of a positive Fraction, rounded up (float(ratio) is within half an ulp)."""
    x = math.log(float(ratio))
    return math.nextafter(x + 4e-16 * max(1.0, abs(x)), math.inf)


def basic_total_variation(params: BasicParams) -> float:
    """β of a basic mechanism: exact for k-RR and OUE, an upper bound for OLH."""
    e = math.exp(params.epsilon)
    if params.mechanism in ("krr", "binary-rr"):
        return (e - 1.0) / (e + params.domain_size - 1.0)
    if params.mechanism == "oue":
        return 0.5 * math.tanh(params.epsilon / 2.0)
    if params.mechanism == "olh":
        return (e - 1.0) / (e + params.olh_buckets - 1.0)
    return generic_total_variation(params.epsilon)
