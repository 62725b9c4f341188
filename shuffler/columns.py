"""Reports in columns, and the compact byte format in which the store keeps them.

A *chunk* is ``count`` reports of one metric, column by column::

    count u32 LE | report_bytes u32 LE | cohorts: count × u32 LE | bits: count × report_bytes

Chunks are self-delimiting, so a buffer of several chunks (an in-flight batch)
is their plain concatenation. The format carries nothing but cohorts and bits:
no time, no sender, no arrival order beyond position (which the batch
permutation destroys before anything leaves the shuffler). The Redis store's
Lua script splits chunks in this same layout (``shuffler.redis_store``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "HEADER",
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


@dataclass(frozen=True, slots=True)
class Chunk:
    """``count`` reports: ``cohorts`` (count,) uint32 and their bits, concatenated."""

    report_bytes: int
    cohorts: npt.NDArray[np.uint32]
    bits: bytes

    @property
    def count(self) -> int:
        return int(self.cohorts.shape[0])

    def bit_matrix(self) -> npt.NDArray[np.uint8]:
        """The bits as a (count, report_bytes) uint8 view (no copy)."""
        return np.frombuffer(self.bits, dtype=np.uint8).reshape(self.count, self.report_bytes)

    def to_blob(self) -> bytes:
        return b"".join(
            (
                HEADER.pack(self.count, self.report_bytes),
                self.cohorts.astype(_U32, copy=False).tobytes(),
                self.bits,
            )
        )

    def select(self, index: npt.NDArray[np.intp]) -> Chunk:
        """The reports at ``index``, in that order (a permutation or a keep-mask's indices)."""
        # one opaque row per report ("V<n>"): 3× faster to gather than a 2-D uint8 index
        rows = np.frombuffer(self.bits, dtype=f"V{self.report_bytes}")
        return Chunk(
            report_bytes=self.report_bytes,
            cohorts=self.cohorts[index],
            bits=rows[index].tobytes(),
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
        return Chunk(
            report_bytes=rb,
            cohorts=np.concatenate([c.cohorts for c in chunks]).astype(np.uint32, copy=False),
            bits=b"".join(c.bits for c in chunks),
        )


@dataclass(frozen=True, slots=True)
class Rows:
    """Reports that arrived as rows, still as Python values: validating and
    queueing a one-report request this way skips numpy entirely; rows become a
    ``Chunk`` once per store write (``merge``)."""

    report_bytes: int
    cohorts: list[int]
    bits: bytes

    @property
    def count(self) -> int:
        return len(self.cohorts)


Pending = Chunk | Rows


def merge(parts: Sequence[Pending]) -> Chunk:
    """Concatenate chunks and rows (all of one report size), in order, into one Chunk."""
    chunks = [
        Chunk(p.report_bytes, np.array(p.cohorts, dtype=np.uint32), p.bits)
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
    return b"".join((HEADER.pack(n, parts[0].report_bytes), *cohorts, *bits)), n


def decode_chunks(buf: bytes | memoryview, offset: int = 0) -> Chunk:
    """Parse concatenated chunk blobs (all of one report size) into one Chunk.

    Raises ValueError on a truncated or inconsistent buffer (a corrupted store).
    """
    view = memoryview(buf)
    cohorts: list[npt.NDArray[np.uint32]] = []
    bits: list[bytes] = []
    rb_seen: int | None = None
    pos = offset
    while pos < len(view):
        if pos + HEADER.size > len(view):
            raise ValueError("truncated chunk header")
        count, rb = HEADER.unpack_from(view, pos)
        pos += HEADER.size
        end = pos + 4 * count + rb * count
        if end > len(view) or rb < 1:
            raise ValueError("truncated or malformed chunk")
        if rb_seen is not None and rb != rb_seen:
            raise ValueError("chunks of different report sizes in one batch")
        rb_seen = rb
        cohorts.append(np.frombuffer(view, dtype=_U32, count=count, offset=pos).astype(np.uint32))
        bits.append(bytes(view[pos + 4 * count : end]))
        pos = end
    if rb_seen is None:
        raise ValueError("empty chunk buffer")
    return Chunk(
        report_bytes=rb_seen,
        cohorts=np.concatenate(cohorts) if len(cohorts) > 1 else cohorts[0],
        bits=b"".join(bits),
    )


def split_blob(blob: bytes, n: int) -> tuple[bytes, bytes]:
    """The first ``n`` reports of a chunk blob and the rest, both as chunk blobs.

    Same arithmetic as the Lua take script of the Redis store (kept in step by the
    store contract tests, which split chunks on both stores).
    """
    count, rb = HEADER.unpack_from(blob, 0)
    if not 0 < n < count:
        raise ValueError(f"cannot split {count} reports at {n}")
    c0 = HEADER.size
    b0 = c0 + 4 * count
    head = HEADER.pack(n, rb) + blob[c0 : c0 + 4 * n] + blob[b0 : b0 + rb * n]
    tail = HEADER.pack(count - n, rb) + blob[c0 + 4 * n : b0] + blob[b0 + rb * n :]
    return head, tail
