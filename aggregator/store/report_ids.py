"""The report ids counted in one collection window, in numpy: ``ReportIdIndex``.

An id is two uint64 words (hi, lo) in an open-addressing table with linear probing, held
in two numpy arrays and probed for a whole batch at once (vectorised rounds, no Python
loop per report). A probe reads only the ``hi`` array (8 bytes a slot); ``lo`` is read to
confirm a match of ``hi``. So ``hi == 0`` marks an empty slot: ids whose first word is
zero live in a side index of their own, words swapped. The home slot is a keyed
multiply-shift hash of both words (random odd multipliers per process), so crafted ids
cannot make probing chains long. ``check`` finds a batch's ids and the free slot each new
one would take; ``record`` then writes them there, with no second probe. The table is kept
between a quarter and half full: it doubles by a sort and one sequential pass (no probing).
The stores keep the durable copy (Redis: one blob of 16-byte ids per batch) and this index
is a cache of it. Why not a Redis set: docs/design.md, "Aggregator: store".
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["ID_BYTES", "IdCheck", "ReportIdIndex"]

ID_BYTES = 16
U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]
Positions = npt.NDArray[np.intp]  # of ids in a batch, or of slots in the table
_PAD = 1024  # slots past the last home slot: probes run on there instead of wrapping
_MAX_LOAD = 0.5  # a batch that would fill the table beyond this doubles it first...
_GROWN_LOAD = 0.25  # ...to at most this: 4x, and the load stays within 1/8..1/2
_GROW_BITS = 2
_CHUNK = 1 << 18  # slots moved at a time when the table grows
_ROW_BITS = 2
_ROW = 1 << _ROW_BITS  # slots read at once (32 bytes of ``hi``); homes start rows
_COLUMNS = np.arange(_ROW, dtype=np.intp)
_BYTE_INDEX = np.uint64(0x0001020304050607)
_PAST_ROW = np.uint64(1 << (8 * _ROW))


def _words(ids: bytes) -> tuple[U64, U64]:
    if len(ids) % ID_BYTES:
        raise ValueError(f"report ids must be {ID_BYTES} bytes each, got {len(ids)} bytes")
    words = np.frombuffer(ids, dtype="<u8").reshape(-1, 2)
    return words[:, 0].astype(np.uint64), words[:, 1].astype(np.uint64)


def _odd_words(key: bytes) -> tuple[np.uint64, np.uint64]:
    if len(key) != 16:
        raise ValueError(f"key must be 16 bytes, got {len(key)}")
    first, second = (int.from_bytes(key[i : i + 8], "little") | 1 for i in (0, 8))
    return np.uint64(first), np.uint64(second)


@dataclass(frozen=True, slots=True, eq=False)
class IdCheck:
    """What :meth:`ReportIdIndex.check` found for a batch: ``present`` are the positions
    (ascending) of its ids that are in the index; the others are recorded by
    :meth:`ReportIdIndex.record` at the free slots found here."""

    present: Positions
    index: ReportIdIndex
    version: int  # the index's version when checked: the free slots hold while it is unchanged
    hi: U64  # the ids not present, in batch order (zero-first-word ids excepted)
    lo: U64
    free: Positions  # the first free slot on each one's probe path
    zero_first: IdCheck | None  # ids whose first word is zero, checked in the side index


class ReportIdIndex:
    """A set of 16-byte report ids with whole-batch membership tests (not thread-safe).

    The all-zero id (refused by the shuffler and the aggregator) is never present and
    never stored."""

    def __init__(self, capacity: int = 1 << 12, *, key: bytes | None = None) -> None:
        self._bits = max(4, (capacity - 1).bit_length())
        self._hi: U64 = np.zeros((1 << self._bits) + _PAD, dtype=np.uint64)
        self._lo: U64 = np.zeros(self._hi.size, dtype=np.uint64)
        # the hash's multipliers (each word of ``key`` made odd): secret, random by default
        self._keys = _odd_words(os.urandom(16) if key is None else key)
        self._zero_first: ReportIdIndex | None = None
        self._version = 0
        self.count = 0  # ids in this table (the side index's not included)

    def __len__(self) -> int:
        return self.count + (len(self._zero_first) if self._zero_first is not None else 0)

    @property
    def nbytes(self) -> int:
        side = self._zero_first.nbytes if self._zero_first is not None else 0
        return int(self._hi.nbytes + self._lo.nbytes) + side

    # -- the public batch operations ---------------------------------------------------------
    def present(self, ids: bytes) -> Positions:
        """Positions (ascending) of the ids in ``ids`` that are in the index."""
        return self.check(ids).present

    def add(self, ids: bytes) -> None:
        """Add ids (16 bytes each, concatenated); those present are skipped."""
        self.record(self.check(ids))

    def check(self, ids: bytes) -> IdCheck:
        """Which of ``ids`` (16 bytes each, concatenated) are in the index, and where each
        of the others would go: pass the result to :meth:`record` to add them."""
        hi, lo = _words(ids)
        if not hi.size or hi.all():
            return self._check_words(hi, lo)
        # rare: ids with a first word of zero, checked in the side index (words swapped);
        # the all-zero id is in neither
        side = np.flatnonzero((hi == 0) & (lo != 0))
        zero_first = None
        if side.size:
            if self._zero_first is None:
                self._zero_first = ReportIdIndex()
            zero_first = self._zero_first._check_words(lo[side], hi[side])
            side = side[zero_first.present]
        main = np.flatnonzero(hi != 0)
        inner = self._check_words(hi[main], lo[main])
        return IdCheck(
            present=np.union1d(main[inner.present], side).astype(np.intp),
            index=self,
            version=inner.version,
            hi=inner.hi,
            lo=inner.lo,
            free=inner.free,
            zero_first=zero_first,
        )

    def record(self, check: IdCheck) -> None:
        """Add the ids of ``check`` that were not present (the index's own check)."""
        if check.index is not self:
            raise ValueError("an IdCheck is recorded by the index that made it")
        hi, lo, free = check.hi, check.lo, check.free
        if check.version != self._version:  # changed since: the free slots may be taken
            again = self._check_words(hi, lo)
            hi, lo, free = again.hi, again.lo, again.free
        if hi.size:
            if self.count + hi.size > _MAX_LOAD * (1 << self._bits):
                self.count += self._rebuild(hi, lo)
            else:
                self.count += self._place(hi, lo, free)
            self._version += 1
        if check.zero_first is not None and self._zero_first is not None:
            self._zero_first.record(check.zero_first)

    # -- probing -----------------------------------------------------------------------------
    def _home(self, hi: U64, lo: U64, bits: int) -> Positions:
        """The first slot of the id's home row: a keyed multiply-shift hash of both words."""
        with np.errstate(over="ignore"):
            h = hi * self._keys[0]
            h += lo * self._keys[1]
        h >>= np.uint64(64 - bits + _ROW_BITS)
        h <<= np.uint64(_ROW_BITS)
        return h.view(np.intp)

    def _check_words(self, hi: U64, lo: U64) -> IdCheck:
        """The check of ids with a non-zero first word: probe each from its home slot
        until it meets itself (present) or a free slot (its place)."""
        s = self._home(hi, lo, self._bits)
        found = np.zeros(hi.size, dtype=bool)
        if self.count:
            s, same = self._scan(s, hi, aligned=True)
            todo = np.flatnonzero(same)  # stopped on the same first word, not a free slot
            while todo.size:
                whole = self._lo.take(s[todo]) == lo[todo]
                found[todo[whole]] = True
                todo = todo[~whole]  # another id with that first word: probe on
                if todo.size:
                    at, same = self._scan(s[todo] + 1, hi[todo])
                    s[todo] = at
                    todo = todo[same]
        if found.any():
            new = ~found
            return IdCheck(
                present=np.flatnonzero(found),
                index=self,
                version=self._version,
                hi=hi[new],
                lo=lo[new],
                free=s[new],
                zero_first=None,
            )
        return IdCheck(
            present=np.zeros(0, dtype=np.intp),
            index=self,
            version=self._version,
            hi=hi,
            lo=lo,
            free=s,
            zero_first=None,
        )

    def _scan(
        self, at: Positions, want: U64 | None, *, aligned: bool = False
    ) -> tuple[Positions, Mask]:
        """For each start slot in ``at`` (``aligned``: each the first of its row), the
        first slot from there whose ``hi`` is free (0) or ``want``, and whether it is
        ``want``. A round reads the row of each start still open (one gather of 32
        bytes) and finds its first stop in whole arrays."""
        rows = self._hi.reshape(-1, _ROW)
        matched = np.zeros(at.size, dtype=bool)
        todo: Positions | None = None  # None: every start, in the first round
        while True:
            a = at if todo is None else at[todo]
            g = rows.take(a >> _ROW_BITS, axis=0)
            stop = g == 0
            same = None
            if want is not None:
                same = g == (want if todo is None else want[todo])[:, None]
                stop |= same
            row = a
            if not aligned:  # starts inside a row: the slots before them do not count
                column = a & (_ROW - 1)
                stop &= column[:, None] <= _COLUMNS
                row = a - column
                aligned = True  # the open ones go on from the start of the next row
            # the first stop's column, _ROW when none: a byte (0 or 1) a column, and a
            # byte 1 past the row; keep the lowest set bit (bit 8k) and a multiply by
            # bytes 7, 6, ..., 0 brings k to the top byte
            first = stop.view(np.uint32).astype(np.uint64).ravel()
            first |= _PAST_ROW
            first &= ~first + np.uint64(1)
            first *= _BYTE_INDEX
            first >>= np.uint64(56)
            step = first.view(np.intp)
            nxt = row + step
            open_ = step == _ROW
            if same is not None and same.any():  # rare: a stop on the first word wanted
                hit = np.flatnonzero(~open_)
                hit = hit[same.reshape(-1)[hit * _ROW + step[hit]]]
                matched[hit if todo is None else todo[hit]] = True
            if todo is None:
                at, todo = nxt, np.flatnonzero(open_)
            else:
                at[todo] = nxt
                todo = todo[open_]
            if not todo.size:
                return at, matched

    # -- writing -----------------------------------------------------------------------------
    def _place(self, hi: U64, lo: U64, free: Positions) -> int:
        """Write ids not in the table at ``free``, the first free slot on each one's path;
        returns how many were written. Ids that found the same free slot: each writes its
        row number there and the one whose number stays writes its id; a copy of that id
        is dropped, the others probe on to the next free slot."""
        placed = 0
        while hi.size:
            top = int(free.max())
            if top >= self._hi.size - 1:  # keep the last slot free
                self._widen(top)
            mark = np.arange(1, hi.size + 1, dtype=np.uint64)
            self._hi[free] = mark
            won = self._hi.take(free) == mark
            if won.all():
                self._hi[free] = hi
                self._lo[free] = lo
                return placed + int(hi.size)
            rows = np.flatnonzero(won)
            self._hi[free[rows]] = hi[rows]
            self._lo[free[rows]] = lo[rows]
            placed += int(rows.size)
            rows = np.flatnonzero(~won)
            hi, lo, free = hi[rows], lo[rows], free[rows]
            copy = (self._hi.take(free) == hi) & (self._lo.take(free) == lo)
            if copy.any():
                rows = np.flatnonzero(~copy)
                hi, lo, free = hi[rows], lo[rows], free[rows]
            free = self._scan(free + 1, None)[0]
        return placed

    def _widen(self, slot: int) -> None:
        """More slots past the end, so that ``slot`` is at least ``_PAD`` from it (in
        whole rows)."""
        more = -(-(slot + _PAD + 1 - self._hi.size) // _ROW) * _ROW
        self._hi = np.concatenate([self._hi, np.zeros(more, dtype=np.uint64)])
        self._lo = np.concatenate([self._lo, np.zeros(more, dtype=np.uint64)])

    def _rebuild(self, hi: U64, lo: U64) -> int:
        """Move the ids to a table of twice the size or more, then add ``hi``/``lo``;
        returns how many of those were added.

        A chunk of the old table that ends at a free slot holds exactly the ids whose
        home lies in it, and chunks come in home order; sorted by new home within the
        chunk, each id goes to max(its home, the previous id's slot + 1), which is where
        linear probing would put it: one pass, no probing, temporaries of a chunk's size."""
        total = self.count + hi.size
        bits = self._bits + _GROW_BITS
        while total > _GROWN_LOAD * (1 << bits):
            bits += 1
        old_hi, old_lo = self._hi, self._lo
        self._hi = np.zeros((1 << bits) + _PAD, dtype=np.uint64)
        self._lo = np.zeros(self._hi.size, dtype=np.uint64)
        last = -1  # the slot the previous id went to
        start = 0
        while start < old_hi.size:
            stop = min(start + _CHUNK, old_hi.size)
            while stop < old_hi.size and old_hi[stop - 1]:  # end on a free slot
                stop += int(np.argmin(old_hi[stop : stop + _PAD])) + 1
            held = np.flatnonzero(old_hi[start:stop] != 0)
            start, held = stop, held + start
            if not held.size:
                continue
            part_hi, part_lo = old_hi.take(held), old_lo.take(held)
            home = self._home(part_hi, part_lo, bits)
            order = np.argsort(home, kind="stable")  # nearly sorted already
            slot = home.take(order)
            step = np.arange(slot.size, dtype=np.intp)
            slot -= step
            np.maximum.accumulate(slot, out=slot)
            np.maximum(slot, last + 1, out=slot)
            slot += step
            last = int(slot[-1])
            if last >= self._hi.size - 1:  # keep the last slot free
                self._widen(last)
            self._hi[slot] = part_hi.take(order)
            self._lo[slot] = part_lo.take(order)
        del old_hi, old_lo
        self._bits = bits
        again = self._check_words(hi, lo)
        return self._place(again.hi, again.lo, again.free)
