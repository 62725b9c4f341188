"""One-bit vectors (OUE): the δ of "victim u vs v, every other user w", from below.

Columns other than u, v, w are i.i.d. Bern(p) in every report, so the shuffled output is
exactly as informative as the multiset of (b_u, b_v, b_w) patterns. With ρ the others'
pattern law, Mult_{n−1}(c − e_t) = Mult_n(c)·c_t/(n·ρ(t)) gives P_u(c) = Mult_n(c; ρ)·X/n,
X = Σ_j s(ℓ_j)·r(b_uj), ℓ = b_w the label, r(1) = q/p, r(0) = (1−q)/(1−p), s(1) = p/q,
s(0) = (1−p)/(1−q); Q likewise with Y (b_v). So δ(ε) = E[(X − cY)_+]/n, c = e^ε, over n
i.i.d. ρ reports. X − Y = Δ·S, Δ = r(1) − r(0), S = s(1)·M1 + s(0)·M0, M_ℓ = Σ_{label ℓ}
(b_u − b_v). Given N1 (label-1 reports with b_u ≠ b_v), M1 is a fair ±1 walk of N1 steps
and M0 one of n − N1 steps that move w.p. θ, independent. Jensen given F = (N1, M1, M0):
E[(X − cY)_+] ≥ E[(X − cE[Y | F])_+], and E[Y | F] is linear in N1, M1, M0 and E[N0 | N1,
M0] (N0: label-0 movers), carried along M0's law. Summed over windows (terms outside are
≥ 0 and dropped), float error taken off: a lower bound.
"""

from __future__ import annotations

import math
from typing import Any

from crowdmix.aggregator.accounting.pairs import binom_logpmf, binom_window, pmf_error

__all__ = ["labelled_one_bit"]

_ULP = math.ulp(1.0)
# Mass each window over a binomial leaves out (dropped: only lowers the figure).
_WINDOW = 1e-13
# ε tried per pass while bracketing the root; then passes of _REFINE points spread over
# 1/_SHRINK of the bracket around the root interpolated in log δ (~100× narrower each).
_T = 12
_REFINE = 5
_SHRINK = 30.0
_REFINE_PASSES = 2


class _Walks:
    """The laws of M0 (and E[N0 | M0]) along a window of N1, and the Jensen sum."""

    def __init__(self, p: float, q: float, n: int) -> None:
        import numpy as np

        a = p * (1.0 - p)
        self.s1, self.s0 = p / q, (1.0 - p) / (1.0 - q)
        r1, r0 = q / p, (1.0 - q) / (1.0 - p)
        self.gap, self.mid = r1 - r0, (r1 + r0) / 2.0
        # E[r(b)] over a report with b_u = b_v = b (its label independent, E[s(ℓ)] = 1).
        self.nu = (p * p * r1 + (1.0 - p) ** 2 * r0) / (p * p + (1.0 - p) ** 2)
        self.pi1 = 2.0 * a * q  # P(label 1 and b_u ≠ b_v) for one report
        self.theta = 2.0 * a * (1.0 - q) / (1.0 - self.pi1)  # P(M0 moves | not that)
        self.n = n
        self.lo1, self.hi1 = binom_window(n, self.pi1, _WINDOW)
        k1 = np.arange(self.lo1, self.hi1 + 1, dtype=np.float64)
        self.p1 = np.exp(binom_logpmf(k1, n, self.pi1))
        # M0's support kept: |m0| ≤ half (the walk of the most steps, windowed).
        top0 = binom_window(n - self.lo1, self.theta, _WINDOW)[1]
        self.half = min(top0, 2 * binom_window(top0, 0.5, _WINDOW)[1] - top0) if top0 else 0
        self.m0 = np.arange(-self.half, self.half + 1, dtype=np.float64)
        self.start = self._initial(n - self.hi1)
        steps = (self.hi1 - self.lo1) + 2 * top0 + 16
        # Relative error of every mass: the binomial terms (pmf_error) and ≤ 4 ulp for
        # each step of a recurrence (sums of non-negative terms).
        self.rel = (
            pmf_error(n, self.pi1) + pmf_error(n, self.theta) + 2.0 * pmf_error(n, 0.5)
        ) + 4.0 * _ULP * steps

    def _walk(self, steps: int) -> Any:
        """Bin((m + steps)/2; steps, ½) on the kept m0 (0 off its parity)."""
        import numpy as np

        m = self.m0
        ok = (np.abs(m) <= steps) & (np.mod(m + steps, 2.0) == 0.0)
        out = np.zeros_like(m)
        out[ok] = np.exp(binom_logpmf((m[ok] + steps) / 2.0, steps, 0.5))
        return out

    def _initial(self, count: int) -> tuple[Any, Any]:
        """Law L of M0 after ``count`` steps, Σ_{N0} Bin(N0; count, θ)·walk(N0), and
        J = Σ_{N0} N0·Bin(N0; count, θ)·walk(N0) (J/L = E[N0 | M0]); the walk
        advanced one step at a time."""
        import numpy as np

        lo, hi = binom_window(count, self.theta, _WINDOW)
        ks = np.arange(lo, hi + 1, dtype=np.float64)
        weights = np.exp(binom_logpmf(ks, count, self.theta))
        walk = self._walk(lo)
        law, moved = np.zeros_like(walk), np.zeros_like(walk)
        for k, w in zip(ks, weights, strict=True):
            law += w * walk
            moved += (k * w) * walk
            nxt = np.zeros_like(walk)
            nxt[1:] += walk[:-1]
            nxt[:-1] += walk[1:]
            walk = 0.5 * nxt
        return law, moved

    def jensen_sum(self, epsilons: list[float]) -> Any:
        """Σ over the kept N1, M1, M0 of P·(Z_F)_+ from below, one per ε, with
        Z_F = X − c·E[Y | F] = Δ(1+c)/2·S − (c−1)·[n·ν + N1·(s1·m̄ − ν) + E[N0 | N1,
        M0]·(s0·m̄ − ν)], m̄ = (r(0) + r(1))/2, ν = E[r(b) | b_u = b_v = b]."""
        import numpy as np

        s1, s0, theta, n = self.s1, self.s0, self.theta, self.n
        eps = np.asarray(epsilons, dtype=np.float64)
        scale = self.gap * (1.0 + np.exp(eps)) / 2.0  # Δ(1+c)/2
        cm1 = np.expm1(eps)
        k1 = s1 * self.mid - self.nu  # each label-1 mover
        k0 = s0 * self.mid - self.nu  # each label-0 mover (its mean given M0)
        law, moved = (x.copy() for x in self.start)
        size = len(law)
        gamma = 4.0 * _ULP * (size + 16) + 4.0 * self.rel
        total = np.zeros(len(eps))

        def suffix(x: Any) -> Any:
            return np.concatenate((np.cumsum(x[::-1])[::-1], [0.0]))

        for i in range(self.hi1 - self.lo1, -1, -1):
            n1 = self.lo1 + i
            l_suf, j_suf = suffix(law), suffix(moved)
            lm_suf, la_suf = suffix(law * self.m0), suffix(law * np.abs(self.m0))
            mean0 = float(np.sum(moved)) / max(float(np.sum(law)), 1e-300)  # ≈ E[N0 | M0]
            klo, khi = binom_window(n1, 0.5, _WINDOW)
            k = np.arange(klo, khi + 1, dtype=np.float64)
            pm1 = np.exp(binom_logpmf(k, n1, 0.5))
            m1 = 2.0 * k - n1
            for row in range(len(eps)):
                a_s0, kk = float(scale[row]) * s0, float(cm1[row]) * k0
                h = float(scale[row]) * s1 * m1 - float(cm1[row]) * (n * self.nu + n1 * k1)
                # Kept m0: those with a_s0·m0 > kk·E[N0] − h, E[N0 | M0] taken at its
                # mean (any cut sums real terms of Z_F, so an inexact cut only lowers it).
                cut = np.floor((kk * mean0 - h) / a_s0) + 1.0 + self.half
                idx = np.clip(cut, 0, size).astype(np.int64)
                a0, aj = l_suf[idx], j_suf[idx]
                term = a_s0 * lm_suf[idx] + h * a0 - kk * aj
                err = gamma * (a_s0 * la_suf[idx] + np.abs(h) * a0 + abs(kk) * aj)
                total[row] += self.p1[i] * float(np.sum(pm1 * np.maximum(term - err, 0.0)))
            if i:  # N1 − 1: one more report outside label 1; M0 moves w.p. θ
                step_l, step_j = (1.0 - theta) * law, (1.0 - theta) * moved
                up_l, up_j = 0.5 * theta * law, 0.5 * theta * (moved + law)
                step_l[1:] += up_l[:-1]
                step_l[:-1] += up_l[1:]
                step_j[1:] += up_j[:-1]
                step_j[:-1] += up_j[1:]
                law, moved = step_l, step_j
        return (1.0 - 2.0 * self.rel - 1e-10) * total


def labelled_one_bit(p: float, q: float, n: int, delta: float, start: float, upper: float) -> float:
    """Largest ε found with δ(ε) > δ from below (module docstring), searched upward
    from ``start`` (a known lower bound) to ``upper``; 0 if none. Every ε returned
    was checked on the lower bound (the search only picks where to look)."""
    if n < 2 or not 0.0 < p < q < 1.0:
        return 0.0
    walks = _Walks(p, q, n)

    def lows(eps_list: list[float]) -> list[float]:
        return [float(v) * (1.0 - 1e-12) / n for v in walks.jensen_sum(eps_list)]

    lo = max(start, 0.0)
    hi = min(upper, max(1.5 * lo, 1e-6))
    found, d_found = 0.0, 0.0
    while True:  # bracket: found certified (δ above δ), next not
        points = [lo + (hi - lo) * (i + 1) / (_T + 1) for i in range(_T)] + [hi]
        if found == 0.0 and lo > 0.0:
            points = [lo, *points]
        values = lows(points)
        above = [(e, d) for e, d in zip(points, values, strict=True) if d > delta]
        if above:
            found, d_found = max(above)
        elif found == 0.0:
            return 0.0
        if found < hi:  # found is lo when the bracket was widened past the root
            break
        if hi >= upper:
            return found
        lo, hi = hi, min(upper, 2.0 * hi)  # the root is above the bracket: widen it
    nxt, d_next = min((e, d) for e, d in zip(points, values, strict=True) if e > found)
    for _ in range(_REFINE_PASSES):
        width = nxt - found
        # Root of log δ interpolated linearly between the bracket's ends; points
        # spread below it (a point above the root certifies nothing).
        share = math.log(d_found / delta) / math.log(d_found / d_next) if d_next > 0.0 else 0.5
        guess = found + width * min(max(share, 0.0), 1.0)
        step = width / _SHRINK
        points = [guess - step * (k - 1) / (_REFINE - 1) for k in range(_REFINE)]
        points = sorted(e for e in points if found < e < nxt)
        if not points:
            break
        values = lows(points)
        for e, d in zip(points, values, strict=True):
            if d > delta and e > found:
                found, d_found = e, d
            elif d <= delta and e < nxt:
                nxt, d_next = e, d
        if found >= nxt:  # cannot happen for a monotone δ; stop rather than loop
            break
    return found
