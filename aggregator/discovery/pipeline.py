"""A discovery through the real pipeline: the round job between windows.

``open_discovery`` serves round 0 in a window (the round file, ``core.rounds``);
``step_discovery`` decodes the round whose window is over from the aggregator's
counts of that window (``job.absorb``), records the round in the ledger (one segment
per round, its device group a group of the discovery's partition: parallel
composition; its crowd the smaller of ``min_batch`` and the smallest stored batch, so a
batch stored later is covered too), then serves the next round in a later window, or
after the value round returns the result table and the guarantee. The job's own state
(harvest, parents, costs, each round's window) is a JSON file next to the round file,
never served.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from crowdmix.aggregator.accounting.discovery import DiscoveryGuarantee, RoundCost
from crowdmix.aggregator.discovery.job import (
    DiscoverySettings,
    absorb,
    cells_bound,
    round_params,
    settings_of,
)
from crowdmix.aggregator.discovery.plan import DiscoveredValues, DiscoveryState
from crowdmix.core.registry import MetricConfig, Registry
from crowdmix.core.rounds import ServedRound, read_rounds, write_rounds

__all__ = [
    "DiscoveryError",
    "JobState",
    "StepResult",
    "open_discovery",
    "read_state",
    "step_discovery",
]


class DiscoveryError(ValueError):
    """The round job cannot go on (what to do is in the message)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobState:
    """The job's state file: the metric (and its params' fingerprint), the discovery's
    id (the ledger's partition), each opened round's window and the decode state."""

    metric: str
    fingerprint: int
    discovery: str
    windows: tuple[int, ...]
    state: DiscoveryState

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "fingerprint": f"{self.fingerprint:016x}",
            "discovery": self.discovery,
            "windows": list(self.windows),
            "state": self.state.to_dict(),
        }


def read_state(path: str | os.PathLike[str]) -> JobState:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        job = JobState(
            metric=str(data["metric"]),
            fingerprint=int(data["fingerprint"], 16),
            discovery=str(data["discovery"]),
            windows=tuple(int(w) for w in data["windows"]),
            state=DiscoveryState.from_dict(data["state"]),
        )
        # one window per opened round: the round in progress (if any) and those before
        r = job.state.next_round
        if r < 0 or len(job.windows) not in (r, r + 1) or not job.windows:
            raise ValueError(f"{len(job.windows)} round windows for next round {r}")
        return job
    except FileNotFoundError:
        raise DiscoveryError(
            f"no discovery state at {p}: start one with `crowdmix discover open`"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DiscoveryError(f"cannot read {p}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise DiscoveryError(f"{p} is not a discovery state: {exc}") from None


def _write_state(path: str | os.PathLike[str], job: JobState) -> None:
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(job.to_dict(), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, p)


def _heavy(metric: MetricConfig) -> DiscoverySettings:
    if metric.heavy_hitters is None:
        raise DiscoveryError(
            f"metric {metric.name!r} is {metric.encoding}, not a heavy-hitters metric"
        )
    try:
        cells_bound(metric.heavy_hitters, metric.shuffle.min_batch)  # every round is planned
        return settings_of(metric.heavy_hitters, metric.shuffle.min_batch)
    except ValueError as exc:  # no local ε0 meets the target over a group
        raise DiscoveryError(f"metric {metric.name!r}: {exc}") from None


def _serve(rounds_file: str | os.PathLike[str], metric: MetricConfig, served: ServedRound) -> None:
    book = read_rounds(rounds_file)
    write_rounds(rounds_file, book.with_round(metric.name, metric.fingerprint, served))


def open_discovery(
    registry: Registry,
    metric: MetricConfig,
    *,
    rounds_file: str | os.PathLike[str],
    state_file: str | os.PathLike[str],
    now: float,
    window: int | None = None,
) -> ServedRound:
    """Serve round 0 in ``window`` (default: the next window; never one that has
    begun before now) and write a new state file (refused if one exists)."""
    settings = _heavy(metric)
    current = registry.window_of(now)
    w = current + 1 if window is None else window
    if w < current:
        raise DiscoveryError(f"window {w} is over (the current window is {current})")
    if Path(state_file).exists():
        raise DiscoveryError(
            f"{state_file} exists: a discovery is under way (remove the file to start over)"
        )
    state = DiscoveryState()
    served = ServedRound.of(0, w, w, round_params(settings, state))
    _serve(rounds_file, metric, served)
    job = JobState(
        metric=metric.name,
        fingerprint=metric.fingerprint,
        discovery=f"{metric.name}/discovery-{w}",
        windows=(w,),
        state=state,
    )
    _write_state(state_file, job)
    return served


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """One round decoded: its reports (and those outside its index range, ignored; and
    ``other_round``, those the aggregator dropped as naming another round: a shuffler
    served another round file), its cost, the next round served (None after the value
    round), and after the value round the table and the guarantee. ``epsilon``: the
    round's central ε over its smallest stored batch; ``stated_epsilon``: over its cost's
    crowd (what the ledger records, covering any batch of at least ``min_batch`` stored
    later)."""

    round: int
    window: int
    reports: int
    outside: int
    other_round: int
    epsilon: float
    stated_epsilon: float
    target: float
    min_batch: int
    cost: RoundCost
    served: ServedRound | None
    table: DiscoveredValues | None
    guarantee: DiscoveryGuarantee | None
    ledger: dict[str, Any] | None
    costs: tuple[tuple[int, int, int, float], ...]


def _round_epsilon(cost: RoundCost, settings: DiscoverySettings) -> float:
    """One round's central ε over its cost's crowd (its ε0 when that is smaller)."""
    from crowdmix.aggregator.accounting.amplification import best_amplification

    if not cost.n_reports:
        return 0.0
    amp = best_amplification(cost.epsilon0, cost.n_reports, settings.delta, cost.randomizer())
    return min(amp.result.epsilon, cost.epsilon0)


def step_discovery(
    registry: Registry,
    metric: MetricConfig,
    store: Any,
    *,
    rounds_file: str | os.PathLike[str],
    state_file: str | os.PathLike[str],
    now: float,
    window: int | None = None,
    ledger: Any = None,
    accept_over_target: bool = False,
) -> StepResult:
    """Decode the round in progress from ``store`` (a ``CountStore``), once its window
    is over and counted; then serve the next round in ``window`` (default: the next
    window) or finish. ``ledger`` (a ``PrivacyLedger``) records the round first: a
    refused release changes nothing. A round whose smallest stored batch is above the
    target (fewer than ``min_batch`` reports: the shuffler did not enforce it) is refused
    unless ``accept_over_target`` (then recorded with its true figure)."""
    from crowdmix.aggregator.accounting.discovery import round_segment
    from crowdmix.aggregator.accounting.history import segment_to_dict
    from crowdmix.aggregator.accounting.ledger import Release
    from crowdmix.aggregator.store import load_batch_sizes, load_counts

    settings = _heavy(metric)
    job = read_state(state_file)
    if job.metric != metric.name or job.fingerprint != metric.fingerprint:
        raise DiscoveryError(
            f"{state_file} is a discovery of {job.metric!r} under other params: the "
            "registry entry changed since it was opened (remove the file to start over)"
        )
    r = job.state.next_round
    if r >= settings.plan.rounds:
        raise DiscoveryError(f"the discovery in {state_file} is finished")
    w = job.windows[r]
    current = registry.window_of(now)
    if current <= w:
        raise DiscoveryError(
            f"round {r}'s window {w} is not over (the current window is {current})"
        )
    params = round_params(settings, job.state)
    served = read_rounds(rounds_file).round_of(metric.name, metric.fingerprint, w)
    if served is None or served != ServedRound.of(r, w, job.windows[0], params):
        raise DiscoveryError(
            f"the round file {rounds_file} does not serve round {r} in window {w} as this "
            "job planned it: it was changed by hand or belongs to another discovery"
        )
    sizes = load_batch_sizes(store, metric.name, [w])
    other_round = store.dropped_reports(metric.name, [w]).get("round", 0)
    if not sizes:
        raise DiscoveryError(
            f"window {w} of {metric.name!r} has no counts yet: its shuffler releases it "
            "whole once it is closed (window_tolerance windows after it, plus "
            "release_grace_seconds); run this again then"
            + (f" ({other_round:,} reports of it were dropped as naming another round: a "
               "shuffler serves another round file)" if other_round else "")
        )  # fmt: skip
    ones = np.asarray(load_counts(store, metric, [w]).ones).reshape(-1)
    if ones.size != cells_bound(metric.heavy_hitters, settings.min_batch):  # type: ignore[arg-type]
        raise DiscoveryError(f"stored counts of window {w} have {ones.size} cells")
    counts = ones[: params.cells]
    outside = int(ones[params.cells :].sum())
    # the round's shuffles: one batch per shuffler, each over disjoint devices, so the
    # round is as private as its smallest batch (parallel composition). Every batch any
    # shuffler releases, now or later, holds at least min_batch reports (its release
    # rule), and ε0 was planned over min_batch: the ledger's crowd is the smaller of the
    # two, never more than a batch that may still arrive.
    smallest = min(sizes)
    outcome = absorb(settings, job.state, counts, crowd=min(smallest, settings.min_batch))
    cost = outcome.cost
    actual = _round_epsilon(replace(cost, n_reports=min(smallest, int(counts.sum()))), settings)
    stated = _round_epsilon(cost, settings)
    if max(actual, stated) > settings.epsilon and not accept_over_target:
        raise DiscoveryError(
            f"round {r} of {metric.name!r} is above its target: ε = {max(actual, stated):.4g} > "
            f"{settings.epsilon:g}, its smallest batch holds {smallest} reports, fewer than "
            f"min_batch = {settings.min_batch} (a shuffler did not enforce it); nothing was "
            "recorded or served (accept it with --accept-over-target: the ledger records "
            "its true figure)"
        )
    state = outcome.state
    next_served = None
    if outcome.table is None:  # planned before anything is recorded or written
        nxt = current + 1 if window is None else window
        if nxt < current or nxt <= w:
            raise DiscoveryError(f"the next round's window {nxt} has begun before now")
        try:
            next_params = round_params(settings, state)
        except ValueError as exc:  # nothing complete was found: no value round
            raise DiscoveryError(str(exc)) from None
        next_served = ServedRound.of(state.next_round, nxt, job.windows[0], next_params)
    recorded = None
    if ledger is not None:
        from crowdmix.aggregator.accounting.ledger import DuplicateReleaseError

        content = hashlib.sha256(
            f"{metric.name}|{metric.fingerprint:016x}|{w}|".encode()
            + np.ascontiguousarray(counts, dtype="<i8").tobytes()
        ).hexdigest()[:32]
        release = Release(
            release_id=f"{job.discovery}/round-{r}",
            window=w,
            n_reports=int(counts.sum()),
            mechanism="heavy-hitters",
            epsilon=stated,
            delta=settings.delta,
            fresh_randomness=True,
            batch_sizes=tuple(sizes),
            segment=segment_to_dict(round_segment(cost, settings.delta, job.discovery)),
            extra={
                "content": content,
                "round": r,
                "discovery": job.discovery,
                "min_batch": settings.min_batch,
                "crowd": cost.n_reports,
                "smallest_batch": smallest,
                "smallest_batch_epsilon": actual,
                "statement": (
                    f"every batch of this round holds at least min_batch = "
                    f"{settings.min_batch} reports (the shuffler's release rule), each of "
                    f"disjoint devices: each, and the round, is (ε, δ)-DP with ε at most "
                    f"this release's, over a crowd of {cost.n_reports}, whenever it arrives"
                ),
            },
        )
        try:
            eps, delta = ledger.record(metric.name, release)
            fresh = True
        except DuplicateReleaseError:  # a re-run after a failure below: recorded once
            before = [x for x in ledger.releases(metric.name) if x.release_id == release.release_id]
            if any(x.extra.get("content") != content for x in before):
                raise DiscoveryError(
                    f"the ledger holds {release.release_id!r} for other counts of window {w}: "
                    "this is not a re-run of that round (a discovery reopened in its window); "
                    "nothing was recorded or served"
                ) from None
            eps, delta = ledger.spent(metric.name)
            fresh = False
        recorded = {
            "release_id": release.release_id,
            "recorded": fresh,
            "total_epsilon": eps,
            "total_delta": delta,
            "releases": len(ledger.releases(metric.name)),
        }
    windows = job.windows
    if next_served is not None:
        _serve(rounds_file, metric, next_served)
        windows = (*windows, next_served.window)
    _write_state(
        state_file,
        JobState(
            metric=job.metric,
            fingerprint=job.fingerprint,
            discovery=job.discovery,
            windows=windows,
            state=state,
        ),
    )
    return StepResult(
        round=r,
        window=w,
        reports=int(counts.sum()),
        outside=outside,
        other_round=other_round,
        epsilon=actual,
        stated_epsilon=stated,
        target=settings.epsilon,
        min_batch=settings.min_batch,
        cost=cost,
        served=next_served,
        table=outcome.table,
        guarantee=outcome.guarantee,
        ledger=recorded,
        costs=state.costs,
    )
