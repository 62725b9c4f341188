"""Where the aggregator keeps its counts: one protocol, two backends.

A count store holds, per metric, the set of applied batch ids and, per
collection window, the counts (:class:`StoredCounts`: an accumulator's totals and ones)
and the report ids counted in that window.
:meth:`CountStore.apply_reports` adds one batch's counts, records its id and its
reports' ids in one atomic step, dropping every report whose id was already
counted in the window (the counts added are those of the remaining reports), so
a batch re-sent by the shuffler, or a report re-sent by a device whose first
attempt was stored after all, is acknowledged but never counted twice, and a
crash can never leave counts without their ids (or the reverse). Reports
without an id (16 zero bytes: older SDKs) are counted without de-duplication.

Retention: :meth:`CountStore.dispose_ids` deletes the batch ids and report ids
of windows before a cutoff (their counts stay) and from then on refuses
batches of those windows (``WindowDisposed``), so deleting the ids can never
let a late copy be counted twice.

- :class:`MemoryCountStore`: a dict and a lock; the embedded default.
- :class:`~aggregator.store.redis.RedisCountStore`: Redis with AOF; a Lua script
  makes "record id + store this batch's counts" atomic, and any number of
  aggregator processes may share it (see that module for why it stores one
  compact per-batch delta rather than incrementing counters).

Both pass one contract suite (tests/service/test_store_contract.py); what they
serialise, and how, is in :mod:`aggregator.store.codec`.
``open_store(url)`` picks the backend from a URL: ``memory://`` or
``redis://...``.

Errors (one hierarchy for the aggregator service, also used by
:mod:`aggregator.daemon.ingest`)::

    AggregatorError
    ├── InvalidBatch          the batch breaks the registry or the wire contract
    │   └── WindowDisposed    the batch's window is past retention (its ids are deleted)
    └── StoreError
        ├── StoreUnavailable  the backend cannot be reached now (retry later)
        └── ParamsConflict    counts for this metric were stored under other params
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from aggregator.counting.counts import CohortCounts, Counts
from aggregator.store.report_ids import ReportIdIndex

if TYPE_CHECKING:
    from client.registry import MetricConfig

Int64Array = npt.NDArray[np.int64]

__all__ = [
    "NO_REPORT_IDS",
    "AggregatorError",
    "ApplyOutcome",
    "CountStore",
    "CountsLike",
    "InvalidBatch",
    "MemoryCountStore",
    "ParamsConflict",
    "ReportIds",
    "StoreError",
    "StoreUnavailable",
    "StoredCounts",
    "WindowDisposed",
    "batch_crowd",
    "load_batch_sizes",
    "load_counts",
    "open_store",
    "parse_windows",
    "stored_metric",
]


class AggregatorError(Exception):
    """Base of the aggregator service's errors."""


class InvalidBatch(AggregatorError, ValueError):
    """A batch that must not be counted; the message is the reason sent back.

    ``reason`` is a short fixed label (for metrics): ``batch_id``, ``window``,
    ``unknown_metric``, ``fingerprint``, ``report_bytes``, ``empty``, ``too_large``,
    ``length``, ``cohort``, ``padding`` or ``payload``.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class WindowDisposed(InvalidBatch):
    """The batch's window is past retention: its ids were deleted, so it is not counted."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="window_disposed")


class StoreError(AggregatorError):
    """The count store could not apply or read counts."""


class StoreUnavailable(StoreError):
    """The backend is down or unreachable; nothing was applied, the caller may retry."""


class ParamsConflict(StoreError):
    """The metric already has counts stored under a different params fingerprint."""


class CountsLike(Protocol):
    """What the store needs of an accumulator (each ``aggregator.counting.counts`` one is)."""

    @property
    def num_cohorts(self) -> int: ...
    @property
    def nbits(self) -> int: ...
    @property
    def totals(self) -> Int64Array: ...
    @property
    def ones(self) -> Int64Array: ...


@dataclass(frozen=True, slots=True)
class StoredCounts:
    """The extracted arrays of an accumulator: ``totals[m]`` and ``ones[m, nbits]``, int64.

    The store keeps only these, so it serves RAPPOR and every basic mechanism
    alike; :func:`load_counts` turns them back into the metric's accumulator.
    """

    totals: Int64Array
    ones: Int64Array

    def __post_init__(self) -> None:
        if self.totals.ndim != 1 or self.ones.shape[:1] != self.totals.shape or self.ones.ndim != 2:
            raise ValueError(
                f"totals (m,) and ones (m, nbits) expected, got {self.totals.shape}, "
                f"{self.ones.shape}"
            )

    @classmethod
    def of(cls, counts: CountsLike) -> StoredCounts:
        return cls(np.asarray(counts.totals, dtype=np.int64), np.asarray(counts.ones, np.int64))

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.ones.shape[0]), int(self.ones.shape[1])

    @property
    def num_reports(self) -> int:
        return int(self.totals.sum())

    def __add__(self, other: StoredCounts) -> StoredCounts:
        if other.shape != self.shape:
            raise ParamsConflict(f"cannot add counts of shape {other.shape} to {self.shape}")
        return StoredCounts(self.totals + other.totals, self.ones + other.ones)

    def to_cohort_counts(self) -> CohortCounts:
        counts = CohortCounts.create(*self.shape)
        counts.totals = self.totals.copy()
        counts.ones = self.ones.copy()
        return counts


REPORT_ID_BYTES = 16


@dataclass(frozen=True, slots=True, eq=False)
class ReportIds:
    """The report ids of a batch to apply, and how to count the batch without some.

    ``ids`` is n distinct ids of 16 bytes, concatenated (the batch's reports that
    have an id, each once); ``counts_without(positions)`` is the batch's counts
    without the reports whose ids sit at ``positions`` of ``ids`` (the store asks
    only when some were counted before in the window: a recount is rare).
    """

    ids: bytes
    counts_without: Callable[[npt.NDArray[np.intp]], CountsLike]

    def __post_init__(self) -> None:
        if len(self.ids) % REPORT_ID_BYTES:
            raise ValueError(f"report ids must be 16 bytes each, got {len(self.ids)} bytes")

    @property
    def count(self) -> int:
        return len(self.ids) // REPORT_ID_BYTES

    def without(self, positions: npt.NDArray[np.intp]) -> tuple[ReportIds, CountsLike]:
        """The ids left after dropping ``positions``, and the counts of the batch without them."""
        keep = np.ones(self.count, dtype=bool)
        keep[positions] = False
        rows = np.frombuffer(self.ids, dtype=f"V{REPORT_ID_BYTES}")[keep]
        dropped = np.flatnonzero(~keep)
        base = self.counts_without

        def counts_without(more: npt.NDArray[np.intp]) -> CountsLike:
            return base(np.concatenate([dropped, np.flatnonzero(keep)[more]]))

        return ReportIds(rows.tobytes(), counts_without), base(dropped)


#: No report ids (a batch of id-less reports): nothing is de-duplicated.
NO_REPORT_IDS = ReportIds(b"", lambda _positions: _no_recount())


def _no_recount() -> CountsLike:
    raise AssertionError("a batch without report ids is never recounted")


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """What :meth:`CountStore.apply_reports` did: ``applied`` False when the batch id
    was applied before (nothing changed); else ``counted`` reports were added and
    ``duplicates`` dropped because their id was counted before in the window."""

    applied: bool
    counted: int
    duplicates: int


@runtime_checkable
class CountStore(Protocol):
    """Counts per (metric, window) plus the applied batch ids, changed together."""

    def apply(
        self,
        metric: str,
        window: int,
        batch_id: bytes,
        fingerprint: int,
        delta: CountsLike,
        *,
        description: str = "",
    ) -> bool:
        """Add ``delta`` to (metric, window) and record ``batch_id``, atomically.

        Returns False (and changes nothing) when ``batch_id`` was applied before
        for this metric. Raises ParamsConflict when ``fingerprint`` differs from
        the one the metric's counts were first stored under. ``description`` (the
        metric's registry entry, :func:`describe_metric`) is kept with the first
        batch so a report job can decode the counts without the registry file.
        Same as :meth:`apply_reports` with no report ids.
        """
        ...

    def apply_reports(
        self,
        metric: str,
        window: int,
        batch_id: bytes,
        fingerprint: int,
        delta: CountsLike,
        report_ids: ReportIds,
        *,
        description: str = "",
    ) -> ApplyOutcome:
        """Like :meth:`apply`, and in the same atomic step drop the reports whose id
        was counted before in ``window`` (counting the others: ``report_ids.
        counts_without``) and record the ids of the reports counted.

        Raises WindowDisposed when ``window`` is before the cutoff of :meth:`dispose_ids`.
        The batch's size and smallest crowd are recorded for the counted reports only
        (a smaller crowd: the privacy statement errs on the safe side).
        """
        ...

    def dispose_ids(self, metric: str, before_window: int) -> int:
        """Delete the batch ids and report ids of ``metric``'s windows before
        ``before_window`` (counts stay) and refuse their batches from now on;
        returns the ids deleted."""
        ...

    def description(self, metric: str) -> str | None:
        """The description stored with the metric's first batch (None if none)."""
        ...

    def load(self, metric: str, windows: Iterable[int] | None = None) -> StoredCounts | None:
        """Counts of ``windows`` (all windows when None) merged; None when there are none."""
        ...

    def windows(self, metric: str) -> list[int]:
        """Windows holding counts for ``metric``, ascending (one release each)."""
        ...

    def batch_sizes(self, metric: str, windows: Iterable[int] | None = None) -> dict[int, int]:
        """Reports per applied batch over ``windows`` (all when None), as size -> batches.

        Recorded atomically with the batch id: the privacy statement of a release
        needs its smallest shuffled batch, which is the crowd a report hides in.
        """
        ...

    def smallest_crowd(self, metric: str, windows: Iterable[int] | None = None) -> int | None:
        """The fewest same-cohort reports in any applied batch over ``windows`` (None: none).

        A persistent cohort travels with each report, so a report hides only among
        its batch's reports of the same cohort; recorded with the batch id.
        """
        ...

    def metrics(self) -> list[str]:
        """Metrics with stored counts, sorted."""
        ...

    def applied_batches(self, metric: str) -> int:
        """How many distinct batch ids have been applied for ``metric``."""
        ...

    def maintain(self) -> int:
        """Periodic housekeeping (Redis: fold per-batch deltas); returns the work done."""
        ...

    def close(self) -> None: ...


class MemoryCountStore:
    """In-process counts: the embedded default (lost when the process exits)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, set[bytes]] = {}
        self._window_batches: dict[tuple[str, int], set[bytes]] = {}
        self._report_ids: dict[tuple[str, int], ReportIdIndex] = {}
        self._disposed_before: dict[str, int] = {}
        self._fingerprints: dict[str, int] = {}
        self._descriptions: dict[str, str] = {}
        self._counts: dict[tuple[str, int], StoredCounts] = {}
        self._sizes: dict[tuple[str, int], Counter[int]] = {}
        self._crowds: dict[tuple[str, int], int] = {}

    def apply(
        self,
        metric: str,
        window: int,
        batch_id: bytes,
        fingerprint: int,
        delta: CountsLike,
        *,
        description: str = "",
    ) -> bool:
        return self.apply_reports(
            metric, window, batch_id, fingerprint, delta, NO_REPORT_IDS, description=description
        ).applied

    def apply_reports(
        self,
        metric: str,
        window: int,
        batch_id: bytes,
        fingerprint: int,
        delta: CountsLike,
        report_ids: ReportIds,
        *,
        description: str = "",
    ) -> ApplyOutcome:
        with self._lock:
            known = self._fingerprints.get(metric)
            if known is not None and known != fingerprint:
                raise ParamsConflict(
                    f"metric {metric!r} has counts under params fingerprint {known:#018x}, "
                    f"this batch has {fingerprint:#018x}"
                )
            cutoff = self._disposed_before.get(metric)
            if cutoff is not None and window < cutoff:
                raise WindowDisposed(
                    f"window {window} of metric {metric!r} is past retention (ids kept "
                    f"from window {cutoff} on)"
                )
            ids = self._ids.setdefault(metric, set())
            if batch_id in ids:
                return ApplyOutcome(applied=False, counted=0, duplicates=0)
            seen = self._report_ids.get((metric, window))
            duplicates = 0
            if seen is not None and report_ids.ids:
                positions = seen.present(report_ids.ids)
                if positions.size:  # rare: counted before; recount the batch without them
                    duplicates = int(positions.size)
                    report_ids, delta = report_ids.without(positions)
            add = StoredCounts.of(delta)
            counted = add.num_reports
            if counted:
                current = self._counts.get((metric, window))
                # Compute the new value before recording anything: a failure leaves no trace.
                updated = add if current is None else current + add
                self._counts[(metric, window)] = StoredCounts(
                    updated.totals.copy(), updated.ones.copy()
                )
                self._sizes.setdefault((metric, window), Counter())[counted] += 1
                crowd = batch_crowd(add.totals)
                if crowd < self._crowds.get((metric, window), crowd + 1):
                    self._crowds[(metric, window)] = crowd
            ids.add(batch_id)
            self._window_batches.setdefault((metric, window), set()).add(batch_id)
            if report_ids.ids:
                self._report_ids.setdefault((metric, window), ReportIdIndex()).add(report_ids.ids)
            if known is None:
                self._fingerprints[metric] = fingerprint
                self._descriptions[metric] = description
            return ApplyOutcome(applied=True, counted=counted, duplicates=duplicates)

    def dispose_ids(self, metric: str, before_window: int) -> int:
        with self._lock:
            self._disposed_before[metric] = max(
                before_window, self._disposed_before.get(metric, before_window)
            )
            deleted = 0
            for key in [k for k in self._window_batches if k[0] == metric and k[1] < before_window]:
                batches = self._window_batches.pop(key)
                self._ids.get(metric, set()).difference_update(batches)
                deleted += len(batches)
            for key in [k for k in self._report_ids if k[0] == metric and k[1] < before_window]:
                deleted += len(self._report_ids.pop(key))
            return deleted

    def description(self, metric: str) -> str | None:
        with self._lock:
            return self._descriptions.get(metric) or None

    def load(self, metric: str, windows: Iterable[int] | None = None) -> StoredCounts | None:
        with self._lock:
            wanted = self._windows_locked(metric) if windows is None else sorted(set(windows))
            parts = [self._counts[(metric, w)] for w in wanted if (metric, w) in self._counts]
        if not parts:
            return None
        merged = parts[0]
        for part in parts[1:]:
            merged = merged + part
        return StoredCounts(merged.totals.copy(), merged.ones.copy())

    def windows(self, metric: str) -> list[int]:
        with self._lock:
            return self._windows_locked(metric)

    def batch_sizes(self, metric: str, windows: Iterable[int] | None = None) -> dict[int, int]:
        with self._lock:
            wanted = self._windows_locked(metric) if windows is None else set(windows)
            out: Counter[int] = Counter()
            for w in wanted:
                out.update(self._sizes.get((metric, w), {}))
            return dict(out)

    def smallest_crowd(self, metric: str, windows: Iterable[int] | None = None) -> int | None:
        with self._lock:
            wanted = self._windows_locked(metric) if windows is None else set(windows)
            crowds = [self._crowds[(metric, w)] for w in wanted if (metric, w) in self._crowds]
        return min(crowds) if crowds else None

    def _windows_locked(self, metric: str) -> list[int]:
        return sorted(w for (m, w) in self._counts if m == metric)

    def metrics(self) -> list[str]:
        with self._lock:
            return sorted({m for (m, _) in self._counts})

    def applied_batches(self, metric: str) -> int:
        with self._lock:
            return len(self._ids.get(metric, ()))

    def maintain(self) -> int:
        return 0

    def close(self) -> None:
        pass


def open_store(url: str | None) -> CountStore:
    """A store for a URL: ``None``/``memory://`` → memory; ``redis://``, ``unix://`` → Redis."""
    if url is None or url == "memory://":
        return MemoryCountStore()
    if url.startswith(("redis://", "rediss://", "unix://")):
        from aggregator.store.redis import RedisCountStore

        return RedisCountStore.from_url(url)
    raise ValueError(f"store URL must be memory:// or redis://..., got {url!r}")


def parse_windows(text: str) -> list[int]:
    """Windows from ``"20400,20402-20405"`` (ranges inclusive), sorted; ValueError if malformed."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"windows must look like 20400,20402-20405, got {text!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first or last - first > 100_000:
            raise ValueError(f"bad window range {part!r}")
        out.update(range(first, last + 1))
    return sorted(out)


def stored_metric(store: CountStore, name: str) -> MetricConfig | None:
    """The metric config stored with ``name``'s counts (None when nothing is stored)."""
    from aggregator.store.codec import metric_from_description

    description = store.description(name)
    return None if description is None else metric_from_description(name, description)


def batch_crowd(totals: npt.NDArray[np.integer]) -> int:
    """A batch's smallest non-empty cohort count (its whole size with one cohort)."""
    present = totals[totals > 0]
    return int(present.min()) if present.size else 0


def load_batch_sizes(
    source: CountStore | str, metric: str, windows: Iterable[int] | None = None
) -> list[int]:
    """The size of every batch applied for ``metric`` over ``windows`` (all when None)."""
    store = open_store(source) if isinstance(source, str) else source
    try:
        histogram = store.batch_sizes(metric, windows)
    finally:
        if isinstance(source, str):
            store.close()
    return sorted(size for size, n in histogram.items() for _ in range(n))


def load_counts(
    source: CountStore | str,
    metric: str | MetricConfig,
    windows: Iterable[int] | None = None,
) -> Counts:
    """Merged counts of ``metric`` over ``windows`` (all when None) from a store or a store URL.

    For the report job. The counts come back as the metric's accumulator
    (``aggregator.counting.counts.accumulator_for``: CohortCounts for RAPPOR, OUE and
    binary RR, index or OLH support counts for k-RR and OLH), for the given
    :class:`~client.registry.MetricConfig` or, given a name, for the config
    stored with the counts (raising ParamsConflict when a given config's
    fingerprint is not the stored one). Raises LookupError when nothing is
    stored for that selection.
    """
    from aggregator.counting.counts import accumulator_for

    name = metric if isinstance(metric, str) else metric.name
    store = open_store(source) if isinstance(source, str) else source
    try:
        stored = store.load(name, windows)
        config = stored_metric(store, name) if stored is not None else None
    finally:
        if isinstance(source, str):
            store.close()
    if stored is None:
        which = "any window" if windows is None else f"window(s) {sorted(set(windows))}"
        raise LookupError(f"no counts stored for metric {name!r} in {which}")
    if not isinstance(metric, str):
        if config is not None and config.fingerprint != metric.fingerprint:
            raise ParamsConflict(
                f"metric {name!r}: the counts were stored under other params "
                f"(fingerprint {config.fingerprint:#018x}, given {metric.fingerprint:#018x})"
            )
        config = metric
    if config is None:
        return stored.to_cohort_counts()
    return accumulator_for(config, totals=stored.totals, ones=stored.ones)
