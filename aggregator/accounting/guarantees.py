"""Which guarantee applies to a release: the crowd, the best central bound, and
the longitudinal argument. Pure (no state); numpy/scipy load lazily.

- Crowd: the smallest cohort's share of the smallest batch (a persistent cohort travels
  with the report), or when sizes are unknown the exact binomial quantile at failure
  probability CROWD_FAILURE·δ/(m·batches), charged to δ once per round.
- Central: the best of the generic stronger-clone bound (Wang et al., VLDB 2024,
  Lemma 4.4) and, for k-RR, OLH, OUE and a RAPPOR report, the privacy-blanket bound
  (``blanket``); the (p, β, q) variation-ratio pair is not used (pairs.py). Within 0.1%
  of ε0 is reported as "no amplification".
- Longitudinal, R rounds (``history``): a memoised PRR is bounded by amplifying ε_R or
  ε_∞ (per-report cohorts: the IRR over all k bits); fresh randomness composes the
  per-round PLDs, or per-round (ε, δ/2R) by optimal composition for large n.
Arguments: docs/design.md, "Aggregator: accounting".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from crowdmix.core.registry import MetricConfig

if TYPE_CHECKING:
    from crowdmix.aggregator.accounting.history import Segment
    from crowdmix.aggregator.accounting.randomizers import Randomizer

__all__ = [
    "COHORT_SD",
    "CROWD_FAILURE",
    "CentralGuarantee",
    "LongitudinalGuarantee",
    "central_guarantee",
    "estimated_crowd",
    "longitudinal_guarantee",
    "randomizer_for",
    "segment_of",
    "smallest_cohort_share",
]

# Cohort-count estimate when sizes are unknown: the mean minus this many sd.
COHORT_SD = 5.0
# Share of δ an estimated crowd may fail with, per round (statement.privacy_statement).
CROWD_FAILURE = 1e-3


@dataclass(frozen=True, slots=True, kw_only=True)
class CentralGuarantee:
    """(ε, δ) of one shuffled release, the bound it came from, and every bound tried."""

    epsilon: float
    delta: float
    bound: str
    amplified: bool
    n_amplify: int
    candidates: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class LongitudinalGuarantee:
    """(ε, δ) of ``rounds`` releases together and the argument that gives it."""

    rounds: int
    epsilon: float
    delta: float
    argument: str
    candidates: dict[str, float] = field(default_factory=dict)


def smallest_cohort_share(
    metric: MetricConfig,
    n_reports: int,
    cohort_sizes: Sequence[int] | float | None,
    per_report: bool,
) -> tuple[float, bool]:
    """(smallest cohort's share of the reports, whether it is an estimate)."""
    m = metric.num_cohorts
    if m == 1 or per_report:
        return 1.0, False
    if cohort_sizes is None:
        mean = n_reports / m
        low = max(1.0, mean - COHORT_SD * math.sqrt(mean * (1.0 - 1.0 / m)))
        return min(1.0, low / n_reports), True
    if isinstance(cohort_sizes, int | float) and not isinstance(cohort_sizes, bool):
        share = float(cohort_sizes)
        if not 0.0 < share <= 1.0:
            raise ValueError(f"cohort share must be in (0, 1], got {cohort_sizes!r}")
        return share, False
    sizes = [int(s) for s in cohort_sizes]  # type: ignore[union-attr]
    if any(s < 0 for s in sizes):
        raise ValueError("cohort sizes must be non-negative")
    if len(sizes) > m:
        raise ValueError(f"got {len(sizes)} cohort sizes for a metric with {m} cohorts")
    if sum(sizes) != n_reports:
        raise ValueError(f"cohort sizes sum to {sum(sizes)}, not n_reports={n_reports}")
    # An empty cohort holds nobody to protect; the smallest non-empty one is the crowd.
    nonempty = [s for s in sizes if s > 0]
    return (min(nonempty) / n_reports if nonempty else 1.0), False


def estimated_crowd(batch: int, probability: float, failure: float) -> int:
    """Largest x with Pr[Bin(batch, probability) < x] ≤ failure (at least 1): the
    exact binomial quantile, so a cohort holds fewer than x reports w.p. ≤ failure."""
    from scipy.stats import binom

    if probability >= 1.0:
        return batch
    x = int(binom.ppf(failure, batch, probability))
    # ppf: smallest x with CDF(x) ≥ failure, so CDF(x − 1) < failure; guard float slack.
    while x > 1 and float(binom.cdf(x - 1, batch, probability)) > failure:
        x -= 1
    return max(1, x)


def central_guarantee(
    epsilon0: float, n: int, delta: float, randomizer: Randomizer | None = None
) -> CentralGuarantee:
    """Shuffle bound for n reports of an ε0-LDP randomizer: the best of the generic
    stronger clone and, for a known ``randomizer``, its blanket bound
    (``amplification.best_amplification``, the one place that picks)."""
    from crowdmix.aggregator.accounting.amplification import best_amplification

    best = best_amplification(epsilon0, n, delta, randomizer)
    cands = best.candidates
    name = min(cands, key=lambda k: cands[k])
    eps = cands[name]
    amplified = eps < epsilon0 * (1.0 - 1e-3)
    return CentralGuarantee(
        epsilon=eps if amplified else epsilon0,
        delta=delta,
        bound=name if amplified else "none",
        amplified=amplified,
        n_amplify=n,
        candidates=cands,
    )


def randomizer_for(metric: MetricConfig, cohort_per_report: bool) -> Randomizer | None:
    """The randomizer of one report of ``metric`` for the blanket bound, or None.

    None for RAPPOR with a cohort drawn per report and m > 1: each report then
    carries a random cohort whose Bloom sets differ, which the bit-vector
    argument does not cover (the generic bound does)."""
    from crowdmix.aggregator.accounting.randomizers import randomizer_of

    if metric.rappor is not None and cohort_per_report and metric.rappor.m > 1:
        return None
    return randomizer_of(basic=metric.basic, rappor=metric.rappor)


def segment_of(
    metric: MetricConfig,
    rounds: int,
    n_amp: int,
    delta: float,
    eps1: float,
    beta: float,
    cohort_per_report: bool,
    crowd_failure: float = 0.0,
) -> Segment:
    """The ``history.Segment`` of a release: what it adds to the metric's total."""
    from crowdmix.aggregator.accounting.history import Segment

    return Segment(
        rounds=rounds,
        n_amplify=n_amp,
        delta=delta,
        epsilon0=eps1,
        beta=beta,
        rappor=metric.rappor,
        basic=metric.basic,
        hashing=metric.hashing,
        cohort_per_report=cohort_per_report and metric.num_cohorts > 1,
        crowd_failure=crowd_failure,
    )


def longitudinal_guarantee(central: CentralGuarantee, segment: Segment) -> LongitudinalGuarantee:
    """The bound on ``segment.rounds`` rounds together, and its argument
    (``history.compose_segments`` of this one segment: the ledger composes many)."""
    from crowdmix.aggregator.accounting.history import compose_segments

    rounds = segment.rounds
    if rounds == 1:
        return LongitudinalGuarantee(
            rounds=1,
            epsilon=central.epsilon,
            delta=central.delta,
            argument="single-release",
            candidates={"single-release": central.epsilon},
        )
    composed = compose_segments([segment])
    return LongitudinalGuarantee(
        rounds=rounds,
        epsilon=composed.epsilon,
        delta=composed.delta,
        argument=composed.argument if not math.isinf(composed.epsilon) else "single-release",
        candidates=composed.candidates,
    )
