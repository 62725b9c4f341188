"""Random bits for the encoders: a CSPRNG by default, injectable for tests.

Everything a privacy guarantee depends on draws from a ``BitSource``. The default,
``SecureBits``, reads ``os.urandom`` through a small buffer (discarded in a forked child,
which would otherwise replay the parent's bits). Bernoulli bit vectors are sampled
*exactly* for any float p = 0.b1 b2 … bd (binary), all ``nbits`` lanes at once: digit j
uses a fresh uniform bit u_j; b_j = 1, u_j = 1 decides 1, b_j = 0, u_j = 0 decides 0,
else the next digit; an open lane after digit d is 0, so P(1) = Σ_j b_j 2^-j = p.
``bernoulli_bits`` walks the digits forwards until every lane is decided;
``word_sampler`` evaluates the same rule backwards as a boolean formula of d words
(R_d = u_d, R_j = u_j | R_{j+1} if b_j = 1 else u_j & R_{j+1}), all from one draw; the
two agree word for word. Details: docs/design.md, "Client".
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = [
    "MAX_FIXED_DIGITS",
    "BitSource",
    "SecureBits",
    "bernoulli_bits",
    "probability_digits",
    "shared_secure_bits",
    "uniform_below",
    "word_sampler",
]

# Probabilities with at most this many binary digits are sampled by the fixed
# formula (one draw of d words); longer ones by the early-stopping loop, which
# needs ~log2(nbits) + 2 words on average.
MAX_FIXED_DIGITS = 12


@runtime_checkable
class BitSource(Protocol):
    """Where an encoder's randomness comes from.

    Encoders may draw several words at once: ``random_bits(3 * k)`` read as
    three k-bit words, word j = bits [j·k, (j+1)·k). A test source should
    therefore behave as a bit stream (see tests/client/bitsources.py).
    """

    def random_bits(self, nbits: int) -> int:
        """A uniform integer in [0, 2**nbits)."""
        ...


_BUFFER = 1 << 16
_LIVE_SOURCES: weakref.WeakSet[SecureBits] = weakref.WeakSet()


class SecureBits:
    """Uniform bits from ``os.urandom`` (the OS CSPRNG), read in 64 KiB chunks.

    ``random_bits(n)`` consumes the next ceil(n/8) bytes of the OS stream and
    returns their low n bits (little-endian).
    """

    __slots__ = ("__weakref__", "_buf", "_lock", "_pos")

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0
        # Two threads must never be handed the same bytes (one encoder may be
        # shared by an app's threads). Under CPython 3.11's GIL the claim below
        # happens not to yield, but free-threaded builds would race: lock it.
        self._lock = threading.Lock()
        _LIVE_SOURCES.add(self)

    def _discard(self) -> None:
        # In a forked child: another parent thread may have held the lock.
        self._lock = threading.Lock()
        self._buf = b""
        self._pos = 0

    def random_bytes(self, n: int) -> bytes:
        with self._lock:
            pos = self._pos
            if pos + n > len(self._buf):
                self._buf = os.urandom(max(_BUFFER, n))
                pos = 0
            self._pos = pos + n
            return self._buf[pos : pos + n]

    def random_bits(self, nbits: int) -> int:
        nbytes = (nbits + 7) >> 3
        with self._lock:
            pos = self._pos
            end = pos + nbytes
            if end > len(self._buf):
                self._buf = os.urandom(max(_BUFFER, nbytes))
                pos, end = 0, nbytes
            self._pos = end
            chunk = self._buf[pos:end]
        value = int.from_bytes(chunk, "little")
        return value & ((1 << nbits) - 1) if nbits & 7 else value


_SHARED: SecureBits | None = None
_SHARED_LOCK = threading.Lock()


def shared_secure_bits() -> SecureBits:
    """The process-wide SecureBits that encoders use by default.

    Sharing one buffer means a simulation of many clients (one encoder each)
    does not read 64 KiB from the OS per encoder; the lock in SecureBits keeps
    every draw distinct.
    """
    global _SHARED
    if _SHARED is None:
        with _SHARED_LOCK:
            if _SHARED is None:
                _SHARED = SecureBits()
    return _SHARED


def _forget_buffers_after_fork() -> None:
    for source in list(_LIVE_SOURCES):
        source._discard()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_buffers_after_fork)


def uniform_below(rand: BitSource, n: int) -> int:
    """Uniform in [0, n) by rejection: exact, no modulo bias."""
    nbits = max(1, (n - 1).bit_length())
    while True:
        r = rand.random_bits(nbits)
        if r < n:
            return r


@functools.lru_cache(maxsize=256)
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

    Draws one ``nbits``-bit word per digit until every lane is decided.
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
            result |= undecided & u  # b=1, u=1: decided 1
            undecided &= ~u
        else:
            undecided &= u  # b=0, u=0: decided 0
        if not undecided:
            break
    return result


@functools.lru_cache(maxsize=256)  # pure closures: encoders of equal params share them
def word_sampler(prob: float, nbits: int, first_word: int = 0) -> tuple[int, Callable[[int], int]]:
    """Compile Bernoulli(``prob``) over ``nbits`` lanes into a fixed formula.

    Returns ``(words, sample)``: ``sample(x)`` reads words ``first_word`` to
    ``first_word + words - 1`` of ``x`` (word j = bits [j·nbits, (j+1)·nbits))
    and returns the Bernoulli mask, equal to what ``bernoulli_bits`` returns
    when given those words in order. Raises ``ValueError`` when ``prob`` has
    more than ``MAX_FIXED_DIGITS`` binary digits (use ``bernoulli_bits``).
    """
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"probability must be in [0, 1], got {prob!r}")
    mask = (1 << nbits) - 1
    if prob == 1.0:
        return 0, lambda x: mask
    digits = probability_digits(prob)
    if len(digits) > MAX_FIXED_DIGITS:
        raise ValueError(f"{prob!r} has {len(digits)} binary digits, more than {MAX_FIXED_DIGITS}")
    if not digits:
        return 0, lambda x: 0
    s0 = first_word * nbits
    if len(digits) == 1:  # p = 1/2
        return 1, lambda x: (x >> s0) & mask
    s1 = s0 + nbits
    if digits == (1, 1):  # 3/4
        return 2, lambda x: ((x >> s0) | (x >> s1)) & mask
    if digits == (0, 1):  # 1/4
        return 2, lambda x: (x >> s0) & (x >> s1) & mask
    shifts = tuple(s0 + j * nbits for j in range(len(digits)))
    # Backwards from the last digit (always 1 for a finite expansion).
    steps = tuple(zip(reversed(shifts[:-1]), reversed(digits[:-1]), strict=True))
    last = shifts[-1]

    def sample(x: int) -> int:
        r = x >> last
        for shift, digit in steps:
            r = (x >> shift) | r if digit else (x >> shift) & r
        return r & mask

    return len(digits), sample
