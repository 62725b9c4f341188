"""The slot table under ``ReportIdIndex``: open addressing with linear probing, in numpy.

A slot is 8 bytes: the top 32 bits of an id's hash, then the id's position + 1 in the
index's dense array of ids (0: a free slot). The hash's top bits pick the home row of
4 slots; a batch is probed at once, a row (32 bytes) per id per round. There is no
wrap-around: probes run on past the last home row into spare slots, and the last slot
is always free. :meth:`SlotTable.move` fills a larger table from a smaller one in home
order (a sort and one sequential pass, no probing), a part at a time.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["U64", "Mask", "Positions", "SlotTable"]

U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]
Positions = npt.NDArray[np.intp]  # of ids in a batch, or of slots in the table

PAD = 1024  # slots past the last home row
CHUNK = 1 << 18  # old slots moved at a time (the size of a move's temporaries)
ROW_BITS = 2
ROW = 1 << ROW_BITS  # slots read at once; a home is the first slot of a row
_COLUMNS = np.arange(ROW, dtype=np.intp)
_BYTE_INDEX = np.uint64(0x0001020304050607)
_PAST_ROW = np.uint64(1 << (8 * ROW))
_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def first_stop(stop: Mask) -> Positions:
    """Per row of ``stop`` (n × 4), the column of its first True, 4 when none: the row's
    bytes (0 or 1) read as one number with a 1 past them, its lowest set bit (bit 8k)
    kept, and a multiply by the bytes 7, 6, ..., 0 brings k to the top byte."""
    first = stop.view(np.uint32).astype(np.uint64).ravel()
    first |= _PAST_ROW
    first &= ~first + np.uint64(1)
    first *= _BYTE_INDEX
    first >>= np.uint64(56)
    return first.view(np.intp)


class SlotTable:
    """``2**bits`` home slots (plus spare ones) pointing into a dense array of ids."""

    def __init__(self, bits: int) -> None:
        self.bits = bits
        self.slots: U64 = np.zeros((1 << bits) + PAD, dtype=np.uint64)
        self.top = -1  # the highest slot written

    @property
    def capacity(self) -> int:
        return 1 << self.bits

    def home(self, tag: U64) -> Positions:
        """The first slot of each home row: the top bits of the hash."""
        row = tag >> np.uint64(32 - self.bits + ROW_BITS)
        row <<= np.uint64(ROW_BITS)
        return row.view(np.intp)

    def scan(
        self, at: Positions, tag: U64 | None = None, *, aligned: bool = False
    ) -> tuple[Positions, Mask]:
        """For each start slot in ``at`` (``aligned``: each the first of its row), the
        first slot from there that is free or (``tag`` given) holds those hash bits,
        and whether it holds them. A round reads the row of each start still open (one
        gather of 32 bytes) and finds its first stop in whole arrays."""
        rows = self.slots.reshape(-1, ROW)
        matched = np.zeros(at.size, dtype=bool)
        todo: Positions | None = None  # None: every start, in the first round
        while True:
            a = at if todo is None else at[todo]
            g = rows.take(a >> ROW_BITS, axis=0)
            stop = g == 0
            same = None
            if tag is not None:
                same = (g >> _32) == (tag if todo is None else tag[todo])[:, None]
                stop |= same
            row = a
            if not aligned:  # starts inside a row: the slots before them do not count
                column = a & (ROW - 1)
                stop &= column[:, None] <= _COLUMNS
                row = a - column
                aligned = True  # the open ones go on from the start of the next row
            step = first_stop(stop)
            nxt = row + step
            open_ = step == ROW
            if same is not None and same.any():  # rare: a slot with the same hash bits
                hit = np.flatnonzero(~open_)
                hit = hit[g.reshape(-1).take(hit * ROW + step[hit]) != 0]  # not free
                matched[hit if todo is None else todo[hit]] = True
            if todo is None:
                at, todo = nxt, np.flatnonzero(open_)
            else:
                at[todo] = nxt
                todo = todo[open_]
            if not todo.size:
                return at, matched

    def held(self, slots: Positions, ids: U64) -> U64:
        """The ids (rows of ``ids``) that the occupied ``slots`` point to."""
        return ids.take((self.slots.take(slots) & _LOW).view(np.intp) - 1, axis=0)

    def find(self, words: U64, tag: U64, s: Positions, ids: U64) -> Mask:
        """Which ids are in the table; ``s`` (their home slots) becomes, for the others,
        the first free slot on their probe path. A slot with the same hash bits is
        confirmed on both words of the id."""
        found = np.zeros(tag.size, dtype=bool)
        at, same = self.scan(s, tag, aligned=True)
        s[...] = at
        todo = np.flatnonzero(same)
        while todo.size:
            whole = (self.held(s[todo], ids) == words[todo]).all(axis=1)
            found[todo[whole]] = True
            todo = todo[~whole]  # another id with those hash bits: probe on
            if todo.size:
                at, same = self.scan(s[todo] + 1, tag[todo])
                s[todo] = at
                todo = todo[same]
        return found

    def place(self, words: U64, tag: U64, free: Positions, ids: U64, count: int) -> int:
        """Append ids not in the table to ``ids`` (which holds ``count``) and point to
        them from ``free``, the first free slot on each one's path; returns the new
        count. Ids that found the same free slot: each writes its row number there and
        the one whose number stays is written; a copy of that id is dropped, the others
        probe on to the next free slot."""
        while tag.size:
            top = int(free.max())
            if top >= self.slots.size - 1:  # keep the last slot free
                self.widen(top)
            mark = np.arange(1, tag.size + 1, dtype=np.uint64)
            self.slots[free] = mark
            won = self.slots.take(free) == mark
            rows = None if won.all() else np.flatnonzero(won)
            end = count + (tag.size if rows is None else rows.size)
            if rows is None:
                ids[count:end] = words
                at, slot = free, tag << _32
            else:
                ids[count:end] = words[rows]
                at, slot = free[rows], tag[rows] << _32
            slot |= np.arange(count + 1, end + 1, dtype=np.uint64)
            self.slots[at] = slot
            self.top = max(self.top, top)
            count = end
            if rows is None:
                return count
            rows = np.flatnonzero(~won)
            words, tag, free = words[rows], tag[rows], free[rows]
            copy = (self.held(free, ids) == words).all(axis=1)
            if copy.any():
                rows = np.flatnonzero(~copy)
                words, tag, free = words[rows], tag[rows], free[rows]
            free, _ = self.scan(free + 1)
        return count

    def widen(self, slot: int) -> None:
        """More spare slots, so that ``slot`` is ``PAD`` or more from the end."""
        more = -(-(slot + PAD + 1 - self.slots.size) // ROW) * ROW
        self.slots = np.concatenate([self.slots, np.zeros(more, dtype=np.uint64)])

    def move(self, old: SlotTable, start: int, until: int) -> int:
        """Move the slots of ``old`` from ``start`` (after a free slot) up to ``until``
        or the next free slot past it; returns where it stopped.

        A part of ``old`` that ends at a free slot holds exactly the ids whose home lies
        in it, and parts come in home order, as do the homes here; sorted by home here
        within a part, each slot goes to max(its home, the slot before's + 1, past all
        written here), which is where linear probing would put it."""
        src = old.slots
        stop = min(until, src.size)
        while stop < src.size and src[stop - 1]:  # end on a free slot
            stop += int(np.argmin(src[stop : stop + PAD])) + 1
        while start < stop:
            end = min(start + CHUNK, stop)
            while src[end - 1]:  # end on a free slot (stop - 1 is one)
                end += int(np.argmin(src[end : end + PAD])) + 1
            held = np.flatnonzero(src[start:end] != 0)
            part = src[start:end].take(held)
            start = end
            if not held.size:
                continue
            home = self.home(part >> _32)
            order = np.argsort(home, kind="stable")  # nearly sorted already
            slot = home.take(order)
            step = np.arange(slot.size, dtype=np.intp)
            slot -= step
            np.maximum.accumulate(slot, out=slot)
            np.maximum(slot, self.top + 1, out=slot)
            slot += step
            self.top = int(slot[-1])
            if self.top >= self.slots.size - 1:  # keep the last slot free
                self.widen(self.top)
            self.slots[slot] = part.take(order)
        return stop
