"""Central (ε, δ) of a shuffled histogram with fake reports. Pure math.

The mechanism (``crowdmix.core.histogram``): each device sends its value x (optionally
k-RR with local ε_L) and m slots, each filled w.p. q with a value uniform over d buckets;
the analyst sees the histogram of a batch's reports. Neighbours: one device's value
replaced, x vs x'. Cover: the reports of ``n_honest`` honest devices besides the target
in its batch (``histogram_crowd`` says how many); everything else — the target's own
fakes, dishonest devices' reports — is treated as known to the analyst.

Two proved bounds on δ(ε): ``fake_delta``, the honest fakes alone (exact for it), and,
with k-RR, ``histogram_blanket.blanket_delta``, which also counts the other devices' k-RR
noise and the target's own; ``histogram_delta`` takes the smaller of that and the older
(1 − γ)·fake_delta. The view is also ε_L-DP (post-processing of ε_L-LDP reports), so the
central ε is at most ε_L. Against a colluding shuffler + aggregator only ε_L holds (∞
without k-RR).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from crowdmix.aggregator.accounting.histogram_blanket import blanket_delta
from crowdmix.aggregator.accounting.histogram_crowd import dishonest_share, honest_others
from crowdmix.core.histogram import HistogramParams

__all__ = [
    "HistogramGuarantee",
    "central_epsilon",
    "fake_delta",
    "format_g_up",
    "format_up",
    "histogram_delta",
    "histogram_guarantee",
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


#: Cells of one (rows × terms) block of ``shift_delta``: bounds its memory, not its figure.
_BLOCK_CELLS = 1 << 18


def _terms(epsilon: float, t_max: int) -> int:
    """Terms summed per row of ``shift_delta`` (the rest is bounded and added anyway).

    Past a0 the terms shrink by e^-ε per step: after 46/ε of them the rest is below
    e^-46 ≈ 1e-20 of the first. They also follow Bin(t, ½), and a0 ≥ (t + 1)/2: after
    6√t + 40 of them the rest lies beyond t/2 + 6√t, where Bin(t, ½) has mass at most
    e^-72 ≈ 5e-32 (Hoeffding) — the cap that keeps small ε from needing ~t/2 terms.
    """
    by_epsilon = math.ceil(46.0 / max(epsilon, 1e-3))
    by_width = math.ceil(6.0 * math.sqrt(t_max)) + 40
    return max(8, min(by_epsilon, by_width))


def shift_delta(epsilon: float, t: Any) -> Any:
    """δ_t(ε) = D_{e^ε}(1 + Bin(t, ½) ‖ Bin(t, ½)) for an array of t (an upper bound).

    The likelihood ratio at a is B_t(a − 1)/B_t(a) = a/(t − a + 1), increasing in a, so with
    a0 the smallest a where it exceeds e^ε, δ_t(ε) = Σ_{a ≥ a0} B_t(a − 1)(1 − e^ε(t − a + 1)/a),
    non-negative terms: ``_terms`` of them are summed in log space and the rest bounded by
    Pr[Bin(t, ½) ≥ a0 + K − 1] and added. Rows go in blocks of at most ``_BLOCK_CELLS``
    cells (one row at least), so memory does not grow with the number of t.
    """
    import numpy as np

    t = np.atleast_1d(np.asarray(t, dtype=np.int64))
    e = math.exp(epsilon)
    # a0: smallest integer a with a > e^ε (t + 1)/(1 + e^ε); at most t + 1.
    a0 = np.minimum(np.floor(e * (t + 1) / (1.0 + e)).astype(np.int64) + 1, t + 1)
    k = int(min(_terms(epsilon, int(np.max(t))), int(np.max(t + 2 - a0))))
    rows = max(1, _BLOCK_CELLS // k)
    out = np.empty(t.shape, dtype=float)
    for start in range(0, t.size, rows):
        block = slice(start, start + rows)
        out[block] = _shift_block(e, t[block], a0[block], k)
    return out


def _shift_block(e: float, t: Any, a0: Any, k: int) -> Any:
    """``shift_delta`` for one block of rows, ``k`` terms each."""
    import numpy as np
    from scipy import special, stats

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
    """Upper bound on δ(ε) of e_x + F vs e_x' + F, F the honest devices' fakes; exact up to
    float margins. ``bucket_probability`` is s = q/d, one slot's chance of one bucket.

    Lemma. The N = n_honest·m slots are i.i.d. (empty w.p. 1 − q, bucket j w.p. s), so
    F ~ Multinomial(N; s, …, s, 1 − q), and for every ε

        D_{e^ε}(P ‖ Q) = D_{e^ε}(Q ‖ P) = Σ_t Pr[M = t]·δ_t(ε),   M ~ Bin(N, 2s),
        δ_t(ε) = D_{e^ε}(1 + Bin(t, ½) ‖ Bin(t, ½))   (``shift_delta``).

    Proof. (i) Given (H_x, H_x') the other buckets' law is the same under P and Q (it
    depends only on F_x + F_x'), so the histogram and (H_x, H_x') have equal divergences.
    (ii) Given M = F_x + F_x' = t (same law under P and Q), F_x ~ Bin(t, ½); with a = H_x
    less its known part, P gives a = 1 + F_x and Q gives a = F_x, and H_x' is fixed by t.
    Symmetry (swap x, x') gives the reverse direction. ∎ The binomial split is the clone
    device of Feldman, McMillan and Talwar (FOCS 2021). δ_t is non-increasing in t
    (Bin(t + 1, ½) is Bin(t, ½) plus a coin: a post-processing), so M's tails outside a
    window [lo, hi] are bounded by Pr[M < lo]·1 + Pr[M > hi]·δ_hi and added; pmfs from
    boost's ``binom.pmf`` (within ~1e-10 relative up to 4·10^9 trials; ``logpmf`` is not),
    the sum times (1 + 1e-9) plus 1e-300.
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


def _honest(n_honest: int) -> int:
    if isinstance(n_honest, bool) or not isinstance(n_honest, int) or n_honest < 0:
        raise ValueError(f"n_honest must be a non-negative integer, got {n_honest!r}")
    return n_honest


def histogram_delta(epsilon: float, params: HistogramParams, *, n_honest: int) -> float:
    """δ(ε) of the analyst's view with ``n_honest`` honest devices besides the target in
    its batch (an upper bound). 0 when ε ≥ ε_L (the view is then ε_L-DP outright).

    Without k-RR: ``fake_delta``. With it, the smaller of two proved bounds: the k-RR
    blanket (``histogram_blanket.blanket_delta``) and (1 − γ)·``fake_delta``,
    1 − γ = (e^ε_L − 1)/(e^ε_L + d − 1), which reveals whether the target's report is its
    value (w.p. 1 − γ) or a uniform draw (the same under x and x'; D_{e^ε} is jointly
    convex, Liese and Vajda 2006) and counts only the fakes.
    """
    _honest(n_honest)
    eps_l = params.local_epsilon
    if eps_l is not None and epsilon >= eps_l:
        return 0.0
    d = params.domain_size
    fakes = fake_delta(
        epsilon,
        n_honest=n_honest,
        fake_slots=params.fake_slots,
        bucket_probability=params.fake_probability / d,
    )
    if eps_l is None:
        return fakes
    em1 = math.expm1(eps_l)
    older = min(1.0, fakes * em1 / (em1 + d) * (1.0 + _FLOAT_MARGIN))
    blanket = blanket_delta(
        epsilon,
        n_honest=n_honest,
        domain_size=d,
        fake_slots=params.fake_slots,
        fake_probability=params.fake_probability,
        local_epsilon=eps_l,
    )
    return min(older, blanket)


def central_epsilon(params: HistogramParams, delta: float, *, n_honest: int) -> float:
    """Smallest ε (to a relative 1e-9, on the safe side) with δ(ε) ≤ ``delta``;
    ε_L when that is smaller, ``math.inf`` without k-RR if no ε up to 60 meets it."""
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    _honest(n_honest)
    cap = _EPS_MAX if params.local_epsilon is None else params.local_epsilon

    def excess(eps: float) -> float:
        """log δ(ε) − log δ: ≤ 0 exactly when ε meets the target."""
        got = histogram_delta(eps, params, n_honest=n_honest)
        return -math.inf if got <= 0.0 else math.log(got) - math.log(delta)

    f_hi = excess(cap)
    if f_hi > 0.0:
        return math.inf if params.local_epsilon is None else params.local_epsilon
    f_lo = excess(0.0)
    if f_lo <= 0.0:
        return 0.0
    return _smallest_root(excess, 0.0, cap, f_hi)


def _smallest_root(fn: Any, lo: float, hi: float, f_hi: float) -> float:
    """The root of a non-increasing ``fn`` bracketed by fn(lo) > 0 ≥ f_hi, returned on the safe
    side (fn ≤ 0) within a relative 1e-9: bisection until fn(hi) is finite (it is −∞ where
    δ = 0), then Brent's method, then up in steps of the tolerance until fn ≤ 0."""
    from scipy import optimize

    while not math.isfinite(f_hi) and hi - lo > _EPS_RTOL * hi:
        mid = 0.5 * (lo + hi)
        f_mid = fn(mid)
        if f_mid <= 0.0:
            hi, f_hi = mid, f_mid
        else:
            lo = mid
    if hi - lo <= _EPS_RTOL * hi:
        return hi
    tol = 0.25 * _EPS_RTOL * hi
    x = float(optimize.brentq(fn, lo, hi, xtol=tol, rtol=1e-15))
    x = min(hi, x + tol)
    while x < hi and fn(x) > 0.0:
        x = min(hi, x + tol)
    return x


@dataclass(frozen=True, slots=True, kw_only=True)
class HistogramGuarantee:
    """What one release of a shuffled histogram promises, and under which assumptions."""

    epsilon: float  # central, analyst not colluding with the shuffler
    delta: float
    local_epsilon: float  # shuffler + aggregator colluding (math.inf: none)
    n: int
    n_honest: int
    dishonest: int
    honest_fraction: float | None  # None: the dishonest count was given
    domain_size: int
    fake_slots: int
    fake_probability: float
    local_randomization: bool

    def to_dict(self) -> dict[str, object]:
        return {
            "encoding": "shuffled-histogram",
            "epsilon": self.epsilon if math.isfinite(self.epsilon) else None,
            "delta": self.delta,
            "local_epsilon": self.local_epsilon if math.isfinite(self.local_epsilon) else None,
            "n": self.n,
            "n_honest": self.n_honest,
            "dishonest_devices": self.dishonest,
            "honest_fraction": self.honest_fraction,
            "domain_size": self.domain_size,
            "fake_slots": self.fake_slots,
            "fake_probability": self.fake_probability,
            "bound": _BOUND_BLANKET if self.local_randomization else _BOUND_FAKES,
        }

    def render(self) -> str:
        central = format_up(self.epsilon) if math.isfinite(self.epsilon) else "∞ (no guarantee)"
        local = (
            f"{format_up(self.local_epsilon)}-LDP (k-RR)"
            if math.isfinite(self.local_epsilon)
            else "none (ε = ∞: the real value is among the device's reports)"
        )
        cover = "fakes and k-RR noise" if self.local_randomization else "fakes"
        return (
            f"central ε = {central}, δ = {format_g_up(self.delta, 6)} for the analyst "
            "(reports sealed, "
            f"shuffler not colluding), counting only the {cover} of {self.n_honest:,} honest "
            f"devices besides the target ({self.n:,} devices, {_dishonest_text(self)});"
            f"\n  shuffler + aggregator colluding: {local}"
        )


_BOUND_FAKES = "exact fake-report pair (crowdmix.aggregator.accounting.histogram)"
_BOUND_BLANKET = (
    "fake reports and k-RR blanket, exact given the cover count "
    "(crowdmix.aggregator.accounting.histogram_blanket)"
)


def _dishonest_text(g: HistogramGuarantee) -> str:
    if g.honest_fraction is None:
        return f"at most {g.dishonest:,} dishonest, all assumed beside the target"
    return (
        f"at most {g.dishonest:,} dishonest — honest fraction {g.honest_fraction:g} — "
        "all assumed beside the target"
    )


def histogram_guarantee(
    params: HistogramParams,
    n: int,
    delta: float,
    *,
    honest_fraction: float = 1.0,
    dishonest_devices: int | None = None,
) -> HistogramGuarantee:
    """Both figures of one batch of exactly n devices' reports, at most D of them
    dishonest (``dishonest_devices``, or D = ⌈(1 − h)·n⌉): n − 1 − D honest others
    (``histogram_crowd.honest_others``)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if dishonest_devices is None:
        dishonest, fraction = dishonest_share(n, honest_fraction), float(honest_fraction)
    else:
        dishonest, fraction = dishonest_devices, None
    n_honest = honest_others(n, dishonest)
    eps = central_epsilon(params, delta, n_honest=n_honest)
    return HistogramGuarantee(
        epsilon=eps,
        delta=delta,
        local_epsilon=params.local_epsilon if params.local_epsilon is not None else math.inf,
        n=n,
        n_honest=n_honest,
        dishonest=dishonest,
        honest_fraction=fraction,
        domain_size=params.domain_size,
        fake_slots=params.fake_slots,
        fake_probability=params.fake_probability,
        local_randomization=params.local_epsilon is not None,
    )
