"""The count store's contract: the protocol both backends keep, and its value types.

A count store holds, per metric, the applied batch ids and, per collection window, the
counts (:class:`StoredCounts`) and the report ids counted in that window.
:meth:`CountStore.apply_reports` adds a batch's counts and records its id and report ids
in one atomic step, dropping reports whose id was already counted in the window, so a
re-sent batch or report is acknowledged but never counted twice, and a crash never
leaves counts without their ids. :meth:`CountStore.duplicate_reports` counts repeated
ids per (metric, window) in the same step. :meth:`CountStore.dispose_ids` deletes the ids
of windows before a cutoff (counts stay) and then refuses their batches
(``WindowDisposed``). Backends: :mod:`crowdmix.aggregator.store.memory` and
:mod:`crowdmix.aggregator.store.redis`, both passing tests/service/test_store_contract.py;
``crowdmix.aggregator.store.open_store(url)`` picks one. Why: docs/design.md,
"Aggregator: store".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.counting.counts import CohortCounts
from crowdmix.aggregator.errors import ParamsConflict

Int64Array = npt.NDArray[np.int64]

__all__ = [
    "NO_REPORT_IDS",
    "ApplyOutcome",
    "CountStore",
    "CountsLike",
    "ReportIds",
    "StoredCounts",
    "batch_crowd",
    "checked_drops",
    "parse_windows",
    "sealing_of",
]


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


#: No report ids (``CountStore.apply``: counts that come with no reports): nothing to check.
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
        Same as :meth:`apply_reports` with no report ids (the body every store shares).
        """
        return self.apply_reports(
            metric, window, batch_id, fingerprint, delta, NO_REPORT_IDS, description=description
        ).applied

    def is_applied(self, metric: str, batch_id: bytes) -> bool:
        """Whether ``batch_id`` was applied for ``metric`` (a cheap look before counting a
        batch; :meth:`apply_reports` decides atomically all the same)."""
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
        repeated: int = 0,
        dropped: Mapping[str, int] | None = None,
    ) -> ApplyOutcome:
        """Like :meth:`apply`, and in the same atomic step drop the reports whose id
        was counted before in ``window`` (counting the others:
        ``report_ids.counts_without``) and record the ids of the reports counted.

        Also in that step, when the batch is applied, add to the duplicate-report count
        (:meth:`duplicate_reports`) of ``window`` the ids dropped here plus ``repeated``
        (ids the caller dropped as repeated within the batch), and to its
        :meth:`dropped_reports` the caller's ``dropped`` (reports of the batch it dropped
        before counting, by reason). A batch id applied before changes nothing (a
        re-sent batch is not a repeated report).

        Raises WindowDisposed when ``window`` is before the cutoff of :meth:`dispose_ids`.
        The batch's size and smallest crowd are recorded for the counted reports only
        (a smaller crowd: the privacy statement errs on the safe side).
        """
        ...

    def duplicate_reports(self, metric: str, windows: Iterable[int] | None = None) -> int | None:
        """Report ids seen twice (dropped as repeats) in ``windows`` (all when None),
        summed; recorded atomically with the counts and kept when ids are disposed.

        None when a window of the selection holding counts has no record of it (its
        counter was lost): unknown, not zero."""
        ...

    def dropped_reports(self, metric: str, windows: Iterable[int]) -> dict[str, int]:
        """The reports of ``windows`` dropped before counting, by reason, summed (the
        ``dropped`` of :meth:`apply_reports`; reasons with none are left out)."""
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

    def note_batch(self, metric: str, window: int, *, sealed: bool, window_seconds: int) -> None:
        """Note that a batch of (metric, window) was applied from sealed reports (opened
        here) or from clear ones, and the length of the registry's collection window.
        Idempotent; called after the batch is applied (and again for a re-sent one, so a
        crash in between loses nothing for long)."""
        ...

    def window_seconds(self, metric: str) -> int | None:
        """The collection window's length noted with ``metric``'s newest window (None:
        not noted): with it a window index reads as a date."""
        ...

    def sealing(self, metric: str, windows: Iterable[int] | None = None) -> bool | None:
        """Whether the reports of ``windows`` (all stored when None) reached the shuffler
        sealed: True if every batch was sealed, False if any came in the clear (the
        shuffler then saw those reports), None if a window has no note (counted by an
        aggregator that kept none): unknown, never assumed sealed."""
        ...

    def close(self) -> None: ...


def checked_drops(repeated: int, dropped: Mapping[str, int] | None) -> dict[str, int]:
    """``dropped`` without its zeros; ValueError when it or ``repeated`` is negative."""
    if repeated < 0 or any(n < 0 for n in (dropped or {}).values()):
        raise ValueError(f"drops must be >= 0, got repeated={repeated}, dropped={dropped}")
    return {reason: n for reason, n in (dropped or {}).items() if n}


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


def batch_crowd(totals: npt.NDArray[np.integer]) -> int:
    """A batch's smallest non-empty cohort count (its whole size with one cohort)."""
    present = totals[totals > 0]
    return int(present.min()) if present.size else 0


def sealing_of(notes: list[set[bool] | None]) -> bool | None:
    """Every window's note together: any clear batch → False; a window without a note
    (or none at all) → None; else True."""
    if any(n is not None and False in n for n in notes):
        return False
    if not notes or any(not n for n in notes):
        return None
    return True
