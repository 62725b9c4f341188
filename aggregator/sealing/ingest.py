"""Sealed batches at the aggregator: open each report, screen it, keep the good ones.

A sealed batch (``ReportColumns.sealed``) is opened with an ``Opener`` (one HPKE
decapsulation per report, optionally in a process pool). Whatever is wrong with one
report drops that report and counts it by reason (``unknown_key``, ``expired_key``,
``bad_length``, ``not_authentic``, ``fingerprint``, ``round`` (a heavy-hitters report of
another round than its window's), ``cohort_range``, ``padding_bits``, ``payload``,
``report_id``: the ``crowdmix_aggregator_sealed_dropped`` metric); it never
fails the batch, since the shuffler cannot see inside a seal. What is wrong with the
batch (id, window, metric, column lengths) stays a batch-level ``InvalidBatch``.
``KeyFile`` keeps an ``Opener`` in step with the private key file (stat-ed before every
batch, re-read when changed), so a rotation is picked up before any report sealed to
the new key arrives. Reasons in full: docs/design.md, "Aggregator: sealing".
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.counting.counts import Counts, CountsShapeError
from crowdmix.aggregator.sealing.keys import KeySet, load_keyset
from crowdmix.aggregator.sealing.opening import OpenedBatch, Opener
from crowdmix.core.registry import MetricConfig
from crowdmix.core.watched_file import WatchedFile

__all__ = [
    "KeyFile",
    "Screened",
    "SealedBatch",
    "screen",
]

log = logging.getLogger("crowdmix.aggregator")


@dataclass(frozen=True, slots=True, kw_only=True)
class SealedBatch:
    """A shuffled batch of sealed reports (out of its protobuf)."""

    batch_id: bytes
    window: int
    metric: str
    count: int
    key_ids: npt.NDArray[np.int64]
    sealed: bytes  # count × sealed_bytes
    sealed_bytes: int

    def values(self) -> list[bytes]:
        n = self.sealed_bytes
        view = memoryview(self.sealed)
        return [bytes(view[i : i + n]) for i in range(0, n * self.count, n)]


@dataclass(frozen=True, slots=True)
class Screened:
    """The reports that opened and passed screening, and the drops by reason."""

    cohorts: npt.NDArray[np.int64]
    bits: bytes
    report_ids: bytes
    dropped: dict[str, int]

    @property
    def count(self) -> int:
        return int(self.cohorts.shape[0])


def screen(
    opened: OpenedBatch,
    config: MetricConfig,
    accumulator: Callable[[MetricConfig], Counts],
    *,
    mismatch: str = "fingerprint",
) -> tuple[Screened, Counts]:
    """Drop opened reports that fail a per-report check; count the rest (numpy).
    ``mismatch``: the reason a report whose fingerprint is not the expected one is
    dropped under (``round`` for a heavy-hitters report)."""
    dropped = dict(opened.dropped)
    nb = config.report_bytes
    bits = opened.bits.reshape(-1, nb)
    cohorts = opened.cohorts.astype(np.int64)
    keep = np.ones(cohorts.shape[0], dtype=bool)

    def drop(mask: npt.NDArray[np.bool_], reason: str) -> None:
        hit = mask & keep
        n = int(hit.sum())
        if n:
            dropped[reason] = dropped.get(reason, 0) + n
            keep[hit] = False

    drop(~opened.fingerprints_ok, mismatch)
    drop(~np.asarray(opened.report_ids.any(axis=1), dtype=bool), "report_id")
    drop(cohorts >= config.num_cohorts, "cohort_range")
    extra = 8 * nb - config.payload_bits
    if extra and bits.shape[0]:
        drop((bits[:, -1] >> (8 - extra)) != 0, "padding_bits")
    basic = config.basic
    counts = accumulator(config)
    indexed = (
        config.histogram is not None
        or config.heavy_hitters is not None
        or (basic is not None and basic.mechanism == "krr")
    )
    if indexed and bits.shape[0]:
        index = bits.astype(np.int64) @ (256 ** np.arange(nb, dtype=np.int64))
        drop(index >= counts.nbits, "payload")
    rows = np.flatnonzero(keep)
    try:
        if rows.size:
            counts.add(cohorts[rows], bits[rows])
    except CountsShapeError:
        # a rule not mirrored above (OLH fields): find the rows one by one (rare)
        counts = accumulator(config)
        for r in rows.tolist():
            try:
                accumulator(config).add(cohorts[r : r + 1], bits[r : r + 1])
            except CountsShapeError:
                keep[r] = False
                dropped["payload"] = dropped.get("payload", 0) + 1
        rows = np.flatnonzero(keep)
        if rows.size:
            counts.add(cohorts[rows], bits[rows])
    return (
        Screened(
            cohorts=cohorts[rows],
            bits=np.ascontiguousarray(bits[rows]).tobytes(),
            report_ids=np.ascontiguousarray(opened.report_ids[rows]).tobytes(),
            dropped=dropped,
        ),
        counts,
    )


class KeyFile:
    """An ``Opener`` over the private key file at ``path``, re-read when it changes."""

    def __init__(self, path: str | os.PathLike[str], *, workers: int = 0) -> None:
        self._lock = threading.Lock()  # update_keys swaps the pool; never mid-batch
        self._file = WatchedFile(
            path, load_keyset, "key set", log=log, check_seconds=0.0, lock=self._lock,
            on_change=self._update,
        )  # fmt: skip
        self.path = os.fspath(path)
        self.opener = Opener(self._file.last, workers=workers)

    def _update(self, keys: KeySet) -> None:
        self.opener.update_keys(keys)
        log.info("key set ids %s", [k.key_id for k in keys.keys])

    def refresh(self) -> None:
        self._file.refresh()

    def open(
        self,
        batch: SealedBatch,
        config: MetricConfig,
        now: float,
        *,
        fingerprint: int | None = None,
    ) -> OpenedBatch:
        """Open ``batch``; ``fingerprints_ok`` against ``fingerprint`` (default: the
        metric's; a heavy-hitters metric's: its window's round's)."""
        self.refresh()
        kwargs = {
            "metric": config.name,
            "window": batch.window,
            "report_bytes": config.report_bytes,
            "fingerprint": config.fingerprint if fingerprint is None else fingerprint,
            "key_ids": batch.key_ids,
            "sealed": batch.values(),
            "now": now,
        }
        with self._lock:
            try:
                return self.opener.open(**kwargs)  # type: ignore[arg-type]
            except BrokenProcessPool:
                # a worker died (killed, out of memory): never fatal for the daemon; this
                # batch is opened here and the pool is started afresh for the next one
                log.error("an opening worker died; opening in process, restarting the pool")
                self.opener.update_keys(self._file.last)
                return Opener(self._file.last).open(**kwargs)  # type: ignore[arg-type]

    def close(self) -> None:
        self.opener.close()
