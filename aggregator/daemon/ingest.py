"""Ingest: validate a shuffled batch against the registry, count it, apply it once.

The aggregator service's domain logic, free of gRPC: the servicer
(:mod:`crowdmix.aggregator.daemon.service`) converts the wire ``Batch`` into an
:class:`IngestBatch` and calls :meth:`Ingestor.ingest`. Validation happens entirely
before the store is touched (a rejected batch leaves no trace); counting is one numpy
pass (``crowdmix.aggregator.counting.counts.accumulator_for``); then
``CountStore.apply_reports`` adds the counts and records the batch id and report ids
atomically, so a batch applied before is a duplicate counted zero times and a report
whose id was counted before in its window is dropped (per metric, window, report id).
Sealed batches take the same path after opening, failed reports dropped and counted by
reason (``IngestResult.dropped``). A heavy-hitters report must name its window's round in
the round file (``daemon.rounds``), else its clear batch is refused, or the sealed
report dropped (reason ``round``). :meth:`Ingestor.dispose_ids` deletes a window's ids
past retention. Details: docs/design.md, "Aggregator: daemon".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.counting.counts import Counts, CountsShapeError
from crowdmix.aggregator.daemon.rounds import RoundFile
from crowdmix.aggregator.errors import ConfigError, InvalidBatch, ParamsConflict
from crowdmix.aggregator.sealing.ingest import KeyFile, SealedBatch, screen
from crowdmix.aggregator.store.base import REPORT_ID_BYTES, CountStore, ReportIds
from crowdmix.aggregator.store.codec import describe_metric, params_difference
from crowdmix.core.registry import MAX_BATCH_REPORTS as _MAX_BATCH_REPORTS
from crowdmix.core.registry import MetricConfig, Registry

log = logging.getLogger("crowdmix.aggregator")

__all__ = [
    "BATCH_ID_BYTES",
    "MAX_BATCH_REPORTS",
    "IngestBatch",
    "IngestResult",
    "Ingestor",
]

BATCH_ID_BYTES = 16
# A batch is counted in one piece in memory; the bound is shared with the registry,
# which refuses a metric released per window whose window would not fit one batch.
MAX_BATCH_REPORTS = _MAX_BATCH_REPORTS


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestBatch:
    """A shuffled batch as the domain sees it (already out of its protobuf)."""

    batch_id: bytes
    window: int
    metric: str
    fingerprint: int
    count: int
    report_bytes: int
    cohorts: npt.NDArray[Any]
    bits: bytes
    report_ids: bytes  # count × 16 bytes, none all zero


@dataclass(frozen=True, slots=True)
class IngestResult:
    applied: int  # reports counted by this call
    duplicate: bool  # the batch id had been applied before: counted zero times
    duplicate_reports: int = 0  # reports dropped: their id was counted before in the window
    dropped: dict[str, int] | None = None  # sealed: reports dropped, by reason


class Ingestor:
    """Validates, counts and applies batches to a :class:`CountStore`."""

    def __init__(
        self,
        registry: Registry,
        store: CountStore,
        *,
        clock: Callable[[], float] = time.time,
        accumulator: Callable[[MetricConfig], Counts] = accumulator_for,
        keys: KeyFile | None = None,
        rounds: RoundFile | None = None,
    ) -> None:
        if keys is None:
            hist = sorted(n for n, m in registry.metrics.items() if m.requires_sealing)
            if hist:
                raise ConfigError(
                    f"metric {hist[0]!r} is a shuffled histogram and needs sealed reports: "
                    "start the aggregator with --keys (its key set), or remove it"
                )
        for name, metric in registry.metrics.items():
            if metric.heavy_hitters is not None:
                from crowdmix.aggregator.discovery.job import cells_bound

                try:  # every round's ε0 is planned from the target: one must exist
                    cells_bound(metric.heavy_hitters, metric.shuffle.min_batch)
                except ValueError as exc:
                    raise ConfigError(f"metric {name!r}: {exc}") from None
                if rounds is None:
                    raise ConfigError(
                        f"metric {name!r} is a heavy-hitters metric: start the aggregator "
                        "with --rounds-file (the round file crowdmix discover writes), so it "
                        "counts each window's reports against the round that window serves"
                    )
        self.rounds = rounds
        self.registry = registry
        self.keys = keys  # opens sealed batches; None: sealed batches are refused
        self.store = store
        self._clock = clock
        self._accumulator = accumulator
        self._descriptions: dict[str, str] = {}

    def _check_batch(self, batch: IngestBatch | SealedBatch) -> MetricConfig:
        """Batch-level checks shared by clear and sealed batches (id, window, metric)."""
        if len(batch.batch_id) != BATCH_ID_BYTES:
            raise InvalidBatch(
                f"batch_id must be {BATCH_ID_BYTES} bytes, got {len(batch.batch_id)}",
                reason="batch_id",
            )
        # Clocks of shuffler and aggregator may differ a little; a later window is garbage.
        now_window = self.registry.window_of(self._clock())
        if batch.window > now_window + 1:
            raise InvalidBatch(
                f"window {batch.window} is in the future (current window {now_window})",
                reason="window",
            )
        config = self.registry.get(batch.metric)
        if config is None:
            raise InvalidBatch(f"unknown metric {batch.metric!r}", reason="unknown_metric")
        if batch.count < 1:
            raise InvalidBatch("empty batch", reason="empty")
        if batch.count > MAX_BATCH_REPORTS:
            raise InvalidBatch(
                f"batch of {batch.count} reports exceeds {MAX_BATCH_REPORTS}", reason="too_large"
            )
        if self.window_disposed(config, batch.window):
            raise InvalidBatch(
                f"window {batch.window} of metric {batch.metric!r} is older than its "
                f"disposal_days ({config.shuffle.disposal_days}) plus one window: its ids "
                "are deleted, so it cannot be counted exactly once",
                reason="window_disposed",
            )
        return config

    def validate(self, batch: IngestBatch) -> tuple[MetricConfig, Counts]:
        """The batch's metric config and its counts; raises InvalidBatch with the reason."""
        config = self.check_header(batch)
        return config, self.count(batch, config)

    def check_header(self, batch: IngestBatch) -> MetricConfig:
        """The checks of a clear batch that cost O(1): ids, window, metric, params, lengths."""
        config = self._check_batch(batch)
        self._check_shape(batch, config)
        self._check_params(batch, config)
        return config

    def _check_params(self, batch: IngestBatch, config: MetricConfig) -> None:
        """A clear batch's params against the registry and the round file: state that may
        change after the batch was counted, so checked after the duplicate look."""
        if config.requires_sealing:
            raise InvalidBatch(
                f"metric {batch.metric!r} is a shuffled histogram: it is counted from sealed "
                "batches only (in the clear the shuffler saw each device's true value)",
                reason="histogram_unsealed",
            )
        if config.heavy_hitters is not None:
            expected = self.round_fingerprint(config, batch.window)
            if batch.fingerprint != expected:
                raise InvalidBatch(
                    f"metric {batch.metric!r}: the reports of window {batch.window} name "
                    f"round fingerprint {batch.fingerprint:#018x}, but the round file "
                    + ("serves no round in it" if expected is None else f"serves {expected:#018x}")
                    + " (a shuffler serves another round file): never counted against it",
                    reason="round",
                )
        elif batch.fingerprint != config.fingerprint:
            raise InvalidBatch(
                f"metric {batch.metric!r}: params fingerprint {batch.fingerprint:#018x} "
                f"does not match the registry's {config.fingerprint:#018x}",
                reason="fingerprint",
            )

    def _check_shape(self, batch: IngestBatch, config: MetricConfig) -> None:
        """A clear batch's lengths and report ids."""
        if batch.report_bytes != config.report_bytes:
            raise InvalidBatch(
                f"metric {batch.metric!r}: report_bytes must be {config.report_bytes}, "
                f"got {batch.report_bytes}",
                reason="report_bytes",
            )
        if batch.cohorts.shape != (batch.count,):
            raise InvalidBatch(
                f"{batch.cohorts.size} cohorts for count={batch.count}", reason="length"
            )
        _check_length("bits", batch.bits, batch.count, batch.report_bytes, "report_bytes")
        _check_length("report_ids", batch.report_ids, batch.count, REPORT_ID_BYTES, "16")
        words = np.frombuffer(batch.report_ids, dtype="<u8")
        if np.count_nonzero(words) != words.size:  # a zero word (rare): is a whole id zero?
            pairs = words.reshape(batch.count, 2)
            if not bool((pairs[:, 0] | pairs[:, 1]).all()):
                raise InvalidBatch("a report id is all zero", reason="report_id")

    def count(self, batch: IngestBatch, config: MetricConfig) -> Counts:
        """The batch's counts after the per-report checks (cohorts, padding, payloads)."""
        low, high = int(batch.cohorts.min()), int(batch.cohorts.max())
        if low < 0 or high >= config.num_cohorts:
            raise InvalidBatch(
                f"cohort {high if low >= 0 else low} out of range [0, {config.num_cohorts})",
                reason="cohort",
            )
        counts = self._accumulator(config)
        bits = np.frombuffer(batch.bits, dtype=np.uint8).reshape(batch.count, batch.report_bytes)
        try:
            counts.add(batch.cohorts, bits)
        except CountsShapeError as exc:
            # Remaining shape rules live with the accumulator (padding bits, payload ranges).
            reason = "padding" if "padding" in str(exc) else "payload"
            raise InvalidBatch(f"metric {batch.metric!r}: {exc}", reason=reason) from None
        return counts

    def round_fingerprint(self, config: MetricConfig, window: int) -> int | None:
        """The fingerprint a heavy-hitters report of ``window`` must name: its round's in
        the round file (None: the window serves no round)."""
        return None if self.rounds is None else self.rounds.round_fingerprint(config, window)

    def retention_cutoff(self, config: MetricConfig) -> int:
        """The first window whose ids are kept: earlier ones are past ``disposal_days``
        plus one window (the shuffler disposed of every batch of theirs)."""
        age = config.shuffle.disposal_days * 86400.0 + self.registry.window_seconds
        return self.registry.window_of(self._clock() - age)

    def window_disposed(self, config: MetricConfig, window: int) -> bool:
        return window < self.retention_cutoff(config)

    def dispose_ids(self) -> int:
        """Delete the ids of every metric's windows past retention; returns ids deleted."""
        return sum(
            self.store.dispose_ids(name, self.retention_cutoff(config))
            for name, config in self.registry.metrics.items()
        )

    def open_sealed(
        self, batch: SealedBatch
    ) -> tuple[MetricConfig, IngestBatch, Counts, dict[str, int]]:
        """Open and screen a sealed batch: its config, the survivors as a clear batch,
        their counts and the drops by reason. Batch-level faults raise InvalidBatch."""
        config = self._check_batch(batch)
        if self.keys is None:
            raise InvalidBatch(
                "this aggregator has no key set (--keys): it cannot open sealed batches",
                reason="sealing_off",
            )
        if batch.key_ids.shape != (batch.count,) or batch.sealed_bytes < 1:
            raise InvalidBatch(
                f"{batch.key_ids.size} key ids for count={batch.count}", reason="length"
            )
        _check_length("sealed", batch.sealed, batch.count, batch.sealed_bytes, "sealed_bytes")
        if config.heavy_hitters is None:
            opened = self.keys.open(batch, config, self._clock())
            screened, counts = screen(opened, config, self._accumulator)
        else:  # the plaintext names the report's round: the window's, or it is dropped
            expected = self.round_fingerprint(config, batch.window)
            check = config.fingerprint if expected is None else expected
            opened = self.keys.open(batch, config, self._clock(), fingerprint=check)
            if expected is None:  # the window serves no round: nothing of it counts
                opened = dataclasses.replace(
                    opened, fingerprints_ok=np.zeros_like(opened.fingerprints_ok)
                )
            screened, counts = screen(opened, config, self._accumulator, mismatch="round")
            if screened.dropped.get("round"):
                log.warning(
                    "metric %r, window %d: %d sealed reports name another round than the "
                    "round file's (a shuffler serves another round file): dropped",
                    config.name, batch.window, screened.dropped["round"],
                )  # fmt: skip
        clear = IngestBatch(
            batch_id=batch.batch_id,
            window=batch.window,
            metric=batch.metric,
            fingerprint=config.fingerprint,
            count=screened.count,
            report_bytes=config.report_bytes,
            cohorts=screened.cohorts,
            bits=screened.bits,
            report_ids=screened.report_ids,
        )
        return config, clear, counts, screened.dropped

    def _note(self, metric: str, window: int, sealed: bool) -> None:
        self.store.note_batch(
            metric, window, sealed=sealed, window_seconds=self.registry.window_seconds
        )

    def ingest(self, batch: IngestBatch | SealedBatch) -> IngestResult:
        """Validate (open), count, and apply once. Store errors propagate (StoreError).

        A batch whose id was applied before is answered as a duplicate after the O(1)
        checks of its shape, before any check against what may have changed since it was
        counted (the round file, the registry's params) and before it is opened or
        counted: a re-sent batch is acknowledged, at no cost, whatever changed."""
        dropped: dict[str, int] | None = None
        header = self._check_batch(batch)
        sealed = isinstance(batch, SealedBatch)
        if not isinstance(batch, SealedBatch):
            self._check_shape(batch, header)
        if self.store.is_applied(batch.metric, batch.batch_id):
            # re-sent: not counted again; its kind noted again (a crash may have lost it)
            self._note(batch.metric, batch.window, sealed)
            return IngestResult(applied=0, duplicate=True)
        if isinstance(batch, SealedBatch):
            config, batch, counts, dropped = self.open_sealed(batch)
        else:
            self._check_params(batch, header)
            config, counts = header, self.count(batch, header)
        description = self._descriptions.get(config.name)
        if description is None:
            description = self._descriptions[config.name] = describe_metric(config)
        report_ids, counts, in_batch = _report_ids(batch, counts, self._accumulator, config)
        try:
            outcome = self.store.apply_reports(
                batch.metric,
                batch.window,
                batch.batch_id,
                config.fingerprint,
                counts,
                report_ids,
                description=description,
                repeated=in_batch,  # recorded with the counts: a histogram's statement needs it
                dropped=dropped,  # and the sealed reports dropped: a round job reports them
            )
        except ParamsConflict as exc:  # the registry changed: say which field, not two hashes
            stored = self.store.description(batch.metric)
            if stored is None:
                raise
            raise ParamsConflict(
                f"metric {batch.metric!r} has counts stored under other params than the "
                f"registry's: {params_difference(stored, config)}"
            ) from exc
        # who could read these reports before they were counted: the statement says it
        self._note(batch.metric, batch.window, sealed)
        if not outcome.applied:
            return IngestResult(applied=0, duplicate=True)
        return IngestResult(
            applied=outcome.counted,
            duplicate=False,
            duplicate_reports=in_batch + outcome.duplicates,
            dropped=dropped,
        )


def _check_length(column: str, data: bytes, count: int, each: int, each_name: str) -> None:
    """InvalidBatch ("length") unless ``data`` holds ``count`` values of ``each`` bytes."""
    if len(data) != count * each:
        raise InvalidBatch(
            f"{column} has {len(data)} bytes, expected count*{each_name} = {count}*{each}",
            reason="length",
        )


def _report_ids(
    batch: IngestBatch,
    counts: Counts,
    accumulator: Callable[[MetricConfig], Counts],
    config: MetricConfig,
) -> tuple[ReportIds, Counts, int]:
    """The batch's report ids for the store (distinct), its counts without reports
    repeated within the batch, and how many those were.

    Numpy over the whole batch: equal ids have equal first 8 bytes, so sorting those
    (values only, no permutation) shows whether any two could be equal; only then are
    the rows sharing a first word sorted on both words, and a repeat dropped (its
    first copy kept).
    """
    words = np.frombuffer(batch.report_ids, dtype="<u8").reshape(batch.count, 2)
    rows = np.frombuffer(batch.report_ids, dtype=f"V{REPORT_ID_BYTES}")
    keep_rows = np.arange(batch.count, dtype=np.intp)
    drop = np.zeros(0, dtype=np.intp)
    if batch.count > 1:
        first = np.sort(words[:, 0])
        shared = first[1:] == first[:-1]
        if bool(shared.any()):  # candidates: confirm on all 16 bytes
            maybe = np.flatnonzero(np.isin(words[:, 0], first[1:][shared]))
            hi, lo = words[maybe, 0], words[maybe, 1]
            order = np.lexsort((lo, hi))  # stable: copies of an id stay in batch order
            again = (hi[order[1:]] == hi[order[:-1]]) & (lo[order[1:]] == lo[order[:-1]])
            drop = np.sort(maybe[order[1:][again]])
    bits = np.frombuffer(batch.bits, dtype=np.uint8).reshape(batch.count, batch.report_bytes)

    def recount(dropped_rows: npt.NDArray[np.intp]) -> Counts:
        keep = np.ones(batch.count, dtype=bool)
        keep[dropped_rows] = False
        fresh = accumulator(config)
        if keep.any():
            fresh.add(batch.cohorts[keep], bits[keep])
        return fresh

    if drop.size:
        counts = recount(drop)
        keep_rows = np.setdiff1d(keep_rows, drop, assume_unique=True)
    ids = rows[keep_rows].tobytes() if drop.size else batch.report_ids

    def counts_without(positions: npt.NDArray[np.intp]) -> Counts:
        return recount(np.concatenate([drop, keep_rows[positions]]))

    return ReportIds(ids, counts_without), counts, int(drop.size)
