"""Deterministic BitSources for tests (production code always defaults to SecureBits)."""

from __future__ import annotations

import random

import numpy as np
import numpy.typing as npt


class ScriptedBits:
    """Returns scripted words as one little-endian bit stream.

    ``ScriptedBits([w0, w1, ...], word_bits=k)``: ``random_bits(k)`` returns w0,
    then w1, ...; ``random_bits(2 * k)`` returns ``w0 | w1 << k``. Running out
    of script is an error, so a test also pins how many bits an encoder draws.
    """

    def __init__(self, words: list[int], word_bits: int) -> None:
        self._stream = 0
        for i, w in enumerate(words):
            if not 0 <= w < 1 << word_bits:
                raise ValueError(f"word {i} does not fit in {word_bits} bits")
            self._stream |= w << (i * word_bits)
        self._left = len(words) * word_bits
        self.drawn = 0

    def random_bits(self, nbits: int) -> int:
        if nbits > self._left:
            raise AssertionError(f"asked for {nbits} bits, only {self._left} scripted")
        value = self._stream & ((1 << nbits) - 1)
        self._stream >>= nbits
        self._left -= nbits
        self.drawn += nbits
        return value

    @property
    def left(self) -> int:
        return self._left


class SeededBits:
    """Seeded pseudo-random bits (Mersenne Twister) for statistical tests only."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def random_bits(self, nbits: int) -> int:
        return self._rng.getrandbits(nbits)


def scripted_fields(fields: list[tuple[int, int]]) -> ScriptedBits:
    """A ScriptedBits from (value, nbits) fields in draw order (each drawn by one call)."""
    src = ScriptedBits([], 1)
    for value, nbits in reversed(fields):
        if not 0 <= value < 1 << nbits:
            raise ValueError(f"{value} does not fit in {nbits} bits")
        src._stream = (src._stream << nbits) | value
        src._left += nbits
    return src


class SeededBytes:
    """A seeded ByteSource for client.batch in tests (numpy PCG64; never in production)."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def random_array(self, n: int) -> npt.NDArray[np.uint8]:
        return np.frombuffer(bytearray(self._rng.bytes(n)), dtype=np.uint8)


class ScriptedBytes:
    """A ByteSource returning scripted uint8 arrays, in order."""

    def __init__(self, arrays: list[list[int]]) -> None:
        self._arrays = [np.array(a, dtype=np.uint8) for a in arrays]

    def random_array(self, n: int) -> npt.NDArray[np.uint8]:
        arr = self._arrays.pop(0)
        if arr.size != n:
            raise AssertionError(f"asked for {n} bytes, scripted {arr.size}")
        return arr.copy()
