"""The privacy statement of one release: every published number carries one.

``privacy_statement(metric, n_reports, ...)`` gathers, for one metric: local ε_1 (one
report, no trust at all), ε_∞ (RAPPOR's PRR bound) and ε_R (R reports over one memoised
PRR); central (ε, δ) after shuffling, the best valid bound within one report's hiding
crowd; longitudinal figures for R > 1 releases from the same clients. Which bound applies
and why is in ``guarantees``; this module holds the statement and its JSON and
plain-English forms. ``render()`` names its assumptions: the shuffler and aggregator do
not collude; without ``batch_sizes`` the metric's ``min_batch`` is assumed (a shuffler fed
by a trickle of clients releases batches of about that size); with ``shuffled=False``
only the local guarantees hold.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from crowdmix.aggregator.accounting.guarantees import (
    CROWD_FAILURE,
    CentralGuarantee,
    LongitudinalGuarantee,
    central_guarantee,
    estimated_crowd,
    longitudinal_guarantee,
    randomizer_for,
    segment_of,
    smallest_cohort_share,
)
from crowdmix.aggregator.accounting.history import segment_to_dict
from crowdmix.core.registry import MetricConfig

if TYPE_CHECKING:
    from crowdmix.aggregator.accounting.history import Segment
    from crowdmix.aggregator.accounting.ledger import PrivacyLedger, Release

__all__ = [
    "CentralGuarantee",
    "LongitudinalGuarantee",
    "PrivacyStatement",
    "privacy_statement",
    "record_release",
]

_BOUND_NAMES = {
    "generic": "generic stronger-clone bound (Feldman-McMillan-Talwar 2023; Wang et al. 2024)",
    "blanket": "mechanism-specific privacy-blanket bound (Balle-Bell-Gascon-Nissim 2019; "
    "Su-Cheng-Wang 2025), evaluated exactly",
    "binary-rr": "binary randomized response, every data set bounded exactly "
    "(log-concave tails over cells of the others' values), evaluated exactly",
    "none": "no amplification",
}

_ARGUMENTS = {
    "single-release": "one release",
    "memoised-prr-k": "memoised PRR: the R reports of one client are one ε_R-LDP "
    "randomizer, amplified",
    "memoised-prr-inf": "memoised PRR: every report is a post-processing of the "
    "ε_∞-LDP PRR, amplified by the best of the generic stronger-clone bound and the "
    "PRR's privacy-blanket bound (holds for any number of rounds)",
    "cohort-irr": "cohort drawn per report: cohorts whose Bloom filters of a value coincide "
    "share PRR coins, so neither one ε_∞ nor min(R, m)·ε_∞ bounds a client's reports; "
    "each report's IRR over all k bits bounds it whatever the PRRs, R·k·ε_bit, amplified",
    "basic-composition": "basic composition (Dwork-Roth 2014, Thm 3.16) of per-round figures",
    "no-bound": "no finite bound",
    "pld-composition": "fresh randomness each round: the per-round shuffle pair's "
    "privacy-loss distribution composed (dp_accounting)",
    "optimal-composition": "fresh randomness each round: optimal composition "
    "(Kairouz-Oh-Viswanath 2015) of per-round (ε, δ)",
}


def _json_float(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) or math.isnan(x) else x


@dataclass(frozen=True, slots=True, kw_only=True)
class PrivacyStatement:
    """What the analyst publishes alongside a release."""

    metric: str
    encoding: str
    n_reports: int
    delta: float
    epsilon_local: float
    epsilon_inf: float | None
    epsilon_rounds: float | None
    beta: float
    num_cohorts: int
    cohort_per_report: bool
    smallest_cohort_share: float
    cohort_share_estimated: bool
    batch_size: int
    batch_assumed: bool
    shuffled: bool = True
    central: CentralGuarantee
    longitudinal: LongitudinalGuarantee
    batch_sizes: tuple[int, ...] = ()
    fresh_randomness: bool = False
    crowd_measured: bool = False
    hashing: str = "mmh3"
    segment: Segment
    # Whether the reports reached the shuffler sealed to the aggregator (HPKE): None =
    # not known here. It changes who can learn what (``who_learns_what``), never a figure.
    sealed: bool | None = None

    @property
    def who_learns_what(self) -> dict[str, str]:
        """What each party, alone or together, can learn of one client's report."""
        e1 = f"ε_1 = {self.epsilon_local:.4g}"
        central = (
            f"the central (ε = {self.central.epsilon:.4g}, δ = {self.central.delta:.2g})"
            if self.shuffled
            else f"{e1} (the reports were not shuffled)"
        )
        sealed = {
            "shuffler": "only metadata (who connected, when, which metric and key id, how "
            "many reports): the reports are sealed to the aggregator",
            "aggregator": f"{central} of this release",
            "together": f"{e1} per report (the local guarantee)",
        }
        plaintext = {
            "shuffler": f"each report beside the connection that sent it: already {e1} "
            "per report (the reports were not sealed)",
            "aggregator": f"{central} of this release",
            "together": f"{e1} per report (the local guarantee)",
        }
        if not self.shuffled:  # no shuffler in the path: the aggregator sees each report
            return {
                "shuffler": "nothing: the reports did not pass through a shuffler",
                "aggregator": f"{e1} per report (the reports were not shuffled)",
                "together": f"{e1} per report (the local guarantee)",
            }
        if self.sealed is None:
            return {
                k: f"if the reports were sealed (the default), {sealed[k]}; "
                f"with plaintext reports, {plaintext[k]}"
                if sealed[k] != plaintext[k]
                else sealed[k]
                for k in sealed
            }
        return sealed if self.sealed else plaintext

    @property
    def cohort_caveat(self) -> str:
        if self.num_cohorts == 1:
            return "one cohort: every report of the batch hides every other"
        if self.cohort_per_report:
            return (
                f"{self.num_cohorts} cohorts drawn fresh per report: the whole batch "
                "hides each report"
            )
        if self.crowd_measured:
            return (
                f"{self.num_cohorts} persistent cohorts: a report hides only among reports of "
                "its own cohort, so amplification uses the smallest same-cohort crowd of any "
                "shuffled batch, measured when the batches were counted: "
                + _count(self.central.n_amplify, "report")
            )
        how = "estimated" if self.cohort_share_estimated else "measured"
        where = (
            f"of the smallest batch ({_count(self.batch_size, 'report')}), the exact binomial "
            "quantile for how a cohort's count varies between batches (its failure "
            "probability is charged to δ)"
            if self.cohort_share_estimated
            else "of the batch"
        )
        return (
            f"{self.num_cohorts} persistent cohorts: a report hides only among reports of "
            f"its own cohort, so amplification uses the smallest cohort's share "
            f"({self.smallest_cohort_share:.4g}, {how}) {where}: "
            + _count(self.central.n_amplify, "report")
        )

    @property
    def assumptions(self) -> list[str]:
        out = [
            "the shuffler and the aggregator do not collude, and the aggregator cannot "
            "read the shuffler's store",
            # ε0 = ε_1 and the crowd counted in reports both need one report per person:
            # k reports of one client would be ε_k-LDP and fill k places of the crowd.
            "each client sends at most one report of this metric per collection window",
        ]
        if self.longitudinal.rounds > 1:
            out.append("the same clients report in every round")
            if self.longitudinal.argument.startswith(("memoised-prr", "cohort-irr")):
                # The PRR is memoised per Bloom filter: a client whose value changes
                # gets a fresh PRR, and its rounds compose instead of sharing one.
                out.append("each client's value is the same in every round")
                # The rounds are a post-processing of one shuffle of the PRRs only when
                # each round shuffles the same clients together.
                out.append(
                    "every round shuffles the same clients together (one batch per round, "
                    "or identical batch membership)"
                )
        if self.hashing == "rappor-md5" and self.epsilon_inf is not None:
            # google/rappor's PRR is HMAC-SHA256(secret, Bloom): whoever guesses a
            # client's secret recomputes its PRR coins and strips the PRR's noise.
            out.append(
                "each client's secret has full entropy (rappor-md5 mode: the PRR is "
                "HMAC-SHA256 keyed by the secret, so a short or guessable secret voids ε_∞)"
            )
        if not self.shuffled:
            out.append("the reports were not shuffled: only local guarantees apply")
        elif self.batch_assumed:
            out.append(
                f"batch sizes unknown: the smallest batch the shuffle policy allows "
                f"({_count(self.batch_size, 'report')}) was assumed"
            )
        return out

    def to_dict(self) -> dict[str, object]:
        """JSON-ready (infinite ε becomes null)."""
        return {
            "metric": self.metric,
            "encoding": self.encoding,
            "n_reports": self.n_reports,
            "local": {
                "epsilon_1": _json_float(self.epsilon_local),
                "epsilon_inf": _json_float(self.epsilon_inf),
                "epsilon_rounds": _json_float(self.epsilon_rounds),
                "beta": self.beta,
            },
            "cohorts": {
                "num_cohorts": self.num_cohorts,
                "drawn_per_report": self.cohort_per_report,
                "smallest_share": self.smallest_cohort_share,
                "share_estimated": self.cohort_share_estimated,
                "caveat": self.cohort_caveat,
            },
            "batch": {
                "shuffled": self.shuffled,
                "smallest": self.batch_size,
                "assumed_min_batch": self.batch_assumed,
                "smallest_crowd_measured": self.crowd_measured,
                "sizes": list(self.batch_sizes),
            },
            "central": {
                "epsilon": _json_float(self.central.epsilon),
                "delta": self.central.delta,
                "bound": self.central.bound,
                "bound_description": _BOUND_NAMES.get(self.central.bound, self.central.bound),
                "amplified": self.central.amplified,
                "n_amplify": self.central.n_amplify,
                "candidates": {k: _json_float(v) for k, v in self.central.candidates.items()},
            },
            "longitudinal": {
                "rounds": self.longitudinal.rounds,
                "epsilon": _json_float(self.longitudinal.epsilon),
                "delta": self.longitudinal.delta,
                "argument": self.longitudinal.argument,
                "argument_description": _ARGUMENTS[self.longitudinal.argument],
                "candidates": {k: _json_float(v) for k, v in self.longitudinal.candidates.items()},
            },
            "assumptions": self.assumptions,
            "sealed": self.sealed,
            "who_learns_what": self.who_learns_what,
        }

    def to_release(self, *, release_id: str, window: int, mechanism: str | None = None) -> Release:
        """The ledger entry of this release: its own cost (ε over its own rounds)
        and the segment the ledger composes with every other release."""
        from crowdmix.aggregator.accounting.ledger import Release

        lg = self.longitudinal
        return Release(
            release_id=release_id,
            window=window,
            n_reports=self.n_reports,
            mechanism=mechanism or self.encoding,
            epsilon=lg.epsilon,
            delta=lg.delta,
            fresh_randomness=self.fresh_randomness,
            bound=self.central.bound,
            batch_sizes=self.batch_sizes,
            rounds=lg.rounds,
            segment=segment_to_dict(self.segment),
            extra={"argument": lg.argument, "n_amplify": self.central.n_amplify},
        )

    def render(self) -> str:
        """A plain-English paragraph an analyst can quote."""
        c, lg = self.central, self.longitudinal
        local = f"Each report is {self.epsilon_local:.4g}-locally differentially private on its own"
        if self.epsilon_inf is not None and not math.isinf(self.epsilon_inf):
            local += (
                f", and any number of reports of one value by one client stay within "
                f"ε_∞ = {self.epsilon_inf:.4g} (memoised permanent randomized response)"
            )
        local += "; this holds even if every server is compromised."
        if not self.shuffled:
            # No shuffler, no batch, no crowd: the local figures are the whole statement.
            return (
                local + " These reports were not shuffled, so no central figure smaller than "
                f"ε_1 = {self.epsilon_local:.4g} per report is claimed."
            )
        release = (
            f"each of these {lg.rounds} releases"
            if lg.rounds > 1
            else f"this release of {_count(self.n_reports, 'report')}"
        )
        if c.amplified:
            central = (
                f" Shuffling hides each report among others: if the shuffler and the "
                f"aggregator do not collude, {release} "
                f"satisfies (ε = {c.epsilon:.4g}, δ = {c.delta:.2g})-differential privacy "
                f"by the {_BOUND_NAMES.get(c.bound, c.bound)}."
            )
        else:
            central = (
                f" Shuffling {_count(c.n_amplify, 'report')} is too few to improve on the local "
                f"guarantee (no amplification): the release is {c.epsilon:.4g}-differentially "
                "private."
            )
        cohort = f" Cohorts: {self.cohort_caveat}."
        if not self.shuffled:
            batch = " These reports were not shuffled, so only the local guarantee applies."
        elif self.batch_assumed:
            batch = (
                " The batch sizes were not given, so this assumes the smallest batch the "
                f"shuffle policy allows ({_count(self.batch_size, 'report')}); with the actual "
                "sizes the figure is usually smaller."
            )
        else:
            batch = f" The smallest shuffled batch held {_count(self.batch_size, 'report')}."
        text = local + central + cohort + batch
        if lg.rounds > 1:
            text += (
                f" Over {lg.rounds} releases from the same clients the total is "
                f"(ε = {lg.epsilon:.4g}, δ = {lg.delta:.2g}) "
                f"({_ARGUMENTS[lg.argument].replace('ε_R', f'ε_{lg.rounds}')})."
            )
        who = self.who_learns_what
        text += (
            f" Who can learn what: the shuffler alone learns {who['shuffler']}; the "
            f"aggregator alone gets {who['aggregator']}; the two together get {who['together']}."
        )
        return text + " This assumes that " + "; that ".join(self.assumptions) + "."


def _count(n: int, word: str) -> str:
    """``"1 report"``, ``"1,000 reports"``."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def privacy_statement(
    metric: MetricConfig,
    n_reports: int,
    *,
    delta: float = 1e-6,
    cohort_sizes: Sequence[int] | float | None = None,
    cohort_per_report: bool = False,
    batch_sizes: Sequence[int] | None = None,
    rounds: int = 1,
    shuffled: bool = True,
    smallest_crowd: int | None = None,
) -> PrivacyStatement:
    """The privacy statement of a release of ``n_reports`` reports of ``metric``.

    cohort_sizes: reports per cohort (e.g. ``CohortCounts.totals``) or the
        smallest cohort's share of the batch; omitted, it is estimated by the
        exact binomial quantile of a uniform cohort draw, whose failure
        probability is charged to δ (``guarantees.estimated_crowd``).
    cohort_per_report: the cohort is drawn fresh per report (no cohort caveat).
    batch_sizes: sizes of the shuffled batches the release came from; the
        smallest one is the crowd. Omitted: the smallest batch the metric's
        shuffle policy allows, min(n_reports, shuffle.min_batch).
    shuffled: False for reports that never went through a shuffler (e.g.
        google/rappor files): no amplification, local guarantees only.
    rounds: releases from the same clients (windows) covered by the
        longitudinal figure.
    smallest_crowd: the fewest same-cohort reports in any of the batches, as
        the aggregator measured them (``CountStore.smallest_crowd``); when given
        it is the number of reports each one hides among, instead of an estimate.
    """
    from crowdmix.aggregator.accounting import local

    if isinstance(n_reports, bool) or not isinstance(n_reports, int) or n_reports < 1:
        raise ValueError(f"n_reports must be a positive integer, got {n_reports!r}")
    if metric.histogram is not None:
        raise ValueError(
            f"metric {metric.name!r} is a shuffled histogram: its statement is "
            "aggregator.accounting.histogram_release (crowdmix report, crowdmix privacy metric)"
        )
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    if batch_sizes is not None:
        batches = [int(b) for b in batch_sizes]
        if not batches or min(batches) < 1 or sum(batches) != n_reports:
            raise ValueError("batch_sizes must be positive and sum to n_reports")
        batch = min(batches)
    else:
        batches = []
        batch = min(n_reports, metric.shuffle.min_batch)
    # An estimated crowd fails (some cohort of some batch holds fewer reports than
    # n_amp) with probability at most crowd_failure per round, charged to δ: the
    # cohorts are drawn independently of the values, so the release is
    # (ε, δ_amp + crowd_failure)-DP. n_amp is the exact binomial quantile at
    # crowd_failure/(m·batches), a union bound over every cohort of every batch.
    crowd_failure = 0.0
    count_probability = 0.0
    if cohort_sizes is None or batch == n_reports:
        # Sizes unknown: estimate the smallest cohort of the batch itself.
        sized = batch if cohort_sizes is None else n_reports
        share, estimated = smallest_cohort_share(metric, sized, cohort_sizes, cohort_per_report)
        n_amp = max(1, math.floor(share * batch + 1e-9))
        count_probability = 1.0 / metric.num_cohorts
    else:
        # Shares measured over the release, applied to a smaller batch: a batch's
        # cohort counts scatter around share·batch (more for a larger share).
        share, _ = smallest_cohort_share(metric, n_reports, cohort_sizes, cohort_per_report)
        estimated = share < 1.0
        count_probability = share
        n_amp = max(1, math.floor(share * batch + 1e-9))  # exact when share = 1
    if estimated and shuffled and smallest_crowd is None:
        n_batches = len(batches) if batches else math.ceil(n_reports / batch)
        crowd_failure = CROWD_FAILURE * delta
        n_amp = estimated_crowd(
            batch, count_probability, crowd_failure / (metric.num_cohorts * n_batches)
        )
        share = n_amp / batch
    crowd_measured = smallest_crowd is not None and not cohort_per_report
    if crowd_measured:
        # Measured at ingest: the fewest same-cohort reports any batch held. Exact,
        # so it replaces the estimate above (and needs no allowance in δ).
        assert smallest_crowd is not None
        if isinstance(smallest_crowd, bool) or not isinstance(smallest_crowd, int):
            raise ValueError(f"smallest_crowd must be an integer, got {smallest_crowd!r}")
        if not 1 <= smallest_crowd <= batch:
            raise ValueError(
                f"smallest_crowd must be in [1, smallest batch = {batch}], got {smallest_crowd}"
            )
        n_amp = smallest_crowd
        share, estimated = smallest_crowd / batch, False
    if not shuffled:
        n_amp = 1  # unshuffled reports hide among nobody: every bound returns ε0

    if metric.rappor is not None:
        params = metric.rappor
        eps1 = local.epsilon_one(params)
        eps_inf: float | None = local.epsilon_inf(params)
        eps_rounds: float | None = local.epsilon_k(params, rounds)
        beta = local.total_variation(params)
        fresh = params.f == 0.0
    else:
        assert metric.basic is not None  # MetricConfig guarantees one of the two
        eps1 = local.basic_epsilon(metric.basic)
        eps_inf, eps_rounds = None, None
        beta = local.basic_total_variation(metric.basic)
        fresh = True
    if crowd_measured or not shuffled:
        crowd_failure = 0.0
    amp_delta = delta - crowd_failure
    if math.isinf(eps1):
        central = CentralGuarantee(
            epsilon=math.inf, delta=delta, bound="none", amplified=False, n_amplify=n_amp
        )
    else:
        randomizer = randomizer_for(metric, cohort_per_report)
        central = central_guarantee(eps1, n_amp, amp_delta, randomizer)
        central = dataclasses.replace(central, delta=delta)  # + crowd_failure

    segment = segment_of(
        metric, rounds, n_amp, amp_delta, eps1, beta, cohort_per_report, crowd_failure
    )
    longitudinal = longitudinal_guarantee(central, segment)
    return PrivacyStatement(
        metric=metric.name,
        encoding=metric.encoding,
        n_reports=n_reports,
        delta=delta,
        epsilon_local=eps1,
        epsilon_inf=eps_inf,
        epsilon_rounds=eps_rounds,
        beta=beta,
        num_cohorts=metric.num_cohorts,
        cohort_per_report=cohort_per_report,
        smallest_cohort_share=share,
        cohort_share_estimated=estimated,
        batch_size=batch,
        batch_assumed=batch_sizes is None,
        shuffled=shuffled,
        central=central,
        longitudinal=longitudinal,
        batch_sizes=tuple(batches),
        fresh_randomness=fresh,
        crowd_measured=crowd_measured,
        hashing=metric.hashing,
        segment=segment,
    )


def record_release(
    ledger: PrivacyLedger,
    metric: MetricConfig,
    n_reports: int,
    *,
    release_id: str,
    window: int,
    delta: float = 1e-6,
    cohort_sizes: Sequence[int] | float | None = None,
    cohort_per_report: bool = False,
    batch_sizes: Sequence[int] | None = None,
    shuffled: bool = True,
    attempts: int = 3,
    smallest_crowd: int | None = None,
    rounds: int = 1,
    content: str | None = None,
    sealed: bool | None = None,
) -> tuple[PrivacyStatement, tuple[float, float]]:
    """Statement for the next release of ``metric`` and its ledger entry, in one step.

    ``rounds`` is the number of collection windows this release merges: each is
    a round for every client in it. ``content`` identifies the data released (the
    windows and counts): the ledger records a release of the same content once,
    whatever its id (``DuplicateReleaseError``). ``sealed`` goes to the statement.
    The statement covers this release's own rounds; the ledger composes its segment
    with every earlier release's (``history.compose_segments``) for the total. Raises
    BudgetExceededError (nothing recorded) when the total would exceed the budget;
    retries when another writer appended in between.
    """
    from crowdmix.aggregator.accounting.ledger import ConcurrentUpdateError

    stmt = privacy_statement(
        metric,
        n_reports,
        delta=delta,
        cohort_sizes=cohort_sizes,
        cohort_per_report=cohort_per_report,
        batch_sizes=batch_sizes,
        rounds=rounds,
        shuffled=shuffled,
        smallest_crowd=smallest_crowd,
    )
    if sealed is not None:
        stmt = dataclasses.replace(stmt, sealed=sealed)
    release = stmt.to_release(release_id=release_id, window=window)
    if content is not None:
        release = dataclasses.replace(release, extra={**release.extra, "content": content})
    for attempt in range(attempts):
        try:
            total = ledger.record(metric.name, release)
        except ConcurrentUpdateError:
            if attempt == attempts - 1:
                raise
            continue
        return stmt, total
    raise AssertionError("unreachable")  # the loop returns or raises
