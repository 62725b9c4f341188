"""Random bits for the encoders: a CSPRNG by default, injectable for tests.

Everything a privacy guarantee depends on draws from a ``BitSource``. The
default, ``SecureBits``, reads the operating system's CSPRNG (``os.urandom``)
through a small buffer, so an encode costs no system call; the buffer is
discarded in a forked child, which would otherwise replay the parent's bits.

Bernoulli bit vectors are sampled *exactly* for any float probability (every
float is a dyadic rational): a uniform U = 0.u1u2u3... is compared with
p = 0.b1b2b3... most significant digit first, all ``nbits`` lanes at once
("bit slicing"); a lane is decided at the first digit where U and p differ.
Each round uses one fresh random word and decides half the open lanes, so
about log2(nbits) + 2 words are drawn; a dyadic p such as 0.75 costs at most
as many words as it has binary digits.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol, runtime_checkable

__all__ = ["BitSource", "SecureBits", "bernoulli_bits", "probability_digits"]


@runtime_checkable
class BitSource(Protocol):
    """Where an encoder's randomness comes from."""

    def random_bits(self, nbits: int) -> int:
        """A uniform integer in [0, 2**nbits)."""
        ...


_BUFFER = 1 << 16
_LIVE_SOURCES: weakref.WeakSet[SecureBits] = weakref.WeakSet()


class SecureBits:
    """Uniform bits from ``os.urandom`` (the OS CSPRNG), read in 64 KiB chunks."""

    __slots__ = ("__weakref__", "_buf", "_pos")

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0
        _LIVE_SOURCES.add(self)

    def _discard(self) -> None:
        self._buf = b""
        self._pos = 0

    def random_bytes(self, n: int) -> bytes:
        pos = self._pos
        if pos + n > len(self._buf):
            self._buf = os.urandom(max(_BUFFER, n))
            pos = 0
        self._pos = pos + n
        return self._buf[pos : pos + n]

    def random_bits(self, nbits: int) -> int:
        nbytes = (nbits + 7) >> 3
        pos = self._pos
        if pos + nbytes > len(self._buf):
            self._buf = os.urandom(max(_BUFFER, nbytes))
            pos = 0
        self._pos = pos + nbytes
        value = int.from_bytes(self._buf[pos : pos + nbytes], "little")
        extra = nbytes * 8 - nbits
        return value >> extra if extra else value


def _forget_buffers_after_fork() -> None:
    for source in list(_LIVE_SOURCES):
        source._discard()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_buffers_after_fork)


def probability_digits(prob: float) -> tuple[int, ...]:
    """The binary digits b1, b2, ... of ``prob`` in [0, 1) (finite for a float)."""
    if not 0.0 <= prob < 1.0:
        raise ValueError(f"probability must be in [0, 1), got {prob!r}")
    num, den = prob.as_integer_ratio()  # den is a power of two
    digits = []
    while num:
        num *= 2
        digits.append(1 if num >= den else 0)
        if num >= den:
            num -= den
    return tuple(digits)


def bernoulli_bits(
    source: BitSource, prob: float, nbits: int, digits: tuple[int, ...] | None = None
) -> int:
    """An ``nbits``-bit integer whose bits are independent Bernoulli(``prob``), exactly.

    ``digits`` may pass ``probability_digits(prob)`` precomputed (hot loops).
    """
    if prob >= 1.0:
        if prob > 1.0:
            raise ValueError(f"probability must be in [0, 1], got {prob!r}")
        return (1 << nbits) - 1
    if digits is None:
        digits = probability_digits(prob)
    result = 0
    undecided = (1 << nbits) - 1
    for digit in digits:
        u = source.random_bits(nbits)
        if digit:
            # lanes with u=0 < 1 are below p: decided 1
            result |= undecided & ~u
            undecided &= u
        else:
            # lanes with u=1 > 0 are above p: decided 0
            undecided &= ~u
        if not undecided:
            break
    # Lanes equal to p on every digit are U >= p: they stay 0.
    return result
