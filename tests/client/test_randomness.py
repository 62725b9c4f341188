"""Exact Bernoulli sampling: enumerate every random word, count the ones."""

from __future__ import annotations

import itertools
import os

import pytest

from crowdmix.client.randomness import (
    MAX_FIXED_DIGITS,
    SecureBits,
    bernoulli_bits,
    probability_digits,
    word_sampler,
)
from tests.client.bitsources import ScriptedBits

DYADIC = [0.0, 0.5, 0.25, 0.75, 0.125, 0.375, 0.625, 0.875, 0.3125, 0.6875, 0.9375]


def test_probability_digits() -> None:
    assert probability_digits(0.0) == ()
    assert probability_digits(0.5) == (1,)
    assert probability_digits(0.75) == (1, 1)
    assert probability_digits(0.25) == (0, 1)
    assert probability_digits(0.3125) == (0, 1, 0, 1)
    assert len(probability_digits(0.3)) == 54
    with pytest.raises(ValueError):
        probability_digits(1.0)


@pytest.mark.parametrize("prob", DYADIC)
def test_bernoulli_bits_is_exact_over_all_words(prob: float) -> None:
    # nbits = 3 lanes, d digits: enumerate all 2**(3d) scripted word sequences;
    # each lane must be 1 in exactly prob * 2**d of its 2**d digit patterns.
    nbits = 3
    d = len(probability_digits(prob))
    ones = [0] * nbits
    for words in itertools.product(range(1 << nbits), repeat=d):
        src = ScriptedBits(list(words), nbits)
        out = bernoulli_bits(src, prob, nbits)
        assert out >> nbits == 0
        for lane in range(nbits):
            ones[lane] += out >> lane & 1
    total = (1 << nbits) ** d
    assert ones == [int(prob * total)] * nbits


@pytest.mark.parametrize(
    ("prob", "nbits"), [*((p, 2) for p in DYADIC), (1.0, 2), (2.0**-MAX_FIXED_DIGITS, 1)]
)
def test_word_sampler_is_exact_and_matches_the_loop(prob: float, nbits: int) -> None:
    mask = (1 << nbits) - 1
    words, sample = word_sampler(prob, nbits, first_word=1)
    assert words == (len(probability_digits(prob)) if prob < 1 else 0)
    ones = [0] * nbits
    for script in itertools.product(range(1 << nbits), repeat=words):
        x = sum(w << ((1 + j) * nbits) for j, w in enumerate(script))
        out = sample(x)
        # Word 0 belongs to someone else: the sampler ignores it.
        assert sample(x | mask) == out
        assert out == bernoulli_bits(ScriptedBits(list(script), nbits), prob, nbits)
        for lane in range(nbits):
            ones[lane] += out >> lane & 1
    assert ones == [prob * (1 << (nbits * words))] * nbits


def test_bernoulli_bits_stops_when_decided_and_handles_edges() -> None:
    k = 4
    # p = 0.3125 = 0.0101b: u1 = 0 decides every lane 0 after one word.
    src = ScriptedBits([0, 15, 15, 15], k)
    assert bernoulli_bits(src, 0.3125, k) == 0
    assert src.drawn == k
    # u = 1111 at digit 1 (b=0) keeps all open; digit 2 (b=1) with u = 0101 decides lanes 0, 2.
    src = ScriptedBits([15, 0b0101, 0b1010, 0b0000], k)
    assert bernoulli_bits(src, 0.3125, k) == 0b0101
    assert bernoulli_bits(ScriptedBits([], k), 1.0, k) == 0b1111
    assert bernoulli_bits(ScriptedBits([], k), 0.0, k) == 0
    with pytest.raises(ValueError):
        bernoulli_bits(ScriptedBits([], k), 1.5, k)


def test_word_sampler_rejects_long_expansions() -> None:
    with pytest.raises(ValueError, match="binary digits"):
        word_sampler(0.3, 8)
    with pytest.raises(ValueError):
        word_sampler(-0.1, 8)


def test_secure_bits_reads_os_urandom_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    stream = bytes(range(256)) * 256

    def fake_urandom(n: int) -> bytes:
        calls.append(n)
        return stream[:n]

    monkeypatch.setattr(os, "urandom", fake_urandom)
    src = SecureBits()
    assert src.random_bits(16) == int.from_bytes(bytes([0, 1]), "little")
    assert src.random_bits(12) == int.from_bytes(bytes([2, 3]), "little") & 0xFFF
    assert src.random_bytes(3) == bytes([4, 5, 6])
    assert calls == [1 << 16]
    for _ in range(2**16 // 64):
        src.random_bits(512)
    assert calls == [1 << 16, 1 << 16]
    assert src.random_bits(8 * 70000) == int.from_bytes(stream[:70000], "little")
    assert calls[-1] == 70000
