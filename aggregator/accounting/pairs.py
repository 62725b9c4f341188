"""Dominating pairs for amplification by shuffling, evaluated exactly: pure math.

n shuffled reports of an ε0-LDP randomizer reduce to one pair (P, Q) over two counts
(N0, N1): under P the victim lands in bucket 0 w.p. p·α, bucket 1 w.p. α, neither w.p.
γ = 1 − α(1+p) (Q swaps the buckets); each of the n−1 other users is a clone in bucket 0
or 1 w.p. r each. The shuffled output is a post-processing of (N0, N1), so (P, Q)
dominates it. Stronger clone (generic): p = e^ε0, α = r = 1/(e^ε0+1) (Feldman, McMillan,
Talwar, SODA 2023; proved for any ε0-LDP randomizer by Wang et al., VLDB 2024, Lemma 4.4).
Clones: p = e^ε0, α = 1/(e^ε0+1), r = e^−ε0/2 (Feldman, McMillan, Talwar, FOCS 2021,
Thm 3.1). The (p, β, q) variation-ratio pair of Wang et al. is not used: it is not a
dominating pair for shuffled k-RR (d ≥ 4), OUE or PRR. The hockey-stick divergence is a
closed sum over t = N0 + N1 with one cutoff per t, plus the mass outside the window and
the float error (``pmf_error`` times the terms' magnitudes; off for a lower bound).
Derivation and the counterexample: docs/design.md, "Aggregator: accounting", pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FLOAT_SLACK",
    "ClonePair",
    "EvaluatedPair",
    "binom_logpmf",
    "binom_window",
    "check_shuffle_args",
    "half_tail_error",
    "pmf_error",
    "symmetric_hockey_lower",
]

# C's window covers all but TAIL_FRACTION·δ of its mass; that mass is added to δ.
TAIL_FRACTION = 1e-6
# The least relative float error charged on any computed probability.
FLOAT_SLACK = 1e-9
_ULP = math.ulp(1.0)


def pmf_error(draws: int, p: float) -> float:
    """A bound on the relative error of a Bin(draws, p) probability or tail from scipy
    (log-gamma terms and k·log p, each within a few ulps of magnitude ≤ draws·(ln(draws
    + 2) + |ln p| + |ln(1 − p)|); the incomplete beta of a tail likewise): 16 ulps of
    that sum, and never below ``FLOAT_SLACK``."""
    size = draws * (math.log(draws + 2.0) + abs(math.log(p)) + abs(math.log1p(-p))) + 10.0
    return max(FLOAT_SLACK, 16.0 * _ULP * size)


def binom_logpmf(k: Any, n: Any, p: float) -> Any:
    """ln Bin(k; n, p) for integer-valued k (float array) and n, −inf outside 0 ≤ k ≤ n:
    the log-gamma terms ``scipy.stats.binom.logpmf`` sums, bit for bit (the error
    ``pmf_error`` bounds), without its per-call argument checks, which cost more
    than the terms on the small windows the blanket bounds use."""
    import numpy as np
    from scipy import special

    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # outside the support: replaced below
        combiln = special.gammaln(n + 1) - (special.gammaln(k + 1) + special.gammaln(n - k + 1))
        out = combiln + special.xlogy(k, p) + special.xlog1py(n - k, -p)
    outside = (k < 0.0) | (k > n)
    return np.where(outside, -np.inf, out) if outside.any() else out


def symmetric_hockey_lower(p: Any, q: Any, e: float, rel: float) -> float:
    """max(D_e(P‖Q), D_e(Q‖P)) of two laws on one grid (numpy arrays), from below: each
    side's positive terms less ``rel`` (their float error) times their magnitudes."""
    sides = []
    for a, b in ((p, q), (q, p)):
        diff = a - e * b
        on = diff > 0.0
        sides.append(float(diff[on].sum()) - rel * float((a[on] + e * b[on]).sum()))
    return max(sides)


def half_tail_error(draws: int) -> float:
    """A bound on the relative error of scipy's Bin(t, ½) tail and pmf for t ≤ ``draws``
    (an incomplete beta, not a sum of log-gammas): 64 ulps of √draws + 10, about 20×
    what 35-digit values show at 10⁶ (6.6e-13) and 10⁹ (2.4e-11)."""
    return 64.0 * _ULP * (math.sqrt(draws) + 10.0)


def binom_window(n: int, p: float, tail: float) -> tuple[int, int]:
    """[lo, hi] with P(Bin(n, p) ∉ [lo, hi]) ≤ ``tail``, by the Chernoff bound
    P(X ≥ k) ≤ exp(−n·KL(k/n ‖ p)) on each side (scipy's ppf/isf fail for tails
    below ~1e-16 and return the whole range). Callers still measure the exact
    mass left out, so this only sets speed."""
    if n == 0 or p <= 0.0:
        return 0, 0
    if p >= 1.0:
        return n, n
    need = math.log(2.0 / tail)

    def kl(k: int) -> float:
        a = k / n
        out = 0.0
        if a > 0.0:
            out += a * math.log(a / p)
        if a < 1.0:
            out += (1.0 - a) * math.log((1.0 - a) / (1.0 - p))
        return n * out

    mean = n * p
    lo_in, lo_out = math.floor(mean), -1  # kl(lo_in) < need (or lo_in = mean)
    while lo_in - lo_out > 1:
        mid = (lo_in + lo_out) // 2
        if kl(mid) >= need:
            lo_out = mid
        else:
            lo_in = mid
    hi_in, hi_out = math.ceil(mean), n + 1
    while hi_out - hi_in > 1:
        mid = (hi_in + hi_out) // 2
        if kl(mid) >= need:
            hi_out = mid
        else:
            hi_in = mid
    return max(0, lo_out), min(n, hi_out)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClonePair:
    """The (P, Q) pair above: victim ratio ``p`` > 1, victim weight ``alpha``,
    clone probability ``r`` per bucket."""

    p: float
    alpha: float
    r: float

    def __post_init__(self) -> None:
        for name in ("p", "alpha", "r"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if self.p <= 1.0:
            raise ValueError(f"p must exceed 1, got {self.p!r}")
        if self.alpha <= 0.0 or self.alpha * (1.0 + self.p) > 1.0 + 1e-12:
            raise ValueError(f"alpha must be in (0, 1/(1+p)], got {self.alpha!r}")
        if not 0.0 < self.r <= 0.5:
            raise ValueError(f"r must be in (0, 1/2], got {self.r!r}")
        if self.r == 0.5 and self.gamma > 0.0:
            raise ValueError("r = 1/2 requires a victim that always lands in a bucket")

    @classmethod
    def stronger_clone(cls, epsilon0: float) -> ClonePair:
        """Generic pair for any ε0-LDP randomizer (FMT23; Wang et al. 2024, Lemma 4.4)."""
        e = math.exp(epsilon0)
        return cls(p=e, alpha=1.0 / (e + 1.0), r=1.0 / (e + 1.0))

    @classmethod
    def clones_fmt21(cls, epsilon0: float) -> ClonePair:
        """FMT21 'hiding among the clones' pair: clones w.p. e^−ε0."""
        e = math.exp(epsilon0)
        return cls(p=e, alpha=1.0 / (e + 1.0), r=0.5 / e)

    @property
    def gamma(self) -> float:
        """P(victim lands in neither bucket); 0 within float rounding of α(1+p) = 1."""
        g = 1.0 - self.alpha * (1.0 + self.p)
        return g if g > 1e-12 else 0.0

    def evaluate(self, n: int, delta: float, *, tail: float | None = None) -> EvaluatedPair:
        """Prepare the exact δ(ε) of n shuffled reports; C's window leaves out at
        most ``tail`` of its mass (default TAIL_FRACTION·δ), charged to δ."""
        return EvaluatedPair(self, n, delta, tail=tail)


class EvaluatedPair:
    """δ(ε) for one pair and n, with C's window and weights computed once.

    Keeps a cache between calls, so one instance serves one thread."""

    __slots__ = (
        "_a0",
        "_bin",
        "_ncoef",
        "_rel",
        "_s_prev",
        "_s_t",
        "_t",
        "_w1",
        "_w2",
        "n",
        "pair",
        "tail",
    )

    def __init__(self, pair: ClonePair, n: int, delta: float, *, tail: float | None = None) -> None:
        import numpy as np
        from scipy import stats

        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        self.pair, self.n = pair, n
        m, prob = n - 1, min(1.0, 2.0 * pair.r)
        self._bin = stats.binom
        if m == 0:
            c_lo, c_hi = 0, 0
        else:
            # The central interval holding all but TAIL_FRACTION·δ of C's mass; the
            # exact mass left out is measured below and charged to δ, so the
            # quantiles only set speed, never correctness.
            c_lo, c_hi = binom_window(m, prob, TAIL_FRACTION * delta if tail is None else tail)
        low = float(stats.binom.cdf(c_lo - 1, m, prob)) if c_lo > 0 else 0.0
        high = float(stats.binom.sf(c_hi, m, prob)) if c_hi < m else 0.0
        # Relative float error of a weight (Bin(m, 2r)) plus that of a Bin(t, ½) tail or
        # pmf (t ≤ n + 1), plus the rounding of the sums over the window.
        self._rel = (pmf_error(max(m, 1), min(max(prob, 1e-300), 0.5)) if m > 0 else 0.0) + (
            half_tail_error(n + 1) + 4.0 * _ULP * (c_hi - c_lo + 2)
        )
        self.tail = (low + high) * (1.0 + self._rel)
        c = np.arange(c_lo, c_hi + 1, dtype=np.float64)
        self._t = c + 1.0
        self._w1 = np.exp(binom_logpmf(c, m, prob)) if m > 0 else np.ones(1)
        self._w2 = np.exp(binom_logpmf(c + 1.0, m, prob)) if m > 0 else np.zeros(1)
        # γρ(n−t): the weight of "victim in neither bucket" relative to Pr[C=t−1]·…/t.
        rho = prob / (1.0 - prob) if prob < 1.0 else 0.0
        self._ncoef = pair.gamma * rho * (n - self._t)
        # Cache of the last cutoffs and tail probabilities: a root search's late
        # steps move ε so little that most cutoffs a0(t) do not change.
        self._a0 = np.full_like(self._t, -1.0)
        self._s_t = np.zeros_like(self._t)
        self._s_prev = np.zeros_like(self._t)

    def delta(self, epsilon: float) -> float:
        """An upper bound on D_{e^ε}(P‖Q) = D_{e^ε}(Q‖P): the sum, its float error and
        the window's tail."""
        total, error = self._sum(epsilon)
        return max(0.0, total + error) + self.tail

    def delta_lower(self, epsilon: float) -> float:
        """A lower bound on D_{e^ε}(P‖Q): the sum over the window less its float error
        (the terms left out are ≥ 0)."""
        total, error = self._sum(epsilon)
        return total - error

    def _sum(self, epsilon: float) -> tuple[float, float]:
        """The window's sum and a bound on its float error."""
        import numpy as np

        pr, t = self.pair, self._t
        e = math.exp(epsilon)
        slope = 2.0 * pr.alpha * (pr.p - 1.0) * (1.0 + e)
        const = 2.0 * pr.alpha * (1.0 - pr.p * e) * t + self._ncoef * (1.0 - e)
        a0 = np.clip(np.floor(-const / slope) + 1.0, 0.0, t + 1.0)
        changed = a0 != self._a0
        if changed.any():
            a_c, t_c = a0[changed], t[changed]
            s_c = self._bin.sf(a_c - 1.0, t_c, 0.5)
            self._s_t[changed] = s_c
            self._s_prev[changed] = s_c + 0.5 * self._bin.pmf(a_c - 1.0, t_c - 1.0, 0.5)
            self._a0 = a0
        s_t, s_prev = self._s_t, self._s_prev
        up = self._w1 * (0.5 * slope * s_prev)  # ≥ 0
        down = self._w1 * (2.0 * pr.alpha * (pr.p * e - 1.0) * s_t)  # ≥ 0, subtracted
        down += self._w2 * pr.gamma * (e - 1.0) * s_t
        plus, minus = float(np.sum(up, dtype=np.float64)), float(np.sum(down, dtype=np.float64))
        return plus - minus, self._rel * (plus + minus)

    def _arrays(self) -> dict[str, Any]:  # for the PLD builder
        return {"t": self._t, "w1": self._w1, "w2": self._w2, "ncoef": self._ncoef}


def check_shuffle_args(epsilon0: float, n: int, delta: float) -> None:
    """Refuse, naming it, an ε0, n or δ that no shuffle bound takes."""
    if isinstance(epsilon0, bool) or not isinstance(epsilon0, int | float):
        raise ValueError(f"epsilon0 must be a number, got {epsilon0!r}")
    if not math.isfinite(epsilon0) or epsilon0 < 0.0:
        raise ValueError(f"epsilon0 must be finite and non-negative, got {epsilon0!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
