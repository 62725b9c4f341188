"""The embedded count store: counts, batch ids and report ids in process memory.

Same contract as the Redis store (one shared suite); lost when the process exits.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping

from crowdmix.aggregator.errors import ParamsConflict, WindowDisposed
from crowdmix.aggregator.store.base import (
    ApplyOutcome,
    CountsLike,
    CountStore,
    ReportIds,
    StoredCounts,
    batch_crowd,
    checked_drops,
    sealing_of,
)
from crowdmix.aggregator.store.report_ids import ReportIdIndex

__all__ = ["MemoryCountStore"]


class MemoryCountStore(CountStore):
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
        self._duplicates: dict[tuple[str, int], int] = {}
        self._dropped: dict[tuple[str, int], Counter[str]] = {}
        self._sealing: dict[tuple[str, int], set[bool]] = {}  # (metric, window) -> kinds seen
        self._window_seconds: dict[str, int] = {}

    def is_applied(self, metric: str, batch_id: bytes) -> bool:
        with self._lock:
            return batch_id in self._ids.get(metric, ())

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
        repeated: int = 0,
        dropped: Mapping[str, int] | None = None,
    ) -> ApplyOutcome:
        drops = checked_drops(repeated, dropped)
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
            duplicates = 0
            index = self._report_ids.get((metric, window))
            if index is None:
                index = ReportIdIndex()
            check = index.check(report_ids.ids) if report_ids.ids else None
            if check is not None and check.present.size:
                # rare: counted before; recount the batch without them
                duplicates = int(check.present.size)
                report_ids, delta = report_ids.without(check.present)
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
            key = (metric, window)
            self._duplicates[key] = self._duplicates.get(key, 0) + duplicates + repeated
            self._dropped.setdefault(key, Counter()).update(drops)
            self._window_batches.setdefault((metric, window), set()).add(batch_id)
            if check is not None and report_ids.ids:
                self._report_ids[(metric, window)] = index
                index.record(check)  # the ids not present: those counted
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

    def duplicate_reports(self, metric: str, windows: Iterable[int] | None = None) -> int | None:
        with self._lock:
            wanted = self._windows_locked(metric) if windows is None else set(windows)
            # every window counted by this store has its record: never unknown here
            return sum(self._duplicates.get((metric, w), 0) for w in wanted)

    def dropped_reports(self, metric: str, windows: Iterable[int]) -> dict[str, int]:
        with self._lock:
            out: Counter[str] = Counter()
            for w in set(windows):
                out.update(self._dropped.get((metric, w), {}))
            return dict(out)

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

    def note_batch(self, metric: str, window: int, *, sealed: bool, window_seconds: int) -> None:
        with self._lock:
            self._sealing.setdefault((metric, window), set()).add(sealed)
            self._window_seconds[metric] = window_seconds

    def window_seconds(self, metric: str) -> int | None:
        with self._lock:
            return self._window_seconds.get(metric)

    def sealing(self, metric: str, windows: Iterable[int] | None = None) -> bool | None:
        with self._lock:
            wanted = self._windows_locked(metric) if windows is None else sorted(set(windows))
            stored = set(self._windows_locked(metric))
            notes = [self._sealing.get((metric, w)) for w in wanted if w in stored]
        return sealing_of(notes)

    def close(self) -> None:
        pass
