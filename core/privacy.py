"""Per-report local privacy of RAPPOR (Erlingsson, Pihur, Korolova, CCS 2014, §4;
google/rappor ``analysis/R/.../ComputePrivacyGuarantees``).

With PRR parameter f and IRR parameters p, q, a report bit reads 1 with
probability q* if the Bloom bit is 1 and p* if it is 0:

    p* = f(p+q)/2 + (1-f)p          q* = f(p+q)/2 + (1-f)q

Two values differ in at most 2h Bloom bits, so

    ε_1 = h · ln( q*(1-p*) / (p*(1-q*)) )     one report (the shuffle's ε0)
    ε_∞ = 2h · ln( (1-f/2) / (f/2) )          any number of reports of one value

The ε_k bound for k reports over one memoised PRR lives with the accounting
(crowdmix.aggregator.accounting.local).
"""

from __future__ import annotations

import math
from fractions import Fraction

from crowdmix.core.params import RapporParams

__all__ = ["epsilon_inf", "epsilon_one", "p_star", "q_star"]


def p_star(params: RapporParams) -> float:
    """P(report bit = 1 | Bloom bit = 0)."""
    f, p, q = params.f, params.p, params.q
    return 0.5 * f * (p + q) + (1.0 - f) * p


def q_star(params: RapporParams) -> float:
    """P(report bit = 1 | Bloom bit = 1)."""
    f, p, q = params.f, params.p, params.q
    return 0.5 * f * (p + q) + (1.0 - f) * q


def epsilon_one(params: RapporParams) -> float:
    """ε_1 = h·ln(q*(1-p*)/(p*(1-q*))): the LDP level of one report. inf if p*=0 or q*=1.

    Evaluated on exact rationals (every float is one): p* and q* as floats can
    underflow (q = 5e-324 makes both 0) although the ratio is finite.
    """
    f, p, q = (Fraction(x) for x in (params.f, params.p, params.q))
    ps = f * (p + q) / 2 + (1 - f) * p
    qs = f * (p + q) / 2 + (1 - f) * q
    if ps <= 0 or qs >= 1:
        return math.inf
    ratio = qs * (1 - ps) / (ps * (1 - qs))
    # ln of numerator and denominator separately: both may exceed the float range.
    return params.h * (math.log(ratio.numerator) - math.log(ratio.denominator))


def epsilon_inf(params: RapporParams) -> float:
    """ε_∞ = 2h·ln((1-f/2)/(f/2)): the PRR bound, for any number of reports. inf if f=0."""
    if params.f <= 0.0:
        return math.inf
    half = params.f / 2.0
    return 2 * params.h * (math.log1p(-half) - math.log(half))
