"""Per-cohort bit counts: the mergeable accumulator the aggregator keeps per
metric and collection window.

    counts = CohortCounts.create(num_cohorts=m, nbits=k)   # create
    counts.add(cohorts, bits)                               # add a columnar batch
    counts.merge(other)                                     # merge partial counts
    totals, ones = counts.totals, counts.ones               # extract (int64)

``totals[c]`` is the number of reports from cohort c; ``ones[c, i]`` how many of
them had bit i set. No per-report Python work: a batch is counted with one
``np.bincount`` over (cohort, byte column, byte value) triples, and the byte
histogram is turned into bit counts with a 256×8 table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["CohortCounts", "CountsShapeError", "columns_to_arrays"]

# _BYTE_BITS[v, b] = bit b of byte value v (little-endian bit order, as on the wire)
_BYTE_BITS = np.unpackbits(
    np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little"
).astype(np.int64)
_CHUNK = 1 << 16


class CountsShapeError(ValueError):
    """A batch does not fit the accumulator (bit length, cohort range, merge of unlike counts)."""


@dataclass(slots=True)
class CohortCounts:
    """Report totals per cohort and bit counts per (cohort, bit), int64."""

    num_cohorts: int
    nbits: int
    totals: npt.NDArray[np.int64]
    ones: npt.NDArray[np.int64]

    @classmethod
    def create(cls, num_cohorts: int, nbits: int) -> CohortCounts:
        if num_cohorts < 1 or nbits < 1:
            raise CountsShapeError(
                f"need num_cohorts >= 1 and nbits >= 1, got {num_cohorts}, {nbits}"
            )
        return cls(
            num_cohorts=num_cohorts,
            nbits=nbits,
            totals=np.zeros(num_cohorts, dtype=np.int64),
            ones=np.zeros((num_cohorts, nbits), dtype=np.int64),
        )

    @property
    def report_bytes(self) -> int:
        return (self.nbits + 7) // 8

    @property
    def num_reports(self) -> int:
        return int(self.totals.sum())

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
        if cohorts.size and int(cohorts.max()) >= self.num_cohorts:
            raise CountsShapeError(
                f"cohort {int(cohorts.max())} out of range [0, {self.num_cohorts})"
            )
        extra = nb * 8 - self.nbits
        if extra and bits.size and int((bits[:, -1] >> (8 - extra)).max()) != 0:
            raise CountsShapeError(f"padding bits past bit {self.nbits} must be zero")

    def add(self, cohorts: npt.NDArray[Any], bits: npt.NDArray[np.uint8]) -> None:
        """Count a batch: ``cohorts`` (n,) ints, ``bits`` (n, ceil(k/8)) uint8. Validates first."""
        cohorts = np.asarray(cohorts)
        bits = np.asarray(bits, dtype=np.uint8)
        self.check_batch(cohorts, bits)
        n, nb = bits.shape
        if n == 0:
            return
        self.totals += np.bincount(cohorts, minlength=self.num_cohorts).astype(np.int64)
        # Histogram of (cohort, byte column, byte value); 256*nb bins per cohort.
        stride = nb * 256
        col_offsets = (np.arange(nb, dtype=np.int64) * 256)[None, :]
        hist = np.zeros(self.num_cohorts * stride, dtype=np.int64)
        for start in range(0, n, _CHUNK):
            c = cohorts[start : start + _CHUNK].astype(np.int64)
            b = bits[start : start + _CHUNK]
            idx = (c * stride)[:, None] + col_offsets + b
            hist += np.bincount(idx.ravel(), minlength=hist.size)
        # (m, nb, 256) @ (256, 8) -> (m, nb, 8) -> (m, nb*8), drop padding bits
        per_bit = hist.reshape(self.num_cohorts, nb, 256) @ _BYTE_BITS
        self.ones += per_bit.reshape(self.num_cohorts, nb * 8)[:, : self.nbits]

    def merge(self, other: CohortCounts) -> None:
        """Add another accumulator's counts (same shape) into this one."""
        if (other.num_cohorts, other.nbits) != (self.num_cohorts, self.nbits):
            raise CountsShapeError(
                f"cannot merge counts of shape ({other.num_cohorts}, {other.nbits}) "
                f"into ({self.num_cohorts}, {self.nbits})"
            )
        self.totals += other.totals
        self.ones += other.ones

    def copy(self) -> CohortCounts:
        return CohortCounts(
            num_cohorts=self.num_cohorts,
            nbits=self.nbits,
            totals=self.totals.copy(),
            ones=self.ones.copy(),
        )


def columns_to_arrays(
    cohorts: Any, bits: bytes, count: int, report_bytes: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
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
