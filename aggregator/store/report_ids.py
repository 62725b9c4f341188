"""The report ids counted in one collection window, in numpy: ``ReportIdIndex``.

Ids sit in a dense array (two 8-byte words a row) in the order they were added; a table
of 8-byte slots with linear probing points into it
(:mod:`crowdmix.aggregator.store.report_id_table`). The hash is Thorup's pair-multiply-
shift of the id's four 32-bit pieces with a random key per process: 2-universal, so ids
crafted without the key collide no more often than random ones and chains stay short.
``check`` finds a batch's ids and the free slot each new one would take;
``record`` writes them there, with no second probe. The table is kept at most half full;
it grows 4x a part at a time: each ``record`` moves a share of the old table's slots to
the new one, and until all are moved an id is looked up in the table that holds its
home (no stall, no id looked up twice). The stores keep the durable copy (Redis: one
blob of 16-byte ids per batch); this index is a cache of it. Why not a Redis set:
docs/design.md, "Aggregator: store".
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from crowdmix.aggregator.store.report_id_table import U64, Mask, Positions, SlotTable

__all__ = ["ID_BYTES", "IdCheck", "ReportIdIndex"]

ID_BYTES = 16
_MAX_LOAD = 0.5  # a batch that would fill the table beyond this starts a grow...
_GROW_BITS = 2  # ...to a table 4x as large (or more, for a batch larger than the table)
_OLD_LOAD = 0.75  # ids still going to the old table while it is moved: at most this full
_MAX_BITS = 32  # the hash bits a slot keeps: enough to find the home at any size
_MOVE = 1 << 16  # old slots moved per record while growing, at least (and 8 per id):
# the old table is all moved before the ids still going to it fill it (_OLD_LOAD)
_32 = np.uint64(32)


def _words(ids: bytes) -> U64:
    """The ids as rows of two words (a read-only view of ``ids``, not a copy)."""
    if len(ids) % ID_BYTES:
        raise ValueError(f"report ids must be {ID_BYTES} bytes each, got {len(ids)} bytes")
    return np.frombuffer(ids, dtype="<u8").astype(np.uint64, copy=False).reshape(-1, 2)


KEY_BYTES = 40  # five 64-bit words: a0..a3 and b of the pair-multiply-shift
_LOW = np.uint64(0xFFFFFFFF)


def _key_words(key: bytes) -> tuple[np.uint64, ...]:
    if len(key) != KEY_BYTES:
        raise ValueError(f"key must be {KEY_BYTES} bytes, got {len(key)}")
    return tuple(np.uint64(int.from_bytes(key[i : i + 8], "little")) for i in range(0, 40, 8))


@dataclass(frozen=True, slots=True, eq=False)
class IdCheck:
    """What :meth:`ReportIdIndex.check` found for a batch: ``present`` are the positions
    (ascending) of its ids that are in the index. The other fields are the index's own:
    the ids not present and where :meth:`ReportIdIndex.record` will put them."""

    present: Positions
    index: ReportIdIndex
    version: int  # the index's version when checked: the free slots hold while it is unchanged
    words: U64  # the ids not present (nor all zero), in batch order: rows of two words
    tag: U64  # their hash's top 32 bits
    free: Positions  # the first free slot on each one's probe path
    into_old: Mask | None  # while the table grows: which of them go to the old table


class ReportIdIndex:
    """A set of 16-byte report ids with whole-batch membership tests (not thread-safe).

    The all-zero id (refused by the shuffler and the aggregator) is never present and
    never stored. ``key``: the hash's secret (40 bytes); random unless a test sets it.
    ``move``: old slots moved per :meth:`record` while the table grows, at least."""

    def __init__(
        self, capacity: int = 1 << 12, *, key: bytes | None = None, move: int = _MOVE
    ) -> None:
        if move < 1:
            raise ValueError(f"move must be positive, got {move}")
        self._table = SlotTable(min(_MAX_BITS, max(4, (capacity - 1).bit_length())))
        self._old: SlotTable | None = None  # while growing: the table being emptied
        self._frontier = 0  # old slots below it are moved (the next part starts there)
        # the ids in the order added, two words a row
        self._ids: U64 = np.zeros((int(_MAX_LOAD * self._table.capacity), 2), np.uint64)
        self._keys = _key_words(os.urandom(KEY_BYTES) if key is None else key)
        self._move = move
        self._version = 0
        self.count = 0

    def __len__(self) -> int:
        return self.count

    @property
    def nbytes(self) -> int:
        old = self._old.slots.nbytes if self._old is not None else 0
        return int(self._table.slots.nbytes + old + self._ids.nbytes)

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
        found, free, into_old = self._probe(words, tag)
        present = np.flatnonzero(found)
        if present.size:
            new = np.flatnonzero(~found)
            words, tag, free = words[new], tag[new], free[new]
            into_old = into_old[new] if into_old is not None else None
        return IdCheck(
            present=present if live is None else live[present],
            index=self,
            version=self._version,
            words=words,
            tag=tag,
            free=free,
            into_old=into_old,
        )

    def record(self, check: IdCheck) -> None:
        """Add the ids of ``check`` that were not present (the index's own check)."""
        if check.index is not self:
            raise ValueError("an IdCheck is recorded by the index that made it")
        words, tag, free, into_old = check.words, check.tag, check.free, check.into_old
        if not tag.size:
            return
        if check.version != self._version:  # changed since: the free slots may be taken
            found, free, into_old = self._probe(words, tag)
            if found.any():
                new = np.flatnonzero(~found)
                words, tag, free = words[new], tag[new], free[new]
                into_old = into_old[new] if into_old is not None else None
        total = self.count + tag.size
        moved = False
        if total > _MAX_LOAD * self._table.capacity:
            self._move_part(None)  # finish a grow under way first
            self._grow(total)
            moved = True
        if self._old is not None and total > _OLD_LOAD * self._old.capacity:
            self._move_part(None)  # the old table would fill up: move the rest now
            moved = True
        if moved:
            free, into_old = self._free(tag)
        if into_old is None or not into_old.any():
            self.count = self._table.place(words, tag, free, self._ids, self.count)
        else:
            for table, mask in ((self._old, into_old), (self._table, ~into_old)):
                rows = np.flatnonzero(mask)
                if rows.size and table is not None:
                    self.count = table.place(
                        words[rows], tag[rows], free[rows], self._ids, self.count
                    )
        if self._old is not None:
            self._move_part(self._frontier + max(self._move, 8 * tag.size))
        self._version += 1

    # -- lookups -----------------------------------------------------------------------------
    def _tag(self, words: U64) -> U64:
        """The top 32 bits of the ids' hash. With the id's 32-bit pieces x0..x3 (low and
        high half of each word) and the key's 64-bit a0..a3, b: ((x0 + a0)(x1 + a1) +
        (x2 + a2)(x3 + a3) + b) mod 2^64, top 32 bits. Thorup, "High Speed Hashing for
        Integers and Strings" (2015), pair-multiply-shift: two ids collide with
        probability at most 2^-31 over the key (2-universal: 64 >= 32 + 32 - 1)."""
        a0, a1, a2, a3, b = self._keys
        w0, w1 = words[:, 0], words[:, 1]
        with np.errstate(over="ignore"):
            h = ((w0 & _LOW) + a0) * ((w0 >> _32) + a1)
            h += ((w1 & _LOW) + a2) * ((w1 >> _32) + a3)
            h += b
        h >>= _32
        return h

    def _homes(self, tag: U64) -> tuple[Positions, Mask | None]:
        """Each id's home slot, in the table that holds its home: while the table grows,
        the old one for a home past the part already moved (``into_old``)."""
        home = self._table.home(tag)
        if self._old is None:
            return home, None
        old_home = self._old.home(tag)
        into_old = old_home >= self._frontier
        np.copyto(home, old_home, where=into_old)
        return home, into_old

    def _probe(self, words: U64, tag: U64) -> tuple[Mask, Positions, Mask | None]:
        """Which ids are in the index, the free slot each of the others would take, and
        (while growing) which of them go to the old table."""
        free, into_old = self._homes(tag)
        if not self.count:
            return np.zeros(tag.size, dtype=bool), free, into_old
        if into_old is None:
            return self._table.find(words, tag, free, self._ids), free, into_old
        found = np.zeros(tag.size, dtype=bool)
        for table, mask in ((self._old, into_old), (self._table, ~into_old)):
            rows = np.flatnonzero(mask)
            if rows.size and table is not None:
                s = free[rows]
                found[rows] = table.find(words[rows], tag[rows], s, self._ids)
                free[rows] = s
        return found, free, into_old

    def _free(self, tag: U64) -> tuple[Positions, Mask | None]:
        """The free slot each id (not in the index) would take, and (while growing)
        which of them go to the old table."""
        free, into_old = self._homes(tag)
        if into_old is None:
            return self._table.scan(free, aligned=True)[0], None
        for table, rows in ((self._old, into_old), (self._table, ~into_old)):
            pick = np.flatnonzero(rows)
            if pick.size and table is not None:
                free[pick] = table.scan(free[pick], aligned=True)[0]
        return free, into_old

    # -- growing -----------------------------------------------------------------------------
    def _grow(self, total: int) -> None:
        """Start moving to a table 4x as large (or more: ``total`` ids at most a quarter
        full); the ids array grows with it."""
        bits = self._table.bits + _GROW_BITS
        while total > _MAX_LOAD * (1 << bits) / 2:
            bits += 1
        if bits > _MAX_BITS:
            raise MemoryError(f"a report-id index holds at most {1 << (_MAX_BITS - 2)} ids")
        self._old, self._table, self._frontier = self._table, SlotTable(bits), 0
        ids = np.zeros((int(_MAX_LOAD * (1 << bits)), 2), dtype=np.uint64)
        ids[: self.count] = self._ids[: self.count]
        self._ids = ids
        self._version += 1

    def _move_part(self, until: int | None) -> None:
        """Move the old table's slots up to ``until`` (or a little past; None: all) to
        the new one."""
        if self._old is None:
            return
        end = self._old.slots.size if until is None else until
        self._frontier = self._table.move(self._old, self._frontier, end)
        if self._frontier >= self._old.slots.size:
            self._old = None
        self._version += 1
