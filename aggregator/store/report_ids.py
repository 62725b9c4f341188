"""The report ids counted in one collection window, in numpy: ``ReportIdIndex``.

Ids sit in a dense array (two 8-byte words a row) in the order they were added; an
open-addressing table with linear probing points into it. A slot is 8 bytes: the top
32 bits of the id's hash, then its dense position + 1 (0: a free slot). The hash is a
keyed multiply-shift of both words (random odd multipliers per process), so crafted ids
cannot make probing chains long; its top bits pick the home row of 4 slots. A batch is
probed at once, a row (32 bytes) per id per round; a slot whose hash bits match is
confirmed on all 16 bytes of the id. ``check`` finds a batch's ids and the free slot each
new one would take; ``record`` writes them there, with no second probe. The table is kept
at most half full and grows 4x by moving slots in home order (a sort, one sequential
pass, no probing and no id read). The stores keep the durable copy (Redis: one blob of
16-byte ids per batch); this index is a cache of it. Why not a Redis set:
docs/design.md, "Aggregator: store".
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
_MAX_LOAD = 0.5  # a batch that would fill the table beyond this grows it first...
_GROW_BITS = 2  # ...4x (or more, for a batch larger than the table)
_MAX_BITS = 32  # the hash bits a slot keeps: enough to find the home at any size
_PAD = 1024  # slots past the last home row: probes run on there instead of wrapping
_CHUNK = 1 << 18  # slots moved at a time when the table grows
_ROW_BITS = 2
_ROW = 1 << _ROW_BITS  # slots read at once (32 bytes); a home is the first slot of a row
_COLUMNS = np.arange(_ROW, dtype=np.intp)
_BYTE_INDEX = np.uint64(0x0001020304050607)
_PAST_ROW = np.uint64(1 << (8 * _ROW))
_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def _words(ids: bytes) -> U64:
    """The ids as rows of two words (a read-only view of ``ids``, not a copy)."""
    if len(ids) % ID_BYTES:
        raise ValueError(f"report ids must be {ID_BYTES} bytes each, got {len(ids)} bytes")
    return np.frombuffer(ids, dtype="<u8").astype(np.uint64, copy=False).reshape(-1, 2)


def _odd_words(key: bytes) -> tuple[np.uint64, np.uint64]:
    if len(key) != 16:
        raise ValueError(f"key must be 16 bytes, got {len(key)}")
    first, second = (int.from_bytes(key[i : i + 8], "little") | 1 for i in (0, 8))
    return np.uint64(first), np.uint64(second)


def _first_stop(stop: Mask) -> Positions:
    """Per row of ``stop`` (n × 4), the column of its first True, 4 when none: the row's
    bytes (0 or 1) read as one number with a 1 past them, its lowest set bit (bit 8k)
    kept, and a multiply by the bytes 7, 6, ..., 0 brings k to the top byte."""
    first = stop.view(np.uint32).astype(np.uint64).ravel()
    first |= _PAST_ROW
    first &= ~first + np.uint64(1)
    first *= _BYTE_INDEX
    first >>= np.uint64(56)
    return first.view(np.intp)


@dataclass(frozen=True, slots=True, eq=False)
class IdCheck:
    """What :meth:`ReportIdIndex.check` found for a batch: ``present`` are the positions
    (ascending) of its ids that are in the index; the others are recorded by
    :meth:`ReportIdIndex.record` at the free slots found here."""

    present: Positions
    index: ReportIdIndex
    version: int  # the index's version when checked: the free slots hold while it is unchanged
    words: U64  # the ids not present (nor all zero), in batch order: rows of two words
    tag: U64  # their hash's top 32 bits
    free: Positions  # the first free slot on each one's probe path


class ReportIdIndex:
    """A set of 16-byte report ids with whole-batch membership tests (not thread-safe).

    The all-zero id (refused by the shuffler and the aggregator) is never present and
    never stored. ``key``: the hash's secret (16 bytes); random unless a test sets it."""

    def __init__(self, capacity: int = 1 << 12, *, key: bytes | None = None) -> None:
        self._bits = min(_MAX_BITS, max(4, (capacity - 1).bit_length()))
        self._slots: U64 = np.zeros((1 << self._bits) + _PAD, dtype=np.uint64)
        # the ids in the order added, two words a row
        self._ids: U64 = np.zeros((int(_MAX_LOAD * (1 << self._bits)), 2), dtype=np.uint64)
        self._keys = _odd_words(os.urandom(16) if key is None else key)
        self._version = 0
        self.count = 0

    def __len__(self) -> int:
        return self.count

    @property
    def nbytes(self) -> int:
        return int(self._slots.nbytes + self._ids.nbytes)

    # -- the batch operations ----------------------------------------------------------------
    def present(self, ids: bytes) -> Positions:
        """Positions (ascending) of the ids in ``ids`` that are in the index."""
        return self.check(ids).present

    def add(self, ids: bytes) -> None:
        """Add ids (16 bytes each, concatenated); those present are skipped."""
        self.record(self.check(ids))

    def check(self, ids: bytes) -> IdCheck:
        """Which of ``ids`` (16 bytes each, concatenated) are in the index, and where each
        of the others would go: pass the result to :meth:`record` to add them."""
        words = _words(ids)
        live = None
        if words.size and not words.all():  # rare: a zero word; an all-zero id?
            keep = words.any(axis=1)
            if not keep.all():
                live = np.flatnonzero(keep)
                words = words[live]
        tag = self._tag(words)
        free = self._home(tag, self._bits)
        found = self._find(words, tag, free) if self.count else np.zeros(tag.size, dtype=bool)
        present = np.flatnonzero(found)
        if present.size:
            new = np.flatnonzero(~found)
            words, tag, free = words[new], tag[new], free[new]
        return IdCheck(
            present=present if live is None else live[present],
            index=self,
            version=self._version,
            words=words,
            tag=tag,
            free=free,
        )

    def record(self, check: IdCheck) -> None:
        """Add the ids of ``check`` that were not present (the index's own check)."""
        if check.index is not self:
            raise ValueError("an IdCheck is recorded by the index that made it")
        words, tag, free = check.words, check.tag, check.free
        if not tag.size:
            return
        if check.version != self._version:  # changed since: the free slots may be taken
            free = self._home(tag, self._bits)
            if self.count:
                new = np.flatnonzero(~self._find(words, tag, free))
                words, tag, free = words[new], tag[new], free[new]
        if self.count + tag.size > _MAX_LOAD * (1 << self._bits):
            self._grow(self.count + tag.size)
            free, _ = self._scan(self._home(tag, self._bits), None, aligned=True)
        self._place(words, tag, free)
        self._version += 1

    # -- probing -----------------------------------------------------------------------------
    def _tag(self, words: U64) -> U64:
        """The top 32 bits of the ids' hash: a keyed multiply-shift of both words."""
        with np.errstate(over="ignore"):
            h = words[:, 0] * self._keys[0]
            h += words[:, 1] * self._keys[1]
        h >>= _32
        return h

    @staticmethod
    def _home(tag: U64, bits: int) -> Positions:
        """The first slot of the home row: the top bits of the hash."""
        row = tag >> np.uint64(32 - bits + _ROW_BITS)
        row <<= np.uint64(_ROW_BITS)
        return row.view(np.intp)

    def _find(self, words: U64, tag: U64, s: Positions) -> Mask:
        """Which ids are in the table; ``s`` (their home slots) becomes, for the others,
        the first free slot on their probe path."""
        found = np.zeros(tag.size, dtype=bool)
        at, same = self._scan(s, tag, aligned=True)
        s[...] = at
        todo = np.flatnonzero(same)  # stopped on a slot with the same hash bits
        while todo.size:
            whole = (self._held(s[todo]) == words[todo]).all(axis=1)
            found[todo[whole]] = True
            todo = todo[~whole]  # another id with those hash bits: probe on
            if todo.size:
                at, same = self._scan(s[todo] + 1, tag[todo])
                s[todo] = at
                todo = todo[same]
        return found

    def _held(self, slots: Positions) -> U64:
        """The ids the (occupied) ``slots`` point to."""
        return self._ids.take((self._slots.take(slots) & _LOW).view(np.intp) - 1, axis=0)

    def _scan(
        self, at: Positions, tag: U64 | None, *, aligned: bool = False
    ) -> tuple[Positions, Mask]:
        """For each start slot in ``at`` (``aligned``: each the first of its row), the
        first slot from there that is free or (``tag`` given) holds those hash bits,
        and whether it holds them. A round reads the row of each start still open (one
        gather of 32 bytes) and finds its first stop in whole arrays."""
        rows = self._slots.reshape(-1, _ROW)
        matched = np.zeros(at.size, dtype=bool)
        todo: Positions | None = None  # None: every start, in the first round
        while True:
            a = at if todo is None else at[todo]
            g = rows.take(a >> _ROW_BITS, axis=0)
            stop = g == 0
            same = None
            if tag is not None:
                same = (g >> _32) == (tag if todo is None else tag[todo])[:, None]
                stop |= same
            row = a
            if not aligned:  # starts inside a row: the slots before them do not count
                column = a & (_ROW - 1)
                stop &= column[:, None] <= _COLUMNS
                row = a - column
                aligned = True  # the open ones go on from the start of the next row
            step = _first_stop(stop)
            nxt = row + step
            open_ = step == _ROW
            if same is not None and same.any():  # rare: a slot with the same hash bits
                hit = np.flatnonzero(~open_)
                hit = hit[g.reshape(-1).take(hit * _ROW + step[hit]) != 0]  # not free
                matched[hit if todo is None else todo[hit]] = True
            if todo is None:
                at, todo = nxt, np.flatnonzero(open_)
            else:
                at[todo] = nxt
                todo = todo[open_]
            if not todo.size:
                return at, matched

    # -- writing -----------------------------------------------------------------------------
    def _place(self, words: U64, tag: U64, free: Positions) -> None:
        """Append ids not in the table to the dense array and point to them from
        ``free``, the first free slot on each one's path. Ids that found the same free
        slot: each writes its row number there and the one whose number stays is written;
        a copy of that id is dropped, the others probe on to the next free slot."""
        while tag.size:
            top = int(free.max())
            if top >= self._slots.size - 1:  # keep the last slot free
                self._widen(top)
            mark = np.arange(1, tag.size + 1, dtype=np.uint64)
            self._slots[free] = mark
            won = self._slots.take(free) == mark
            rows = None if won.all() else np.flatnonzero(won)
            end = self.count + (tag.size if rows is None else rows.size)
            if rows is None:
                self._ids[self.count : end] = words
                at, slot = free, tag << _32
            else:
                self._ids[self.count : end] = words[rows]
                at, slot = free[rows], tag[rows] << _32
            slot |= np.arange(self.count + 1, end + 1, dtype=np.uint64)
            self._slots[at] = slot
            self.count = end
            if rows is None:
                return
            rows = np.flatnonzero(~won)
            words, tag, free = words[rows], tag[rows], free[rows]
            copy = (self._held(free) == words).all(axis=1)
            if copy.any():
                rows = np.flatnonzero(~copy)
                words, tag, free = words[rows], tag[rows], free[rows]
            free, _ = self._scan(free + 1, None)

    def _widen(self, slot: int) -> None:
        """More slots past the end, so that ``slot`` is ``_PAD`` or more from it."""
        more = -(-(slot + _PAD + 1 - self._slots.size) // _ROW) * _ROW
        self._slots = np.concatenate([self._slots, np.zeros(more, dtype=np.uint64)])

    def _grow(self, total: int) -> None:
        """A table 4x as large (or more: room for ``total`` ids), filled from the old.

        A chunk of the old table that ends at a free slot holds exactly the ids whose
        home lies in it, and chunks come in home order; sorted by new home within the
        chunk, each slot goes to max(its home, the previous one's slot + 1), which is
        where linear probing would put it: one pass, temporaries of a chunk's size."""
        bits = self._bits + _GROW_BITS
        while total > _MAX_LOAD * (1 << bits) / 2:
            bits += 1
        if bits > _MAX_BITS:
            raise MemoryError(f"a report-id index holds at most {1 << (_MAX_BITS - 2)} ids")
        old = self._slots
        self._slots = np.zeros((1 << bits) + _PAD, dtype=np.uint64)
        last = -1  # the slot the previous one went to
        start = 0
        while start < old.size:
            stop = min(start + _CHUNK, old.size)
            while stop < old.size and old[stop - 1]:  # end on a free slot
                stop += int(np.argmin(old[stop : stop + _PAD])) + 1
            held = np.flatnonzero(old[start:stop] != 0)
            part = old[start:stop].take(held)
            start = stop
            if not held.size:
                continue
            home = self._home(part >> _32, bits)
            order = np.argsort(home, kind="stable")  # nearly sorted already
            slot = home.take(order)
            step = np.arange(slot.size, dtype=np.intp)
            slot -= step
            np.maximum.accumulate(slot, out=slot)
            np.maximum(slot, last + 1, out=slot)
            slot += step
            last = int(slot[-1])
            if last >= self._slots.size - 1:  # keep the last slot free
                self._widen(last)
            self._slots[slot] = part.take(order)
        del old
        ids = np.zeros((int(_MAX_LOAD * (1 << bits)), 2), dtype=np.uint64)
        ids[: self.count] = self._ids[: self.count]
        self._ids = ids
        self._bits = bits
        self._version += 1
