"""Ingest: validate a shuffled batch against the registry, count it, apply it once.

This is the aggregator service's domain logic, free of gRPC: the servicer
(:mod:`aggregator.daemon.service`) converts the wire ``Batch`` into an
:class:`IngestBatch` and calls :meth:`Ingestor.ingest`.

Validation happens entirely before the store is touched (a rejected batch
leaves no trace): a 16-byte batch id, a window not in the future, a metric the
registry knows, its params fingerprint, the report length, the column lengths,
cohorts in range and zero padding bits. Counting is one numpy pass over the
whole batch (no per-report Python; the metric's accumulator from
``aggregator.counting.counts.accumulator_for``, which also checks payload ranges of the
basic mechanisms), then ``CountStore.apply`` adds the counts
and records the batch id atomically: a batch applied before is acknowledged as
a duplicate and counted zero times.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from aggregator.counting.counts import Counts, CountsShapeError, accumulator_for
from aggregator.store.base import CountStore, InvalidBatch
from aggregator.store.codec import describe_metric
from client.registry import MetricConfig, Registry

__all__ = [
    "BATCH_ID_BYTES",
    "MAX_BATCH_REPORTS",
    "IngestBatch",
    "IngestResult",
    "Ingestor",
]

BATCH_ID_BYTES = 16
# A sanity bound well above any shuffler max_batch: a batch is counted in one piece in memory.
MAX_BATCH_REPORTS = 10_000_000


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


@dataclass(frozen=True, slots=True)
class IngestResult:
    applied: int  # reports counted by this call
    duplicate: bool  # the batch id had been applied before: counted zero times


class Ingestor:
    """Validates, counts and applies batches to a :class:`CountStore`."""

    def __init__(
        self,
        registry: Registry,
        store: CountStore,
        *,
        clock: Callable[[], float] = time.time,
        accumulator: Callable[[MetricConfig], Counts] = accumulator_for,
    ) -> None:
        self.registry = registry
        self.store = store
        self._clock = clock
        self._accumulator = accumulator
        self._descriptions: dict[str, str] = {}

    def validate(self, batch: IngestBatch) -> tuple[MetricConfig, Counts]:
        """The batch's metric config and its counts; raises InvalidBatch with the reason."""
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
        if batch.fingerprint != config.fingerprint:
            raise InvalidBatch(
                f"metric {batch.metric!r}: params fingerprint {batch.fingerprint:#018x} "
                f"does not match the registry's {config.fingerprint:#018x}",
                reason="fingerprint",
            )
        if batch.report_bytes != config.report_bytes:
            raise InvalidBatch(
                f"metric {batch.metric!r}: report_bytes must be {config.report_bytes}, "
                f"got {batch.report_bytes}",
                reason="report_bytes",
            )
        if batch.count < 1:
            raise InvalidBatch("empty batch", reason="empty")
        if batch.count > MAX_BATCH_REPORTS:
            raise InvalidBatch(
                f"batch of {batch.count} reports exceeds {MAX_BATCH_REPORTS}", reason="too_large"
            )
        if batch.cohorts.shape != (batch.count,):
            raise InvalidBatch(
                f"{batch.cohorts.size} cohorts for count={batch.count}", reason="length"
            )
        if len(batch.bits) != batch.count * batch.report_bytes:
            raise InvalidBatch(
                f"bits has {len(batch.bits)} bytes, expected count*report_bytes = "
                f"{batch.count}*{batch.report_bytes}",
                reason="length",
            )
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
        return config, counts

    def ingest(self, batch: IngestBatch) -> IngestResult:
        """Validate, count, and apply once. Store errors propagate (StoreError)."""
        config, counts = self.validate(batch)
        description = self._descriptions.get(config.name)
        if description is None:
            description = self._descriptions[config.name] = describe_metric(config)
        applied = self.store.apply(
            batch.metric,
            batch.window,
            batch.batch_id,
            config.fingerprint,
            counts,
            description=description,
        )
        return IngestResult(applied=batch.count if applied else 0, duplicate=not applied)
