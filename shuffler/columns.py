"""Reports in columns, and the compact byte format in which the store keeps them.

A *chunk* is ``count`` reports of one metric, column by column::

    count u32 LE | report_bytes u32 LE (| IDS_FLAG) | cohorts: count × u32 LE
        | bits: count × report_bytes | report ids: count × 16 (only with IDS_FLAG)

Chunks are self-delimiting, so a buffer of several chunks (an in-flight batch)
is their plain concatenation. The format carries nothing but cohorts, bits and
the devices' report ids (fresh random per report, so they link nothing): no
time, no sender, no arrival order beyond position (which the batch permutation
destroys before anything leaves the shuffler). Every clear report has an id; a
chunk of sealed reports has none (the id is inside each seal) and no IDS_FLAG.
The Redis store's Lua script splits chunks in this same layout
(``crowdmix.shuffler.redis_store``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "HEADER",
    "IDS_FLAG",
    "ID_BYTES",
    "Chunk",
    "Pending",
    "Rows",
    "decode_chunks",
    "merge",
    "merge_blob",
    "split_blob",
]

HEADER = struct.Struct("<II")
_U32 = np.dtype("<u4")
#: Set in the report_bytes word of a chunk header when report ids follow the bits.
IDS_FLAG = 1 << 31
ID_BYTES = 16


@dataclass(frozen=True, slots=True)
class Chunk:
    """``count`` reports: ``cohorts`` (count,) uint32, their bits and their report ids
    (16 bytes each), each concatenated; ``ids`` is b"" for sealed reports (their ids
    are inside the seals)."""

    report_bytes: int
    cohorts: npt.NDArray[np.uint32]
    bits: bytes
    ids: bytes = b""

    @property
    def count(self) -> int:
        return int(self.cohorts.shape[0])

    def report_ids(self) -> bytes:
        """count × 16 bytes of report ids (zeros for sealed reports, whose ids are sealed)."""
        return self.ids or bytes(ID_BYTES * self.count)

    def bit_matrix(self) -> npt.NDArray[np.uint8]:
        """The bits as a (count, report_bytes) uint8 view (no copy)."""
        return np.frombuffer(self.bits, dtype=np.uint8).reshape(self.count, self.report_bytes)

    def to_blob(self) -> bytes:
        return b"".join(
            (
                HEADER.pack(self.count, self.report_bytes | (IDS_FLAG if self.ids else 0)),
                self.cohorts.astype(_U32, copy=False).tobytes(),
                self.bits,
                self.ids,
            )
        )

    def select(self, index: npt.NDArray[np.intp]) -> Chunk:
        """The reports at ``index``, in that order (a permutation or a keep-mask's indices)."""
        # one opaque row per report ("V<n>"): 3× faster to gather than a 2-D uint8 index
        rows = np.frombuffer(self.bits, dtype=f"V{self.report_bytes}")
        ids = b""
        if self.ids:
            ids = np.frombuffer(self.ids, dtype=f"V{ID_BYTES}")[index].tobytes()
        return Chunk(
            report_bytes=self.report_bytes,
            cohorts=self.cohorts[index],
            bits=rows[index].tobytes(),
            ids=ids,
        )

    @staticmethod
    def concat(chunks: Sequence[Chunk]) -> Chunk:
        """Several chunks of one report size as one; raises ValueError on mixed sizes."""
        if not chunks:
            raise ValueError("concat needs at least one chunk")
        rb = chunks[0].report_bytes
        if any(c.report_bytes != rb for c in chunks):
            raise ValueError("cannot concatenate chunks of different report sizes")
        if len(chunks) == 1:
            return chunks[0]
        with_ids = any(c.ids for c in chunks)
        return Chunk(
            report_bytes=rb,
            cohorts=np.concatenate([c.cohorts for c in chunks]).astype(np.uint32, copy=False),
            bits=b"".join(c.bits for c in chunks),
            ids=b"".join(c.report_ids() for c in chunks) if with_ids else b"",
        )


@dataclass(frozen=True, slots=True)
class Rows:
    """Reports that arrived as rows, still as Python values: validating and
    queueing a one-report request this way skips numpy entirely; rows become a
    ``Chunk`` once per store write (``merge``)."""

    report_bytes: int
    cohorts: list[int]
    bits: bytes
    ids: bytes = b""  # count × 16 bytes, or b"" for sealed reports

    @property
    def count(self) -> int:
        return len(self.cohorts)

    def report_ids(self) -> bytes:
        return self.ids or bytes(ID_BYTES * self.count)


Pending = Chunk | Rows


def merge(parts: Sequence[Pending]) -> Chunk:
    """Concatenate chunks and rows (all of one report size), in order, into one Chunk."""
    chunks = [
        Chunk(p.report_bytes, np.array(p.cohorts, dtype=np.uint32), p.bits, p.ids)
        if isinstance(p, Rows)
        else p
        for p in parts
    ]
    return Chunk.concat(chunks)


def merge_blob(parts: Sequence[Pending]) -> tuple[bytes, int]:
    """``merge(parts).to_blob()`` and the report count, with bytes operations only:
    the store write of a flush of one-report requests needs no numpy array."""
    n = sum(p.count for p in parts)
    cohorts = [
        struct.pack(f"<{p.count}I", *p.cohorts)
        if isinstance(p, Rows)
        else p.cohorts.astype(_U32, copy=False).tobytes()
        for p in parts
    ]
    bits = [p.bits for p in parts]
    with_ids = any(p.ids for p in parts)
    ids = [p.report_ids() for p in parts] if with_ids else []
    rbf = parts[0].report_bytes | (IDS_FLAG if with_ids else 0)
    return b"".join((HEADER.pack(n, rbf), *cohorts, *bits, *ids)), n


def decode_chunks(buf: bytes | memoryview, offset: int = 0) -> Chunk:
    """Parse concatenated chunk blobs (all of one report size) into one Chunk.

    Raises ValueError on a truncated or inconsistent buffer (a corrupted store).
    """
    view = memoryview(buf)
    cohorts: list[npt.NDArray[np.uint32]] = []
    bits: list[bytes] = []
    ids: list[bytes] = []
    with_ids = False
    rb_seen: int | None = None
    pos = offset
    while pos < len(view):
        if pos + HEADER.size > len(view):
            raise ValueError("truncated chunk header")
        count, rbf = HEADER.unpack_from(view, pos)
        rb, idb = rbf & ~IDS_FLAG, ID_BYTES if rbf & IDS_FLAG else 0
        pos += HEADER.size
        end_bits = pos + 4 * count + rb * count
        end = end_bits + idb * count
        if end > len(view) or rb < 1:
            raise ValueError("truncated or malformed chunk")
        if rb_seen is not None and rb != rb_seen:
            raise ValueError("chunks of different report sizes in one batch")
        rb_seen = rb
        cohorts.append(np.frombuffer(view, dtype=_U32, count=count, offset=pos).astype(np.uint32))
        bits.append(bytes(view[pos + 4 * count : end_bits]))
        ids.append(bytes(view[end_bits:end]) if idb else bytes(ID_BYTES * count))
        with_ids = with_ids or bool(idb)
        pos = end
    if rb_seen is None:
        raise ValueError("empty chunk buffer")
    return Chunk(
        report_bytes=rb_seen,
        cohorts=np.concatenate(cohorts) if len(cohorts) > 1 else cohorts[0],
        bits=b"".join(bits),
        ids=b"".join(ids) if with_ids else b"",
    )


def split_blob(blob: bytes, n: int) -> tuple[bytes, bytes]:
    """The first ``n`` reports of a chunk blob and the rest, both as chunk blobs.

    Same arithmetic as the Lua take script of the Redis store (kept in step by the
    store contract tests, which split chunks on both stores).
    """
    count, rbf = HEADER.unpack_from(blob, 0)
    if not 0 < n < count:
        raise ValueError(f"cannot split {count} reports at {n}")
    rb, idb = rbf & ~IDS_FLAG, ID_BYTES if rbf & IDS_FLAG else 0
    c0 = HEADER.size
    b0 = c0 + 4 * count
    i0 = b0 + rb * count
    head = (
        HEADER.pack(n, rbf)
        + blob[c0 : c0 + 4 * n]
        + blob[b0 : b0 + rb * n]
        + blob[i0 : i0 + idb * n]
    )
    tail = (
        HEADER.pack(count - n, rbf)
        + blob[c0 + 4 * n : b0]
        + blob[b0 + rb * n : i0]
        + blob[i0 + idb * n :]
    )
    return head, tail
