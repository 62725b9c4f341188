"""Accumulators for the basic mechanisms whose payload is not a bit vector.

Payload layouts are defined once, in ``crowdmix.core.basic``. Both accumulators keep
one cohort and store the *support* of each domain value v in ``ones[0, v]``
(Wang et al., USENIX Security 2017, §3: a report "supports" the values it is
consistent with), so the decoders see one shape for every mechanism:

- k-RR (``IndexCounts``): the report supports the index it carries.
- OLH (``OlhSupportCounts``): a report (a, b, y) supports every v with
  H_{a,b}(v) = y, H(x) = ((a·x + b) mod P) mod g, P = 2^31 - 1. Supports are
  computed when the batch is added, in numpy over (reports × domain) tiles.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.counting.counts import Counts, CountsShapeError
from crowdmix.core.basic import OLH_PRIME, index_bytes

__all__ = ["IndexCounts", "OlhSupportCounts", "olh_hashes"]

# Elements of one (reports × domain) tile of OLH hashes: keeps temporaries ~8 MB.
_OLH_TILE = 1 << 20
_P = np.uint64(OLH_PRIME)
_SHIFT31 = np.uint64(31)


def _le_uint(bits: npt.NDArray[np.uint8], start: int, width: int) -> npt.NDArray[np.uint64]:
    """Little-endian unsigned integers stored in columns [start, start+width) of each row."""
    out = np.zeros(bits.shape[0], dtype=np.uint64)
    for i in range(width):
        out |= bits[:, start + i].astype(np.uint64) << np.uint64(8 * i)
    return out


def olh_hashes(
    a: npt.ArrayLike, b: npt.ArrayLike, x: npt.ArrayLike, g: int
) -> npt.NDArray[np.uint64]:
    """``crowdmix.core.basic.olh_hash`` vectorised: ((a·x + b) mod P) mod g, broadcasting a, b, x.

    With a < P = 2^31 - 1 and x < 2^24 the product stays below 2^55, so uint64
    is exact; mod P uses the Mersenne identity 2^31 ≡ 1 (mod P) instead of a
    64-bit division.
    """
    v = np.asarray(a, dtype=np.uint64) * np.asarray(x, dtype=np.uint64) + np.asarray(
        b, dtype=np.uint64
    )
    v = (v & _P) + (v >> _SHIFT31)  # < 2^31 + 2^25: one more fold suffices
    v = (v & _P) + (v >> _SHIFT31)
    v = np.where(v >= _P, v - _P, v)
    return v % np.uint64(g)


class IndexCounts(Counts):
    """k-RR: ``ones[0, v]`` = reports carrying index v; payload ``index_bytes(d)`` bytes
    (or ``report_bytes``: a heavy-hitters metric's fixed length, whatever its round)."""

    __slots__ = ("_width",)

    kind: ClassVar[str] = "index"

    def __init__(self, domain_size: int, report_bytes: int | None = None) -> None:
        super().__init__(1, domain_size)
        self._width = index_bytes(domain_size) if report_bytes is None else report_bytes
        if self._width < index_bytes(domain_size):
            raise CountsShapeError(f"{report_bytes} bytes cannot hold an index below {domain_size}")

    @property
    def report_bytes(self) -> int:
        return self._width

    def _empty_like(self) -> IndexCounts:
        return IndexCounts(self.nbits, self._width)

    def _indexes(self, cohorts: Any, bits: Any) -> npt.NDArray[np.uint64]:
        c, b = self._as_batch(cohorts, bits)
        self.check_batch(c, b)
        idx = _le_uint(b, 0, self.report_bytes)
        if idx.size and int(idx.max()) >= self.nbits:
            raise CountsShapeError(
                f"reported index {int(idx.max())} out of range [0, {self.nbits})"
            )
        return idx

    def add(self, cohorts: Any, bits: Any) -> None:
        idx = self._indexes(cohorts, bits)
        self._totals[0] += idx.size
        self._ones[0] += np.bincount(idx.astype(np.intp), minlength=self.nbits)


class OlhSupportCounts(Counts):
    """OLH: ``ones[0, v]`` = reports (a, b, y) with H_{a,b}(v) = y; payload 8 + index_bytes(g)."""

    __slots__ = ("buckets",)

    kind: ClassVar[str] = "olh"

    def __init__(self, domain_size: int, buckets: int) -> None:
        super().__init__(1, domain_size)
        if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 2:
            raise CountsShapeError(f"buckets must be an integer >= 2, got {buckets!r}")
        self.buckets = buckets

    @property
    def report_bytes(self) -> int:
        return 8 + index_bytes(self.buckets)

    def _empty_like(self) -> OlhSupportCounts:
        return OlhSupportCounts(self.nbits, self.buckets)

    def _same_shape(self, other: Counts) -> bool:
        return super()._same_shape(other) and getattr(other, "buckets", None) == self.buckets

    def add(self, cohorts: Any, bits: Any) -> None:
        c, b = self._as_batch(cohorts, bits)
        self.check_batch(c, b)
        n = b.shape[0]
        a = _le_uint(b, 0, 4)
        off = _le_uint(b, 4, 4)
        y = _le_uint(b, 8, index_bytes(self.buckets))
        if n:
            if int(a.min()) < 1 or int(a.max()) >= OLH_PRIME:
                raise CountsShapeError(f"OLH hash parameter a must be in [1, {OLH_PRIME})")
            if int(off.max()) >= OLH_PRIME:
                raise CountsShapeError(f"OLH hash parameter b must be in [0, {OLH_PRIME})")
            if int(y.max()) >= self.buckets:
                raise CountsShapeError(f"OLH bucket y must be in [0, {self.buckets})")
        d = self.nbits
        support = np.zeros(d, dtype=np.int64)
        domain = np.arange(d, dtype=np.uint64)
        rows = max(1, _OLH_TILE // d)
        cols = min(d, _OLH_TILE)
        for r0 in range(0, n, rows):
            ar, br, yr = a[r0 : r0 + rows, None], off[r0 : r0 + rows, None], y[r0 : r0 + rows]
            for c0 in range(0, d, cols):
                h = olh_hashes(ar, br, domain[None, c0 : c0 + cols], self.buckets)
                support[c0 : c0 + cols] += np.count_nonzero(h == yr[:, None], axis=0)
        self._totals[0] += n
        self._ones[0] += support
