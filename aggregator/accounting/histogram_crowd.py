"""Who hides a device's real report in a shuffled histogram: the honest crowd of its
batch. Pure math.

The model, in one sentence: at most D of the devices whose reports reach a collection
window are dishonest, and all of them may sit in the target's batch, sending the most the
shuffler takes (1 + m reports each), so the honest others counted are those a batch of
T_b reports must hold even then (``honest_lower_bound``).

D is given (``dishonest_devices``), or follows from an honest fraction h of the window's
devices: in a window released as one batch, D ≤ (1 − h)/h·H for its H honest devices;
across several batches D = ⌈(1 − h)·N_up⌉, N_up an upper confidence bound on the window's
devices (``devices_upper_bound``). The confidence bounds' failure probability is charged
to δ (``honest_crowd``). A share h is never applied per batch: devices that choose when to
report can fill a batch (nothing in a shuffler stops it), so only a count over the whole
window bounds the dishonest devices in any one batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from crowdmix.core.histogram import HistogramParams

__all__ = [
    "HonestCrowd",
    "devices_upper_bound",
    "dishonest_share",
    "honest_crowd",
    "honest_lower_bound",
    "honest_others",
]


def _count(name: str, value: object, *, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


def _fraction(honest_fraction: object) -> float:
    h = honest_fraction
    if isinstance(h, bool) or not isinstance(h, int | float) or not 0.0 <= h <= 1.0:
        raise ValueError(f"honest_fraction must be in [0, 1], got {h!r}")
    return float(h)


def _failure(failure: object) -> float:
    if isinstance(failure, bool) or not isinstance(failure, int | float):
        raise ValueError(f"failure must be in (0, 1), got {failure!r}")
    if not 0.0 < failure < 1.0:
        raise ValueError(f"failure must be in (0, 1), got {failure!r}")
    return float(failure)


def dishonest_share(devices: int, honest_fraction: float) -> int:
    """D = ⌈(1 − h)·N⌉: the most dishonest devices among N when a share h is honest
    (rounded up, so float rounding of (1 − h)·N never undercounts them)."""
    _count("devices", devices)
    h = _fraction(honest_fraction)
    return min(devices, math.ceil((1.0 - h) * devices))


def honest_others(devices: int, dishonest: int) -> int:
    """Honest devices besides the target among exactly ``devices`` in its batch, at most
    ``dishonest`` of them dishonest: max(0, b − 1 − D).

    The worst case puts every dishonest device of the window in the target's batch, so
    nothing is assumed about where they sit or when they report: a device (or an operator
    of many) that times its reports to fill the target's batch — the flooding ("n − 1")
    attack on mixes, Serjantov, Dingledine and Syverson, "From a trickle to a flood",
    IH 2002 — is covered. For one batch this is the robust shuffle privacy of Balcer,
    Cheu, Joseph and Mao (SODA 2021, arXiv:1910.13510): the guarantee must hold from the
    honest devices' messages alone.
    """
    _count("devices", devices)
    _count("dishonest", dishonest)
    return max(0, devices - 1 - dishonest)


def _most_reports_tail(
    k: int, target: int, params: HistogramParams, dishonest: int, ratio: float | None
) -> float:
    """Pr[S_k ≥ target], S_k = k + Bin(k·m, q) + (1 + m)·(D, or ⌈ratio·k⌉)."""
    from scipy import stats

    others = dishonest if ratio is None else math.ceil(ratio * k)
    need = target - k - others * params.max_messages  # from k honest devices' fakes
    trials = k * params.fake_slots
    if need <= 0:
        return 1.0
    if need > trials:
        return 0.0
    return float(stats.binom.sf(need - 1, trials, params.fake_probability))


def honest_lower_bound(
    reports: int,
    params: HistogramParams,
    *,
    failure: float,
    dishonest: int = 0,
    dishonest_ratio: float | None = None,
) -> int:
    """k_low(t) = min{k ≥ 0 : Pr[S_k ≥ t] > β}: honest devices that must lie behind t
    reports, except with probability β = ``failure``.

    S_k = X_1 + … + X_k + (1 + m)·R, X_i = 1 + Bin(m, q) the reports of honest device i
    (independent of when it reports), R the dishonest devices beside them: D
    (``dishonest``) or ⌈ρ·k⌉ (``dishonest_ratio`` ρ = (1 − h)/h, when at most a share 1 − h
    of all is dishonest: D ≤ (1 − h)(H + D) ⟺ D ≤ ρ·H), each sending at most 1 + m (the
    shuffler's per-call cap; a device making several calls counts as several). S_k grows
    with k, so Pr[S_k ≥ t] is non-decreasing in k. Two uses, both sound:

    - a fixed set of H honest devices sending T reports in all (a window released whole):
      T ≤ S_H, so Pr[k_low(T) > H] ≤ Pr[Pr[S_H ≥ s]|_{s=S_H} ≤ β] ≤ β (a survival function
      at its own variable is a valid p-value; Casella and Berger, Statistical Inference,
      Thm. 8.3.27);
    - a batch cut at a count from a stream, whose honest devices X_1, X_2, … (after the
      one straddling its start) are fresh: if they and the dishonest ones reach t with H
      honest devices, then H < k implies S_{k−1} ≥ t, so Pr[H < k_low(t)] ≤
      Pr[S_{k_low − 1} ≥ t] ≤ β by the definition of k_low.
    """
    _count("reports", reports)
    _count("dishonest", dishonest)
    _failure(failure)
    if dishonest_ratio is not None and not (
        math.isfinite(dishonest_ratio) and dishonest_ratio >= 0.0
    ):
        raise ValueError(f"dishonest_ratio must be finite and >= 0, got {dishonest_ratio!r}")

    def tail(k: int) -> float:
        return _most_reports_tail(k, reports, params, dishonest, dishonest_ratio)

    if tail(0) > failure:
        return 0
    lo, hi = 0, max(1, reports)  # S_T ≥ T: T honest devices send at least T reports
    while hi - lo > 1:  # invariant: tail(lo) ≤ failure < tail(hi)
        mid = (lo + hi) // 2
        if tail(mid) > failure:
            hi = mid
        else:
            lo = mid
    return hi


def _fewest_reports_cdf(n: int, total: int, params: HistogramParams, h: float) -> float:
    """Pr[U_n ≤ total], U_n = n + Bin((n − ⌈(1 − h)n⌉)·m, q)."""
    from scipy import stats

    trials = (n - dishonest_share(n, h)) * params.fake_slots
    need = total - n  # at most this many honest fakes
    if need < 0:
        return 0.0
    if need >= trials:
        return 1.0
    return float(stats.binom.cdf(need, trials, params.fake_probability))


def devices_upper_bound(
    total_reports: int, params: HistogramParams, *, failure: float, honest_fraction: float
) -> int:
    """N_up(T) = max{n ≤ T : Pr[U_n ≤ T] > β}: at least the devices that sent T reports,
    except with probability β = ``failure``.

    U_n = n + Bin((n − ⌈(1 − h)·n⌉)·m, q): the fewest reports n devices send when a share
    h follows the protocol (one real report and Bin(m, q) fakes) and the rest send one each.
    n − ⌈(1 − h)·n⌉ is non-decreasing in n, so U_{n+1} ≥st U_n and Pr[U_n ≤ T] is
    non-increasing in n; the true total T ≥st U_N, so Pr[N_up < N] = Pr[Pr[U_N ≤ t]|_{t=T}
    ≤ β] ≤ β (Casella and Berger, Thm. 8.3.27). Every device sends a report: N ≤ T.
    """
    _count("total_reports", total_reports, least=1)
    h = _fraction(honest_fraction)
    _failure(failure)
    lo, hi = 1, total_reports
    if _fewest_reports_cdf(hi, total_reports, params, h) > failure:
        return hi
    if _fewest_reports_cdf(lo, total_reports, params, h) <= failure:
        return lo  # no n passes: the bound has failed (probability ≤ β); N ≥ 1 anyway
    while hi - lo > 1:  # invariant: cdf(lo) > failure ≥ cdf(hi)
        mid = (lo + hi) // 2
        if _fewest_reports_cdf(mid, total_reports, params, h) > failure:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True, kw_only=True)
class HonestCrowd:
    """The cover one release counts: honest devices besides the target in its batch."""

    n_honest: int
    honest_lower: int  # honest devices with reports in the smallest batch (lower bound)
    dishonest: int | None  # D, all assumed in that batch (None: a share of the window's)
    devices_upper: int | None  # the window's devices (upper bound), when D comes from h
    honest_fraction: float | None  # None: D given
    batches: int
    failure: float  # probability that a confidence bound fails (charged to δ)


def honest_crowd(
    params: HistogramParams,
    *,
    smallest_batch: int,
    batches: int,
    window_reports: int,
    failure: float,
    honest_fraction: float = 1.0,
    dishonest_devices: int | None = None,
) -> HonestCrowd:
    """The honest others of a release's smallest batch, all but ``failure`` of the time.

    One batch (the window released whole, ``batches`` = 1): every device's reports are in
    it; k_low(T) honest devices with D given, or with D ≤ ρ·H for a share h (ρ = (1−h)/h);
    the target aside, k_low − 1 others.
    Several batches: D given, or ⌈(1 − h)·N_up⌉ with half of β spent on N_up of the
    window's ``window_reports``. In a batch of T_b reports cut by count from the stream
    (each device stored contiguously: one call), the devices meeting it are one whose
    reports straddle its start (at most 1 + m of them inside), then whole ones, the last
    possibly straddling its end; so H honest devices after the first satisfy
    X_1 + … + X_H + (1 + m)·D ≥ T_b − (1 + m), and k_low(T_b − (1 + m)) bounds H except w.p.
    β/batches (a union bound over the batches: the target may be in any); less the last
    device and the target, k_low − 2 honest others have their whole report set inside.
    """
    _count("smallest_batch", smallest_batch, least=1)
    _count("batches", batches, least=1)
    _count("window_reports", window_reports, least=1)
    _failure(failure)
    fraction: float | None = None if dishonest_devices is not None else _fraction(honest_fraction)
    if dishonest_devices is not None:
        _count("dishonest_devices", dishonest_devices)
    upper: int | None = None
    dishonest: int | None = dishonest_devices
    ratio: float | None = None
    low_failure = failure
    if fraction is not None and fraction == 0.0:
        return HonestCrowd(
            n_honest=0,
            honest_lower=0,
            dishonest=None,
            devices_upper=None,
            honest_fraction=0.0,
            batches=batches,
            failure=failure,
        )
    if fraction is not None and fraction < 1.0:
        if batches == 1:
            ratio = (1.0 - fraction) / fraction
        else:
            upper = devices_upper_bound(
                window_reports, params, failure=failure / 2.0, honest_fraction=fraction
            )
            dishonest = dishonest_share(upper, fraction)
            low_failure = failure / 2.0
    elif fraction is not None:
        dishonest = 0
    if batches == 1:
        target, edge = smallest_batch, 1
    else:
        target, edge = max(0, smallest_batch - params.max_messages), 2
    k_low = honest_lower_bound(
        target,
        params,
        failure=low_failure / batches,
        dishonest=dishonest or 0,
        dishonest_ratio=ratio,
    )
    return HonestCrowd(
        n_honest=max(0, k_low - edge),
        honest_lower=k_low,
        dishonest=dishonest,
        devices_upper=upper,
        honest_fraction=fraction,
        batches=batches,
        failure=failure,
    )
