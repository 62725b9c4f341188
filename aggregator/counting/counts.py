"""Per-cohort bit counts: the mergeable accumulator the aggregator keeps per metric and
collection window.

    counts = CohortCounts.create(num_cohorts=m, nbits=k)   # create
    counts.add(cohorts, bits)                               # add a columnar batch
    counts.merge(other)                                     # merge partial counts
    totals, ones = counts.totals, counts.ones               # extract (int64)

``totals[c]`` is the number of reports from cohort c; ``ones[c, i]`` how many had bit i
set. Every accumulator (:class:`Counts`) stores exactly these two arrays, so storage,
merging and decoders are shared by RAPPOR and the basic mechanisms (one cohort;
``ones[0, v]`` is value v's support); only ``add`` differs (:func:`accumulator_for`).
A batch is counted without per-report Python: blocks sorted by cohort, bits summed eight
byte lanes at a time (SWAR; docs/design.md, "Aggregator: counting"). Errors:
``CountsError`` (a ValueError) and ``CountsShapeError``, a batch or merge that does not fit.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    pass

__all__ = [
    "BLOCK",
    "CohortCounts",
    "Counts",
    "CountsError",
    "CountsShapeError",
    "columns_to_arrays",
]

Int64Array = npt.NDArray[np.int64]

#: Rows buffered before a block is counted: large enough to amortise the numpy
#: call overhead, small enough that the block's temporaries stay in cache
#: (measured best at 16-32 K rows for k=128, see bench/counts.py).
BLOCK = 1 << 15
# A byte lane of a uint64 holds counts up to 255 without carrying into its neighbour.
_LANE_MAX = 255
_LANE_ONES = np.uint64(0x0101010101010101)
_SHIFTS = tuple(np.uint64(j) for j in range(8))


class CountsError(ValueError):
    """Base class of the counting errors."""


class CountsShapeError(CountsError):
    """A batch does not fit the accumulator (bit length, cohort range, merge of unlike counts)."""


class Counts(abc.ABC):
    """Report totals per cohort (``totals[m]``) and supports per (cohort, bit) (``ones[m, nbits]``).

    Subclasses define how a batch of reports becomes supports (``add``) and the
    payload size; merge, copy, equality and the arrays are shared.
    """

    __slots__ = ("_ones", "_totals", "nbits", "num_cohorts")

    #: What the supports count: "bits" (RAPPOR, OUE, binary RR), "index" (k-RR), "olh".
    kind: ClassVar[str] = "bits"

    def __init__(self, num_cohorts: int, nbits: int) -> None:
        for name, value in (("num_cohorts", num_cohorts), ("nbits", nbits)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise CountsShapeError(f"{name} must be a positive integer, got {value!r}")
        self.num_cohorts = int(num_cohorts)
        self.nbits = int(nbits)
        self._totals: Int64Array = np.zeros(self.num_cohorts, dtype=np.int64)
        self._ones: Int64Array = np.zeros((self.num_cohorts, self.nbits), dtype=np.int64)

    # -- extract -------------------------------------------------------------------------
    def _flush(self) -> None:  # noqa: B027 - a hook: most accumulators buffer nothing
        """Count anything buffered (a no-op unless the subclass buffers)."""

    @property
    def totals(self) -> Int64Array:
        self._flush()
        return self._totals

    @totals.setter
    def totals(self, value: Int64Array) -> None:
        self._flush()
        self._totals = self._checked(value, (self.num_cohorts,), "totals")

    @property
    def ones(self) -> Int64Array:
        self._flush()
        return self._ones

    @ones.setter
    def ones(self, value: Int64Array) -> None:
        self._flush()
        self._ones = self._checked(value, (self.num_cohorts, self.nbits), "ones")

    @staticmethod
    def _checked(value: Any, shape: tuple[int, ...], name: str) -> Int64Array:
        arr = np.asarray(value)
        if arr.shape != shape:
            raise CountsShapeError(f"{name} must have shape {shape}, got {arr.shape}")
        if arr.dtype.kind not in "iu" or (arr.size and int(arr.min()) < 0):
            raise CountsShapeError(f"{name} must be non-negative integers")
        return arr.astype(np.int64, copy=True)

    @property
    def num_reports(self) -> int:
        return int(self.totals.sum())

    @property
    def report_bytes(self) -> int:
        return (self.nbits + 7) // 8

    # -- add -----------------------------------------------------------------------------
    def check_batch(self, cohorts: npt.NDArray[Any], bits: npt.NDArray[np.uint8]) -> None:
        """Raise CountsShapeError unless (cohorts, bits) is a valid batch for these counts."""
        nb = self.report_bytes
        if bits.ndim != 2 or bits.shape[1] != nb:
            raise CountsShapeError(f"each report must be {nb} bytes, got shape {bits.shape}")
        if cohorts.ndim != 1 or cohorts.shape[0] != bits.shape[0]:
            raise CountsShapeError(
                f"{cohorts.shape[0] if cohorts.ndim == 1 else cohorts.shape} cohorts "
                f"for {bits.shape[0]} reports"
            )
        if cohorts.dtype.kind not in "iu":
            raise CountsShapeError(f"cohorts must be integers, got dtype {cohorts.dtype}")
        if cohorts.size:
            lo, hi = int(cohorts.min()), int(cohorts.max())
            if lo < 0 or hi >= self.num_cohorts:
                bad = lo if lo < 0 else hi
                raise CountsShapeError(f"cohort {bad} out of range [0, {self.num_cohorts})")

    @staticmethod
    def _as_batch(cohorts: Any, bits: Any) -> tuple[npt.NDArray[Any], npt.NDArray[np.uint8]]:
        c = np.asarray(cohorts)
        b = np.asarray(bits)
        if b.dtype != np.uint8:
            raise CountsShapeError(f"bits must be uint8, got dtype {b.dtype}")
        return c, b

    @abc.abstractmethod
    def add(self, cohorts: Any, bits: Any) -> None:
        """Count a batch: ``cohorts`` (n,) ints, ``bits`` (n, report_bytes) uint8.

        The whole batch is validated before anything is counted.
        """

    # -- merge ---------------------------------------------------------------------------
    def _same_shape(self, other: Counts) -> bool:
        return (
            type(other) is type(self)
            and other.num_cohorts == self.num_cohorts
            and other.nbits == self.nbits
        )

    def merge(self, other: Counts) -> None:
        """Add another accumulator's counts (same kind and shape) into this one."""
        if not self._same_shape(other):
            raise CountsShapeError(
                f"cannot merge {type(other).__name__}({other.num_cohorts}, {other.nbits}) "
                f"into {type(self).__name__}({self.num_cohorts}, {self.nbits})"
            )
        self.totals += other.totals
        self.ones += other.ones

    def copy(self) -> Counts:
        new = self._empty_like()
        new._totals = self.totals.copy()
        new._ones = self.ones.copy()
        return new

    @abc.abstractmethod
    def _empty_like(self) -> Counts:
        """A zeroed accumulator of the same kind and shape."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Counts) or not self._same_shape(other):
            return False
        return bool(
            np.array_equal(self.totals, other.totals) and np.array_equal(self.ones, other.ones)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_cohorts={self.num_cohorts}, nbits={self.nbits}, "
            f"reports={self.num_reports})"
        )


class CohortCounts(Counts):
    """Bit counts of packed reports: RAPPOR (m cohorts, k bits), OUE and binary RR (1 cohort)."""

    __slots__ = ("_fill", "_lanes", "_pending_bits", "_pending_cohorts", "_words")

    kind: ClassVar[str] = "bits"

    def __init__(self, num_cohorts: int, nbits: int) -> None:
        super().__init__(num_cohorts, nbits)
        self._words = (self.report_bytes + 7) // 8
        # _lanes[c, j, B] = reports of cohort c with bit j of byte B set, not yet in _ones.
        self._lanes: Int64Array | None = None
        self._pending_bits: npt.NDArray[np.uint8] | None = None
        self._pending_cohorts: npt.NDArray[np.int64] | None = None
        self._fill = 0

    @classmethod
    def create(cls, num_cohorts: int, nbits: int) -> CohortCounts:
        return cls(num_cohorts, nbits)

    def _empty_like(self) -> CohortCounts:
        return CohortCounts(self.num_cohorts, self.nbits)

    def check_batch(self, cohorts: npt.NDArray[Any], bits: npt.NDArray[np.uint8]) -> None:
        super().check_batch(cohorts, bits)
        extra = self.report_bytes * 8 - self.nbits
        if extra and bits.size and int((bits[:, -1] >> (8 - extra)).max()) != 0:
            raise CountsShapeError(f"padding bits past bit {self.nbits} must be zero")

    def add(self, cohorts: Any, bits: Any) -> None:
        c, b = self._as_batch(cohorts, bits)
        self.check_batch(c, b)
        n = b.shape[0]
        if n == 0:
            return
        start = 0
        if self._fill:  # top up the partly filled block first
            start = min(n, BLOCK - self._fill)
            self._buffer(c[:start], b[:start])
            if self._fill == BLOCK:
                self._flush_pending()
        while n - start >= BLOCK:  # whole blocks straight from the caller's arrays
            self._count_block(c[start : start + BLOCK], self._padded(b[start : start + BLOCK]))
            start += BLOCK
        if start < n:
            self._buffer(c[start:], b[start:])

    def _buffer(self, cohorts: npt.NDArray[Any], bits: npt.NDArray[np.uint8]) -> None:
        if self._pending_bits is None or self._pending_cohorts is None:
            self._pending_bits = np.zeros((BLOCK, self._words * 8), dtype=np.uint8)
            self._pending_cohorts = np.zeros(BLOCK, dtype=np.int64)
        n = bits.shape[0]
        end = self._fill + n
        self._pending_bits[self._fill : end, : bits.shape[1]] = bits
        self._pending_cohorts[self._fill : end] = cohorts
        self._fill = end

    def _padded(self, bits: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint64]:
        """Rows as whole little-endian uint64 words (a view when already aligned)."""
        width = self._words * 8
        if bits.shape[1] == width and bits.flags.c_contiguous:
            return bits.view(np.uint64)
        out = np.zeros((bits.shape[0], width), dtype=np.uint8)
        out[:, : bits.shape[1]] = bits
        return out.view(np.uint64)

    def _flush_pending(self) -> None:
        if self._fill and self._pending_bits is not None and self._pending_cohorts is not None:
            fill = self._fill
            self._count_block(
                self._pending_cohorts[:fill], self._pending_bits[:fill].view(np.uint64)
            )
            self._pending_bits[:fill] = 0
            self._fill = 0

    def _count_block(self, cohorts: npt.NDArray[Any], words: npt.NDArray[np.uint64]) -> None:
        """Add one block (n <= BLOCK rows of uint64 words) into the lane counters."""
        m = self.num_cohorts
        n = words.shape[0]
        if self._lanes is None:
            self._lanes = np.zeros((m, 8, self._words * 8), dtype=np.int64)
        if m == 1:
            sorted_c = np.zeros(n, dtype=np.int64)
        else:
            # Narrow the key so numpy's stable sort is a radix sort (8/16-bit keys).
            key_type = np.uint8 if m <= 1 << 8 else np.uint16 if m <= 1 << 16 else np.int64
            key: npt.NDArray[Any] = cohorts.astype(key_type, copy=False)
            if n > 1 and bool(np.any(np.less(key[1:], key[:-1]))):
                order = np.argsort(key, kind="stable")
                key = key[order]
                words = np.take(words, order, axis=0)
            sorted_c = key.astype(np.int64)
        self._totals += np.bincount(sorted_c, minlength=m)
        # Cohort groups, then segments of at most 255 rows inside a group.
        group_starts = np.flatnonzero(sorted_c[1:] != sorted_c[:-1]) + 1
        group_starts = np.concatenate((np.zeros(1, dtype=np.int64), group_starts))
        seg_starts = np.union1d(group_starts, np.arange(0, n, _LANE_MAX))
        group_of_seg = np.searchsorted(seg_starts, group_starts)
        present = sorted_c[group_starts]
        # One scratch buffer for the eight passes: a fresh 0.5 MB temporary per
        # pass would be mmap'd and page-faulted every time (measured ~15% slower).
        lanes = np.empty(words.shape, dtype=np.uint64)
        for j, shift in enumerate(_SHIFTS):
            np.right_shift(words, shift, out=lanes)
            np.bitwise_and(lanes, _LANE_ONES, out=lanes)
            seg = np.add.reduceat(lanes, seg_starts, axis=0)  # (S, W) per-lane counts <= 255
            per_byte = seg.view(np.uint8).astype(np.int64)  # (S, 8W): byte B's bit j
            self._lanes[present, j] += np.add.reduceat(per_byte, group_of_seg, axis=0)

    def _flush(self) -> None:
        self._flush_pending()
        if self._lanes is not None:
            # _lanes[c, j, B] is Bloom bit 8B + j.
            m = self.num_cohorts
            folded = self._lanes.transpose(0, 2, 1).reshape(m, self._words * 64)
            self._ones += folded[:, : self.nbits]
            self._lanes = None


def columns_to_arrays(
    cohorts: Any, bits: bytes, count: int, report_bytes: int
) -> tuple[Int64Array, npt.NDArray[np.uint8]]:
    """A columnar batch (protos ReportColumns fields) as numpy arrays, without copying bits.

    Raises CountsShapeError when the lengths disagree.
    """
    if report_bytes < 1:
        raise CountsShapeError(f"report_bytes must be positive, got {report_bytes}")
    if len(bits) != count * report_bytes:
        raise CountsShapeError(
            f"bits has {len(bits)} bytes, expected count*report_bytes = {count}*{report_bytes}"
        )
    cohort_arr = np.array(cohorts, dtype=np.int64)
    if cohort_arr.shape != (count,):
        raise CountsShapeError(f"{cohort_arr.size} cohorts for {count} reports")
    bit_arr = np.frombuffer(bits, dtype=np.uint8).reshape(count, report_bytes)
    return cohort_arr, bit_arr
