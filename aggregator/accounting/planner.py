"""The planner: a target central (ε, δ), expected n and candidate count → RAPPOR
parameters (k, h, m, f, p, q), with the expected standard error and the smallest
detectable frequency.

It finds the crowd (the smallest of m cohorts of a batch of n, as in
``privacy_statement``), the largest ε0 whose generic stronger-clone amplification meets
the target, and for h ∈ {1, 2}, f ∈ {1/8, 1/4, 1/2, 3/4} the largest symmetric IRR q
within it (then raised while ``amplification.best_amplification`` still meets the
target). Standard error of one candidate: se = 1/(2·(q* − p*)·sqrt(h·n)) (a lower bound
on the decoder's); detectable at power: (z_{1−α/C} + z_power)·se (Bonferroni). k is a
power of two ≥ 1.5·h·C in [16, 4096]. Each proposal is checked by ``privacy_statement``
and the first whose ``meets_target`` holds is returned; else ``PlanError``, so a plan
that misses its target is never returned. Method: docs/design.md, "Aggregator: accounting".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from crowdmix.core.params import RapporParams

__all__ = ["Plan", "PlanError", "plan"]

_H_CHOICES = (1, 2)
_F_CHOICES = (0.125, 0.25, 0.5, 0.75)
_Q_MAX = 0.99
# Resolution of the q refined with the blanket bound (each step computes one).
_Q_STEP = 1e-3


class PlanError(ValueError):
    """The target cannot be met (e.g. too few reports for any amplification)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A proposed parameter set and what it delivers."""

    params: RapporParams
    target_epsilon: float
    delta: float
    n: int
    candidates: int
    rounds: int
    epsilon_local_max: float
    epsilon_1: float
    epsilon_inf: float
    central_epsilon: float
    central_bound: str
    longitudinal_epsilon: float
    longitudinal_argument: str
    n_amplify: int
    std_error: float
    detectable_frequency: float
    alpha: float
    power: float

    @property
    def meets_target(self) -> bool:
        return max(self.central_epsilon, self.longitudinal_epsilon) <= self.target_epsilon

    def to_dict(self) -> dict[str, object]:
        p = self.params
        return {
            "params": {"k": p.k, "h": p.h, "m": p.m, "f": p.f, "p": p.p, "q": p.q},
            "target": {"epsilon": self.target_epsilon, "delta": self.delta, "rounds": self.rounds},
            "n": self.n,
            "candidates": self.candidates,
            "n_amplify": self.n_amplify,
            "epsilon_local_max": self.epsilon_local_max,
            "epsilon_1": self.epsilon_1,
            "epsilon_inf": self.epsilon_inf,
            "central": {"epsilon": self.central_epsilon, "bound": self.central_bound},
            "longitudinal": {
                "epsilon": self.longitudinal_epsilon,
                "argument": self.longitudinal_argument,
            },
            "std_error": self.std_error,
            "detectable_frequency": self.detectable_frequency,
            "alpha": self.alpha,
            "power": self.power,
            "meets_target": self.meets_target,
        }


def _next_pow2(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, x))))


def _max_local_epsilon(target: float, n_amp: int, delta: float) -> float:
    """Largest ε0 (to 1e-6 relative, rounded down) with generic amplification ≤ target."""
    from crowdmix.aggregator.accounting.amplification import amplify

    if amplify(target, n_amp, delta).epsilon > target:  # cannot happen: bound ≤ ε0
        return 0.0
    lo, hi = target, max(2.0 * target, 1.0)
    while amplify(hi, n_amp, delta).epsilon <= target:
        lo, hi = hi, 2.0 * hi
        if hi > 40.0:
            return lo
    while hi - lo > 1e-6 * lo:
        mid = 0.5 * (lo + hi)
        if amplify(mid, n_amp, delta).epsilon <= target:
            lo = mid
        else:
            hi = mid
    return lo


def _local_figure(params: RapporParams, rounds: int) -> float:
    from crowdmix.aggregator.accounting.local import epsilon_inf, epsilon_k, epsilon_one

    if rounds == 1:
        return epsilon_one(params)
    return min(epsilon_k(params, rounds), epsilon_inf(params))


def _best_q(h: int, f: float, k: int, m: int, rounds: int, eps_max: float) -> RapporParams | None:
    def make(q: float) -> RapporParams:
        return RapporParams(k=k, h=h, m=m, f=f, p=1.0 - q, q=q)

    if _local_figure(make(_Q_MAX), rounds) <= eps_max:
        return make(_Q_MAX)
    lo, hi = 0.5, _Q_MAX  # q = 0.5 carries no signal; the figure rises with q
    while hi - lo > 1e-9:
        mid = 0.5 * (lo + hi)
        if _local_figure(make(mid), rounds) <= eps_max:
            lo = mid
        else:
            hi = mid
    return make(lo) if lo > 0.5 else None


def _meets(params: RapporParams, target: float, n_amp: int, delta: float, rounds: int) -> bool:
    """Whether the best valid bounds (``amplification.best_amplification``) put one
    release, and ``rounds`` releases by the memoised-PRR argument, within target
    (decided by ``amplification.best_within``: the same answer, mostly without
    the blanket bound's root search)."""
    from crowdmix.aggregator.accounting.amplification import best_within
    from crowdmix.aggregator.accounting.local import epsilon_inf, epsilon_k, epsilon_one
    from crowdmix.aggregator.accounting.randomizers import randomizer_of

    eps1 = epsilon_one(params)
    if not best_within(eps1, n_amp, delta, target, randomizer_of(rappor=params)):
        return False
    if rounds == 1:
        return True
    if best_within(epsilon_k(params, rounds), n_amp, delta, target):
        return True
    prr = randomizer_of(rappor=params, prr_only=True)
    return best_within(epsilon_inf(params), n_amp, delta, target, prr)


def _refined(
    proposals: list[tuple[float, RapporParams]],
    target: float,
    n: int,
    n_amp: int,
    delta: float,
    rounds: int,
    local_cap: float | None,
) -> list[tuple[float, RapporParams]]:
    """Raise each proposal's q while the best valid bound still meets the target.

    The proposals come from the generic bound; a mechanism's blanket bound may
    allow a larger q (more signal). Proposals are refined in order of the error
    they could reach at q = _Q_MAX, and refining stops once that cannot beat the
    best refined error (each check computes a blanket bound); a proposal that
    fails at the q it needs to beat that error is not refined. q is bisected to
    _Q_STEP; the figures are checked again by ``privacy_statement`` in ``plan``."""
    from crowdmix.aggregator.accounting.local import epsilon_one

    def with_q(base: RapporParams, q: float) -> RapporParams:
        return RapporParams(k=base.k, h=base.h, m=base.m, f=base.f, p=1.0 - q, q=q)

    out = list(proposals)
    order = sorted(proposals, key=lambda sp: std_error(with_q(sp[1], _Q_MAX), n))
    best = min((se for se, _ in proposals), default=math.inf)
    for _, base in order:
        if std_error(with_q(base, _Q_MAX), n) >= best:
            break
        lo, hi = base.q, _Q_MAX

        def ok(q: float, base: RapporParams = base) -> bool:
            params = with_q(base, q)
            if local_cap is not None and epsilon_one(params) > local_cap:
                return False
            return _meets(params, target, n_amp, delta, rounds)

        if not ok(lo + _Q_STEP):
            continue
        # ok falls with q: if the q below which this proposal cannot beat the best
        # error so far fails, refining it can only add a worse fallback. Skip it.
        need = _q_for_error(base, best, n)
        if lo + _Q_STEP < need < _Q_MAX and not ok(need):
            continue
        lo += _Q_STEP
        while hi - lo > _Q_STEP:
            mid = 0.5 * (lo + hi)
            if ok(mid):
                lo = mid
            else:
                hi = mid
        refined = with_q(base, lo)
        se = std_error(refined, n)
        out.append((se, refined))
        best = min(best, se)
    return out


def _q_for_error(base: RapporParams, se: float, n: int) -> float:
    """A q at or below every symmetric q (p = 1 − q) whose ``std_error`` is below
    ``se`` (q* − p* = (1 − f)(2q − 1)); 1.0 if none is."""
    if not math.isfinite(se) or se <= 0.0 or base.f >= 1.0:
        return 1.0
    q = 0.5 * (1.0 + 1.0 / (2.0 * (1.0 - base.f) * se * math.sqrt(base.h * n)))
    return min(1.0, q * (1.0 - 1e-9))


def std_error(params: RapporParams, n: int) -> float:
    """Idealised standard error of one candidate's frequency (see module docstring)."""
    from crowdmix.core.privacy import p_star, q_star

    signal = q_star(params) - p_star(params)
    return 1.0 / (2.0 * signal * math.sqrt(params.h * n))


def plan(
    epsilon: float,
    delta: float,
    n: int,
    candidates: int,
    *,
    rounds: int = 1,
    cohorts: int = 4,
    alpha: float = 0.05,
    power: float = 0.8,
    max_local_epsilon: float | None = None,
    max_epsilon_inf: float | None = None,
) -> Plan:
    """Propose RAPPOR params meeting central ``epsilon`` (over ``rounds`` releases).

    ``max_local_epsilon`` caps ε_1 (what one report reveals with no trust in any
    server) and ``max_epsilon_inf`` caps ε_∞ (everything a client ever reports
    about one value): a central target alone lets the planner trade local
    privacy away when n is large.
    """
    from scipy.stats import norm

    from crowdmix.aggregator.accounting.guarantees import CROWD_FAILURE, estimated_crowd
    from crowdmix.aggregator.accounting.statement import privacy_statement
    from crowdmix.core.registry import MetricConfig

    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not 0 < epsilon < 20:
        raise ValueError(f"epsilon must be in (0, 20), got {epsilon!r}")
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    for name, v in (("n", n), ("candidates", candidates), ("rounds", rounds), ("cohorts", cohorts)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise ValueError("alpha and power must be in (0, 1)")

    # The crowd exactly as privacy_statement estimates it for one batch of n
    # (binomial quantile, its failure probability charged to δ).
    amp_delta = delta
    n_amp = n
    if cohorts > 1:
        failure = CROWD_FAILURE * delta
        n_amp = estimated_crowd(n, 1.0 / cohorts, failure / cohorts)
        amp_delta = delta - failure
    eps_max = _max_local_epsilon(float(epsilon), n_amp, amp_delta)
    for name, cap in (
        ("max_local_epsilon", max_local_epsilon),
        ("max_epsilon_inf", max_epsilon_inf),
    ):
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, int | float) or cap <= 0
        ):
            raise ValueError(f"{name} must be a positive number, got {cap!r}")
    if max_local_epsilon is not None:
        eps_max = min(eps_max, float(max_local_epsilon))

    proposals: list[tuple[float, RapporParams]] = []
    for h in _H_CHOICES:
        k = min(4096, max(16, _next_pow2(1.5 * h * candidates)))
        for f in _F_CHOICES:
            # ε_∞ = 2h·ln((1 - f/2)/(f/2)) depends on h and f alone
            if (
                max_epsilon_inf is not None
                and 2 * h * math.log((1 - f / 2) / (f / 2)) > max_epsilon_inf
            ):
                continue
            params = _best_q(h, f, k, cohorts, rounds, eps_max)
            if params is None:
                continue
            proposals.append((std_error(params, n), params))
    proposals = _refined(
        proposals,
        float(epsilon),
        n,
        n_amp,
        amp_delta,
        rounds,
        None if max_local_epsilon is None else float(max_local_epsilon),
    )
    if not proposals:
        raise PlanError(
            f"no RAPPOR parameters reach ε={epsilon} with δ={delta} for n={n} "
            f"(a report hides among only ~{n_amp} others)"
            + (
                ""
                if max_local_epsilon is None and max_epsilon_inf is None
                else " within the local caps"
            )
        )
    proposals.sort(key=lambda sp: sp[0])
    z = float(norm.isf(alpha / candidates)) + float(norm.ppf(power))
    if z * proposals[0][0] >= 1.0:
        raise PlanError(
            f"ε={epsilon} with δ={delta} and n={n} leaves no usable signal: even a value held "
            f"by every client would not be detected (std error {proposals[0][0]:.3g}); "
            "raise ε or n"
        )
    for se, params in proposals:
        # Fed back through privacy_statement: only a proposal whose stated figures
        # meet the target is returned (``meets_target`` is enforced, not reported).
        metric = MetricConfig(name="plan", rappor=params)
        stmt = privacy_statement(metric, n, delta=delta, rounds=rounds, batch_sizes=[n])
        result = Plan(
            params=params,
            target_epsilon=float(epsilon),
            delta=delta,
            n=n,
            candidates=candidates,
            rounds=rounds,
            epsilon_local_max=eps_max,
            epsilon_1=stmt.epsilon_local,
            epsilon_inf=stmt.epsilon_inf if stmt.epsilon_inf is not None else math.inf,
            central_epsilon=stmt.central.epsilon,
            central_bound=stmt.central.bound,
            longitudinal_epsilon=stmt.longitudinal.epsilon,
            longitudinal_argument=stmt.longitudinal.argument,
            n_amplify=stmt.central.n_amplify,
            std_error=se,
            detectable_frequency=z * se,
            alpha=alpha,
            power=power,
        )
        if result.meets_target:
            return result
    raise PlanError(
        f"no RAPPOR parameters reach ε={epsilon} with δ={delta} for n={n} and "
        f"{rounds} round(s) once fed back through the privacy statement"
    )
