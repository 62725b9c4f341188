"""The report ids counted in one collection window, in numpy: ``ReportIdIndex``.

An id is two uint64 words (hi, lo) in an open-addressing hash table with linear probing,
held in two numpy arrays and probed for a whole batch at once (a few vectorised rounds,
no Python loop per report). The table is kept at most half full and grows 4x at a time
(32 to 128 bytes per id). The slot is a keyed mix of ``hi`` (XOR with a per-process random
salt, then a multiply by an odd constant), so crafted ids cannot make probing chains long.
The all-zero id marks an empty slot and is never stored (the shuffler and the aggregator
refuse it). The stores keep the durable copy (Redis: one blob of 16-byte ids per batch)
and this index is a cache of it. Why not a Redis set: docs/design.md, "Aggregator: store".
"""

from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt

__all__ = ["ID_BYTES", "ReportIdIndex"]

ID_BYTES = 16
_MIX = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio, odd: a bijective multiply
_ONE = np.uint64(1)
U64 = npt.NDArray[np.uint64]


def _words(ids: bytes) -> tuple[U64, U64]:
    if len(ids) % ID_BYTES:
        raise ValueError(f"report ids must be {ID_BYTES} bytes each, got {len(ids)} bytes")
    words = np.frombuffer(ids, dtype="<u8").reshape(-1, 2)
    return words[:, 0].astype(np.uint64), words[:, 1].astype(np.uint64)


class ReportIdIndex:
    """A set of 16-byte report ids with whole-batch membership tests (not thread-safe)."""

    def __init__(self, capacity: int = 1 << 12) -> None:
        self._bits = max(4, (capacity - 1).bit_length())
        # one row (hi, lo) per slot: a probe touches one cache line, not two
        self._table: U64 = np.zeros((1 << self._bits, 2), dtype=np.uint64)
        self._salt = np.frombuffer(os.urandom(8), dtype="<u8").astype(np.uint64)[0]
        self.count = 0

    def __len__(self) -> int:
        return self.count

    @property
    def nbytes(self) -> int:
        return int(self._table.nbytes)

    def _slots(self, hi: U64) -> U64:
        with np.errstate(over="ignore"):
            mixed: U64 = ((hi ^ self._salt) * _MIX) >> np.uint64(64 - self._bits)
        return mixed

    def present(self, ids: bytes) -> npt.NDArray[np.intp]:
        """Positions (ascending) of the ids in ``ids`` that are in the index."""
        if not ids or not self.count:
            return np.zeros(0, dtype=np.intp)
        hi, lo = _words(ids)
        mask = np.uint64((1 << self._bits) - 1)
        slot = self._slots(hi)
        todo = np.arange(hi.shape[0], dtype=np.intp)
        found = np.zeros(hi.shape[0], dtype=bool)
        while todo.size:
            s = slot[todo]
            rows = self._table[s]
            th, tl = rows[:, 0], rows[:, 1]
            occupied = (th != 0) | (tl != 0)  # an empty slot ends the probe: absent
            match = occupied & (th == hi[todo]) & (tl == lo[todo])
            found[todo[match]] = True
            open_ = occupied & ~match  # occupied by another id: probe on
            todo = todo[open_]
            slot[todo] = (slot[todo] + _ONE) & mask
        return np.flatnonzero(found)

    def add(self, ids: bytes) -> None:
        """Add distinct ids (16 bytes each, concatenated) that are not in the index yet;
        all-zero ids (the empty-slot marker) are skipped."""
        if not ids:
            return
        hi, lo = _words(ids)
        keep = (hi != 0) | (lo != 0)
        if not keep.all():
            hi, lo = hi[keep], lo[keep]
        while 2 * (self.count + hi.shape[0]) > (1 << self._bits):
            self._grow()
        self._insert(hi, lo)
        self.count += int(hi.shape[0])

    def _grow(self) -> None:
        occupied = (self._table[:, 0] != 0) | (self._table[:, 1] != 0)
        old = self._table[occupied]
        self._bits += 2  # x4: fewer rehashes (each re-inserts every id) at up to 4x the memory
        self._table = np.zeros((1 << self._bits, 2), dtype=np.uint64)
        self._insert(old[:, 0], old[:, 1])

    def _insert(self, hi: U64, lo: U64) -> None:
        mask = np.uint64((1 << self._bits) - 1)
        slot = self._slots(hi)
        todo = np.arange(hi.shape[0], dtype=np.intp)
        while todo.size:
            s = slot[todo]
            rows = self._table[s]
            at = np.flatnonzero((rows[:, 0] == 0) & (rows[:, 1] == 0))
            cand, cs = todo[at], s[at]
            # several ids may want one free slot: the last write wins, the others probe on
            self._table[cs, 0], self._table[cs, 1] = hi[cand], lo[cand]
            got = self._table[cs]
            won = (got[:, 0] == hi[cand]) & (got[:, 1] == lo[cand])
            placed = np.zeros(todo.shape[0], dtype=bool)
            placed[at[won]] = True
            todo = todo[~placed]
            slot[todo] = (slot[todo] + _ONE) & mask
