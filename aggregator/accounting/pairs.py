"""Dominating pairs for amplification by shuffling, evaluated exactly: pure math.

The shuffle bounds used here reduce n shuffled reports of an ε0-LDP
randomizer to one pair of distributions over two counts (N0, N1):

- The victim (user 1, whose value x¹₀ vs x¹₁ is protected) lands in bucket 0 w.p.
  p·α, bucket 1 w.p. α, neither w.p. γ = 1 − α(1+p) under P; buckets 0 and 1
  swap under Q.
- Each of the other n−1 users is a "clone": bucket 0 w.p. r, bucket 1 w.p. r,
  neither w.p. 1 − 2r, independently.

The shuffled output is a post-processing of (N0, N1), so (P, Q) dominates it.

| bound | p | α | r |
|---|---|---|---|
| stronger clone (generic) [1] | e^ε0 | 1/(e^ε0+1) | 1/(e^ε0+1) |
| clones (FMT21) [3] | e^ε0 | 1/(e^ε0+1) | e^−ε0/2 |

[1] Feldman, McMillan, Talwar, "Stronger privacy amplification by shuffling
    for Rényi and approximate DP", SODA 2023; proved for any ε0-LDP randomizer
    by Wang et al. (VLDB 2024), Lemma 4.4 (FMT23's own proof has an erratum).
[2] Wang, Peng, Li, Xu, Yang, Liu, "Privacy Amplification via Shuffling:
    Unified, Simplified, and Tightened", VLDB 2024.
[3] Feldman, McMillan, Talwar, "Hiding among the clones", FOCS 2021, Thm 3.1.

Not used: the (p, β, q) "variation-ratio" pair [2] with a mechanism's own β
below the generic (e^ε0−1)/(e^ε0+1) (α = β/(p−1), r = αp/q). With that β the
victim lands in "neither bucket" with probability γ > 0, and the reduction to
(N0, N1) needs the victim's "neither" output to look like the other users'
"neither" outputs; for k-RR with d ≥ 4, OUE and PRR it does not. It is NOT a
dominating pair for those shuffled mechanisms: shuffled 5-RR with ε0 = 2,
n = 100, δ = 1e-6 (victim 0 vs 1, everyone else 2) needs ε ≥ 1.1564 where that
pair gives 1.1353, and exact enumeration of tiny cases (OUE, PRR, 3-RR) finds
δ(ε) above the pair's (tests/accounting/test_exact_shuffle.py). crowdmix
therefore bounds every ε0-LDP randomizer with the generic stronger clone
(the (p, β, q) pair with p = q = e^ε0 and the generic β, where γ = 0).

Exact hockey-stick divergence. Let C ~ Bin(n−1, 2r) be the clones in a bucket,
T = N0 + N1, B_t(a) = Bin(a; t, ½), ρ = 2r/(1−2r). Since Pr[C=t]/Pr[C=t−1] =
ρ(n−t)/t, for t ≥ 1

    P(a, t−a) − e^ε Q(a, t−a) = Pr[C=t−1]·B_t(a)/t · ℓ(a),
    ℓ(a) = 2α(p−1)(1+e^ε)·a + 2α(1−p·e^ε)·t + γρ(n−t)(1−e^ε),

linear and increasing in a, so the positive part is a ≥ a0(t), one cutoff per
t. With S_m(j) = Pr[Bin(m, ½) ≥ j] and Σ_{a≥a0} a·B_t(a) = (t/2)·S_{t−1}(a0−1):

    D_{e^ε}(P‖Q) = Σ_t Pr[C=t−1]·[α(p−1)(1+e^ε)·S_{t−1}(a0−1) + 2α(1−p·e^ε)·S_t(a0)]
                       + Pr[C=t]·γ(1−e^ε)·S_t(a0)

and S_{t−1}(a0−1) = S_t(a0) + ½·Bin(a0−1; t−1, ½) (only additions, no
cancellation). The pair is symmetric (swapping buckets maps P to Q), so
D(P‖Q) = D(Q‖P). Only t within many standard deviations of C's mean are
summed; T = t has probability at most Pr[C=t−1] + Pr[C=t], so the neglected
terms are bounded by C's tail mass outside the window, which is added: the
result is an upper bound on δ(ε), up to float rounding (~1e-16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["ClonePair", "EvaluatedPair", "binom_window"]

# C's window covers all but TAIL_FRACTION·δ of its mass; that mass is added to δ.
TAIL_FRACTION = 1e-6


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
        """P(victim lands in neither bucket)."""
        return max(0.0, 1.0 - self.alpha * (1.0 + self.p))

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
        self.tail = low + high
        c = np.arange(c_lo, c_hi + 1, dtype=np.float64)
        self._t = c + 1.0
        self._w1 = np.exp(stats.binom.logpmf(c, m, prob)) if m > 0 else np.ones(1)
        self._w2 = np.exp(stats.binom.logpmf(c + 1.0, m, prob)) if m > 0 else np.zeros(1)
        # γρ(n−t): the weight of "victim in neither bucket" relative to Pr[C=t−1]·…/t.
        rho = prob / (1.0 - prob) if prob < 1.0 else 0.0
        self._ncoef = pair.gamma * rho * (n - self._t)
        # Cache of the last cutoffs and tail probabilities: a root search's late
        # steps move ε so little that most cutoffs a0(t) do not change.
        self._a0 = np.full_like(self._t, -1.0)
        self._s_t = np.zeros_like(self._t)
        self._s_prev = np.zeros_like(self._t)

    def delta(self, epsilon: float) -> float:
        """An upper bound on D_{e^ε}(P‖Q) = D_{e^ε}(Q‖P) (window tail included)."""
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
        terms = self._w1 * (0.5 * slope * s_prev + 2.0 * pr.alpha * (1.0 - pr.p * e) * s_t)
        terms += self._w2 * pr.gamma * (1.0 - e) * s_t
        total = float(np.sum(terms, dtype=np.float64))
        return max(0.0, total) + self.tail

    def _arrays(self) -> dict[str, Any]:  # for the PLD builder
        return {"t": self._t, "w1": self._w1, "w2": self._w2, "ncoef": self._ncoef}
