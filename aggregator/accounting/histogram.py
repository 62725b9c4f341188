"""Central (ε, δ) of a shuffled histogram with fake reports. Pure math.

The mechanism (``crowdmix.core.histogram``): each of n devices sends its value x
(optionally k-RR with local ε_L) plus m slots, each filled independently
w.p. q with a value uniform over d buckets. The analyst sees the histogram H
of all reports (shuffled: no sender, no order).

Neighbouring datasets: one device's value replaced, x vs x' (n is public).

Assumptions (stated with every figure):

- At least ``n_honest`` devices *other than the target* follow the protocol
  (draw their fakes as specified, with a CSPRNG) and are not colluding with
  the analyst: ``n_honest = floor(honest_fraction·(n − 1))``. Everything
  else is treated as known to the analyst: the target's own fakes, the
  reports of dishonest or colluding devices, and the *real* reports of
  honest devices (their values and their k-RR coins) — none of it counted as
  cover, so the figure does not depend on the other devices' data.
- Reports are sealed and the shuffler does not collude with the analyst.

Lemma (exact reduction). Let F = (F_1..F_d) be the honest devices' fake
counts: the N = n_honest·m slots are i.i.d. categorical (empty w.p. 1 − q,
bucket j w.p. s = q/d), so F ~ Multinomial(N; s, ..., s, 1 − q). Without
local randomization the view is (known part) + e_x + F under P and
(known part) + e_x' + F under Q. Then, for every ε,

    D_{e^ε}(P ‖ Q) = D_{e^ε}(Q ‖ P) = Σ_t Pr[M = t] · δ_t(ε),
    M ~ Binomial(N, 2s)       (the honest fakes in buckets x and x'),
    δ_t(ε) = D_{e^ε}(1 + Bin(t, ½) ‖ Bin(t, ½)).

Proof. (i) Given (H_x, H_x'), the other buckets' conditional law is the same
under P and Q: it depends only on F_x + F_x' = H_x + H_x' − (known) − 1, and
F_rest | (F_x, F_x') is Multinomial over the remaining slots. So the full
histogram is a post-processing (same kernel under P and Q) of (H_x, H_x'),
and conversely (H_x, H_x') is a function of the histogram: the divergences
are equal. (ii) Given M = F_x + F_x' = t (the same law under P and Q), F_x ~ Bin(t, ½).
With a = H_x − (known part of bucket x), P gives a = 1 + F_x and Q gives
a = F_x, and H_x' is then fixed by t: the conditional pair is exactly
(1 + Bin(t, ½), Bin(t, ½)). Conditioning on the common M gives the
mixture. Symmetry (swap x, x') gives D(P‖Q) = D(Q‖P). ∎

δ_t in closed form. The likelihood ratio of 1 + Bin(t, ½) to Bin(t, ½) at a
is B_t(a − 1)/B_t(a) = a/(t − a + 1), increasing in a, so with a0 the smallest
a with a/(t − a + 1) > e^ε,

    δ_t(ε) = Σ_{a = a0}^{t+1} B_t(a − 1) · (1 − e^ε (t − a + 1)/a),

a sum of non-negative terms (no cancellation), evaluated in log space. For
a ≥ a0 the terms' B_t(a − 1) fall by a factor ≤ e^−ε per step, so only
``_TERMS(ε)`` terms are summed and the rest is bounded by Pr[Bin(t, ½) ≥ a0 + K − 1],
which is added. δ_t is non-increasing in t (Bin(t+1, ½) = Bin(t, ½) + an
independent coin: a post-processing), so M's tails outside a window
[lo, hi] are bounded by Pr[M < lo]·1 + Pr[M > hi]·δ_hi and added. The
result is an upper bound on δ(ε), multiplied by (1 + 1e-9) for float
rounding (binomial pmfs from scipy's ``binom.pmf``, within ~1e-10 relative
up to 4·10^9 trials; ``logpmf`` is not: its log-gamma differences are off by
up to ~1e-5 there), plus 1e-300 for terms that underflow. It is also
monotone in q, m and n_honest: M grows stochastically with each (a
coupling), and δ_t falls with t.

Local randomization. With k-RR the real report is, w.p. 1 − τ, the true
value and, w.p. τ = d/(e^ε_L + d − 1), uniform over the domain (the same
law under x and x'). Revealing which happened is a post-processing-superset
of the view; given "uniform" P = Q, given "true" the Lemma applies. So

    δ(ε) ≤ (1 − τ) · δ_fake(ε),     1 − τ = (e^ε_L − 1)/(e^ε_L + d − 1),

and the view is also ε_L-DP with δ = 0 (post-processing of ε_L-LDP reports):
the central ε is the smaller of the two. Against a colluding shuffler +
aggregator the target's reports are seen together: ε_L-LDP with k-RR (the
fakes are independent of x), no guarantee (ε = ∞) without.

Literature. The protocol family: Balcer and Cheu (ITC 2020, arXiv:1911.06879)
per-bucket fakes; Cheu and Zhilyaev (IEEE S&P 2022) fake users; Li et al.'s
DUMP (uniform dummy points). The binomial split of a two-bucket count
into Bin(t, ½) is the same device as the clone reduction of Feldman,
McMillan and Talwar (FOCS 2021) used in ``pairs.py``. The bound here does
not rely on any of their asymptotic theorems: it is the exact computation
proved above.

A valid *lower* bound for tests: ``exact_pair_delta`` (``tests``) enumerates
the full histogram on a small domain and must agree with this to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from crowdmix.core.histogram import HistogramParams

__all__ = [
    "HistogramGuarantee",
    "central_epsilon",
    "fake_delta",
    "format_g_up",
    "format_up",
    "histogram_delta",
    "histogram_guarantee",
    "honest_others",
    "shift_delta",
]

_WINDOW_TAIL = 1e-30  # M's mass left outside the window on each side (bounded, added)
_FLOAT_MARGIN = 1e-9  # relative margin for float rounding in the sums (pmf/sf within ~1e-10)
_ABS_MARGIN = 1e-300  # for pmf terms that underflow to 0 (each below the smallest normal)
_EPS_MAX = 60.0  # above this the view is treated as having no (ε, δ) guarantee
_EPS_RTOL = 1e-9


def format_up(x: float, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits, rounded *up* (a printed privacy
    figure is never below the computed one); "∞" for infinity."""
    if not math.isfinite(x):
        return "∞"
    if x <= 0.0:
        return "0"
    exp10 = math.floor(math.log10(x)) - digits + 1
    scaled = math.ceil(x / 10.0**exp10 * (1.0 - 1e-15))
    value = scaled * 10.0**exp10
    while value < x:  # float rounding in the division above
        scaled += 1
        value = scaled * 10.0**exp10
    return f"{value:.{max(0, -exp10)}f}" if exp10 < 0 else f"{value:.0f}"


def format_g_up(x: float, digits: int = 2) -> str:
    """``x`` in ``%g`` style to ``digits`` significant digits, rounded *up* (a printed δ
    is never below the one the figure holds for: ``f"{1.25e-6:.2g}"`` is "1.2e-06")."""
    if not math.isfinite(x):
        return "∞"
    text = f"{x:.{digits}g}"
    if x <= 0.0 or float(text) >= x:
        return text
    step = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    value = float(text)
    while float(text) < x:
        value += step
        text = f"{value:.{digits}g}"
    return text


def honest_others(n: int, honest_fraction: float) -> int:
    """Devices other than the target assumed honest: floor(honest_fraction·(n − 1))."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    h = honest_fraction
    if isinstance(h, bool) or not isinstance(h, int | float) or not 0.0 <= h <= 1.0:
        raise ValueError(f"honest_fraction must be in [0, 1], got {h!r}")
    return math.floor(h * (n - 1))


def _terms(epsilon: float) -> int:
    # Terms past a0 shrink by e^-ε per step: after K of them the rest is below
    # e^-46 ≈ 1e-20 of the first, and it is bounded and added anyway.
    return max(8, math.ceil(46.0 / max(epsilon, 1e-3)))


def shift_delta(epsilon: float, t: Any) -> Any:
    """δ_t(ε) = D_{e^ε}(1 + Bin(t, ½) ‖ Bin(t, ½)) for an array of t (upper bound, see above)."""
    import numpy as np
    from scipy import special, stats

    t = np.atleast_1d(np.asarray(t, dtype=np.int64))
    e = math.exp(epsilon)
    # a0: smallest integer a with a > e^ε (t + 1)/(1 + e^ε); at most t + 1.
    a0 = np.minimum(np.floor(e * (t + 1) / (1.0 + e)).astype(np.int64) + 1, t + 1)
    k = int(min(_terms(epsilon), int(np.max(t + 2 - a0))))
    steps = np.arange(k, dtype=np.int64)
    a = a0[:, None] + steps[None, :]  # (T, K)
    tt = np.broadcast_to(t[:, None], a.shape)
    valid = a <= tt + 1
    a_safe = np.where(valid, a, tt + 1)
    # binom.pmf (boost), not logpmf: logpmf's log-gamma differences lose ~1e-7 relative
    # at 10^8 trials, beyond the margin; a pmf that underflows is below 1e-300.
    with np.errstate(divide="ignore"):
        logb = np.log(stats.binom.pmf(a_safe - 1, tt, 0.5))
    ratio = e * (tt - a_safe + 1) / a_safe  # < 1 for a >= a0
    with np.errstate(divide="ignore"):
        logterm = logb + np.log1p(-np.minimum(ratio, 1.0))
    logterm = np.where(valid, logterm, -np.inf)
    head = np.exp(special.logsumexp(logterm, axis=1))
    # Terms from a0 + K on: each at most B_t(a − 1), so at most Pr[Bin(t, ½) >= a0 + K − 1].
    rest = stats.binom.sf(a0 + k - 2, t, 0.5)
    return np.minimum(head + rest, 1.0)


def _window(trials: int, prob: float) -> tuple[int, int]:
    """[lo, hi] holding all but ~_WINDOW_TAIL of Bin(trials, prob) on each side.

    Only a speed choice: whatever is left outside is bounded and added.
    (scipy's isf does not reach 1e-30, so the edges are searched on cdf/sf.)
    """
    from scipy import stats

    mu = trials * prob
    width = 12.0 * math.sqrt(mu) + 80.0
    hi = min(trials, math.ceil(mu + width))
    while hi < trials and stats.binom.sf(hi, trials, prob) > _WINDOW_TAIL:
        hi = min(trials, hi + math.ceil(width))
    lo = max(0, math.floor(mu - width))
    while lo > 0 and stats.binom.cdf(lo - 1, trials, prob) > _WINDOW_TAIL:
        lo = max(0, lo - math.ceil(width))
    return lo, hi


def fake_delta(
    epsilon: float, *, n_honest: int, fake_slots: int, bucket_probability: float
) -> float:
    """Upper bound on δ(ε) of e_x + F vs e_x' + F, F the honest fakes (the Lemma above).

    ``bucket_probability`` is s = q/d, the chance one slot lands in one given bucket.
    """
    import numpy as np
    from scipy import stats

    if not math.isfinite(epsilon) or epsilon < 0.0:
        raise ValueError(f"epsilon must be finite and non-negative, got {epsilon!r}")
    trials = n_honest * fake_slots
    s2 = min(1.0, 2.0 * bucket_probability)
    if trials == 0 or s2 == 0.0:
        return float(shift_delta(epsilon, [0])[0])  # = 1: nothing to hide among
    lo, hi = _window(trials, s2)
    t = np.arange(lo, hi + 1, dtype=np.int64)
    per_t = shift_delta(epsilon, t)
    # pmf, not exp(logpmf): the latter is off by up to ~1e-6 relative at 10^9 trials
    # (log-gamma cancellation), below the true δ; boost's pmf is within ~1e-10.
    pmf = stats.binom.pmf(t, trials, s2)
    inside = float(np.sum(pmf * per_t))
    below = float(stats.binom.cdf(lo - 1, trials, s2)) if lo > 0 else 0.0
    above = float(stats.binom.sf(hi, trials, s2)) * float(per_t[-1])
    return min(1.0, (inside + below + above) * (1.0 + _FLOAT_MARGIN) + _ABS_MARGIN)


def histogram_delta(
    epsilon: float, params: HistogramParams, n: int, *, honest_fraction: float = 1.0
) -> float:
    """δ(ε) of the analyst's view for ``params`` and n devices (an upper bound).

    0 when ε ≥ ε_L (the view is then ε_L-DP outright).
    """
    if params.local_epsilon is not None and epsilon >= params.local_epsilon:
        return 0.0
    delta = fake_delta(
        epsilon,
        n_honest=honest_others(n, honest_fraction),
        fake_slots=params.fake_slots,
        bucket_probability=params.fake_probability / params.domain_size,
    )
    if params.local_epsilon is not None:
        em1 = math.expm1(params.local_epsilon)
        delta *= em1 / (em1 + params.domain_size)  # 1 − τ
        delta = min(1.0, delta * (1.0 + _FLOAT_MARGIN))
    return delta


def central_epsilon(
    params: HistogramParams, n: int, delta: float, *, honest_fraction: float = 1.0
) -> float:
    """Smallest ε (rounded up) with δ(ε) ≤ ``delta``; ``math.inf`` if none up to 60."""
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    cap = _EPS_MAX if params.local_epsilon is None else params.local_epsilon

    def ok(eps: float) -> bool:
        return histogram_delta(eps, params, n, honest_fraction=honest_fraction) <= delta

    if not ok(cap):
        return math.inf if params.local_epsilon is None else params.local_epsilon
    if ok(0.0):
        return 0.0
    lo, hi = 0.0, cap
    # Find a bracket quickly from above (δ(ε) is non-increasing in ε).
    while hi > 1e-6 and ok(hi / 2.0):
        hi /= 2.0
    lo = hi / 2.0 if hi > 1e-6 else 0.0
    while hi - lo > _EPS_RTOL * hi:
        mid = 0.5 * (lo + hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi  # ok(hi) holds: the safe side


@dataclass(frozen=True, slots=True, kw_only=True)
class HistogramGuarantee:
    """What one release of a shuffled histogram promises, and under which assumptions."""

    epsilon: float  # central, analyst not colluding with the shuffler
    delta: float
    local_epsilon: float  # shuffler + aggregator colluding (math.inf: none)
    n: int
    n_honest: int
    honest_fraction: float
    domain_size: int
    fake_slots: int
    fake_probability: float

    def to_dict(self) -> dict[str, object]:
        return {
            "encoding": "shuffled-histogram",
            "epsilon": self.epsilon if math.isfinite(self.epsilon) else None,
            "delta": self.delta,
            "local_epsilon": self.local_epsilon if math.isfinite(self.local_epsilon) else None,
            "n": self.n,
            "n_honest": self.n_honest,
            "honest_fraction": self.honest_fraction,
            "domain_size": self.domain_size,
            "fake_slots": self.fake_slots,
            "fake_probability": self.fake_probability,
            "bound": "exact fake-report pair (crowdmix.aggregator.accounting.histogram)",
        }

    def render(self) -> str:
        central = format_up(self.epsilon) if math.isfinite(self.epsilon) else "∞ (no guarantee)"
        local = (
            f"{format_up(self.local_epsilon)}-LDP (k-RR)"
            if math.isfinite(self.local_epsilon)
            else "none (ε = ∞: the real value is among the device's reports)"
        )
        return (
            f"central ε = {central}, δ = {format_g_up(self.delta, 6)} for the analyst "
            "(reports sealed, "
            f"shuffler not colluding), counting only the fakes of {self.n_honest:,} honest "
            f"devices besides the target (honest fraction {self.honest_fraction:g} of "
            f"{self.n:,});\n  shuffler + aggregator colluding: {local}"
        )


def histogram_guarantee(
    params: HistogramParams, n: int, delta: float, *, honest_fraction: float = 1.0
) -> HistogramGuarantee:
    """Both figures of one release of n devices' reports."""
    eps = central_epsilon(params, n, delta, honest_fraction=honest_fraction)
    return HistogramGuarantee(
        epsilon=eps,
        delta=delta,
        local_epsilon=params.local_epsilon if params.local_epsilon is not None else math.inf,
        n=n,
        n_honest=honest_others(n, honest_fraction),
        honest_fraction=float(honest_fraction),
        domain_size=params.domain_size,
        fake_slots=params.fake_slots,
        fake_probability=params.fake_probability,
    )
