"""The device side of discovery: symbols, the prefix hash, the two encoders."""

from __future__ import annotations

import numpy as np
import pytest

from crowdmix.aggregator.discovery.hashing import bucket_base, inverse_mod, seed_constants
from crowdmix.client.discovery import PrefixEncoder, ValueEncoder
from crowdmix.client.errors import ParamsError
from crowdmix.client.randomness import SecureBits
from crowdmix.core.discovery import (
    PrefixRound,
    SymbolMap,
    ValueRound,
    next_prime,
    prefix_bucket,
    prefix_key,
)
from tests.client.bitsources import scripted_fields

SM = SymbolMap(alphabet="abc", max_length=4)


def test_symbols_pad_with_end_and_mark_other_and_truncation() -> None:
    # a=0 b=1 c=2 OTHER=3 END=4; five symbols per value
    assert SM.symbols("ab") == bytes([0, 1, 4, 4, 4])
    assert SM.symbols("") == bytes([4] * 5)
    assert SM.symbols("axb") == bytes([0, 3, 1, 4, 4])
    assert SM.symbols("abcab") == bytes([0, 1, 2, 0, 3])  # longer than 4: OTHER last
    assert SM.symbols("abca") == bytes([0, 1, 2, 0, 4])


def test_text_reads_symbols_back() -> None:
    assert SM.text(SM.symbols("ab")) == ("ab", True)
    assert SM.text(SM.symbols("axb")) == ("a\ufffdb", True)
    assert SM.text(SM.symbols("abcab")) == ("abca\u2026", True)
    assert SM.text(bytes([0, 1])) == ("ab", False)
    # a truncated value's text maps back to the same symbols
    assert SM.symbols(SM.text(SM.symbols("abcabc"))[0]) == SM.symbols("abcabc")


def test_numpy_hash_equals_the_device_hash() -> None:
    rng = np.random.default_rng(7)
    for g in (3, 101, 2999, 65537):
        seeds = rng.integers(0, 2**32, 200, dtype=np.uint64)
        keys = rng.integers(0, 2**63, 200, dtype=np.uint64) * np.uint64(2)
        lo = rng.integers(0, g, 200)
        a, b, m = seed_constants(seeds, g)
        h = (bucket_base(a, b, keys, g) + m * lo.astype(np.uint64)) % np.uint64(g)
        ref = [
            prefix_bucket(int(s), int(k), int(x), g)
            for s, k, x in zip(seeds, keys, lo, strict=False)
        ]
        assert [int(x) for x in h] == ref
        inv = inverse_mod(m, g)
        assert all(int(i) * int(x) % g == 1 for i, x in zip(inv, m, strict=False))


def test_siblings_never_share_a_bucket() -> None:
    # one (prefix, hi) block: h = H + m·lo mod g, m invertible, so lo ↦ h is a bijection
    g = 101
    key = prefix_key(0, 2, 0, b"")
    for seed in range(20):
        assert len({prefix_bucket(seed, key, lo, g) for lo in range(g)}) == g


def test_prefix_round_defaults_and_validation() -> None:
    r = PrefixRound(symbols=SM, start=0, stop=2, epsilon=3.0, seeds=16)
    assert r.buckets == next_prime(round(np.exp(3.0)) + 1) == 23
    assert r.extensions == 25 and r.cells == 16 * 23 and r.report_bytes == 2
    with pytest.raises(ParamsError, match="start < stop"):
        PrefixRound(symbols=SM, start=2, stop=2, epsilon=3.0, seeds=16)
    with pytest.raises(ParamsError, match="prime"):
        PrefixRound(symbols=SM, start=0, stop=2, epsilon=3.0, seeds=16, buckets=24)
    with pytest.raises(ParamsError, match="seeds"):
        PrefixRound(symbols=SM, start=0, stop=2, epsilon=3.0, seeds=1 << 24)
    with pytest.raises(ParamsError, match="epsilon"):
        PrefixRound(symbols=SM, start=0, stop=2, epsilon=0.0, seeds=16)
    with pytest.raises(ParamsError, match="alphabet"):
        SymbolMap(alphabet="aa", max_length=4)
    with pytest.raises(ParamsError, match="distinct"):
        ValueRound(symbols=SM, epsilon=1.0, candidates=("ab", "ab"))


def test_prefix_encoder_with_injected_bits() -> None:
    # ε = 5: g = 149, p = e^5/(e^5 + 148) = 0.5007… (binary 0.1000…): one coin bit 1 keeps
    r = PrefixRound(symbols=SM, start=0, stop=2, epsilon=5.0, seeds=16)
    assert r.buckets == 149 and 0.5 < r.keep_probability < 0.5 + 2**-9
    prefix, hi, lo = r.split(SM.symbols("ba"))
    assert (prefix, hi, lo) == (b"", 0, 1 * 5 + 0)
    h = prefix_bucket(5, prefix_key(0, 2, 0, b""), lo, r.buckets)
    # draw order: seed (4 bits), keep coin
    kept = PrefixEncoder(r, metric="m", rand=scripted_fields([(5, 4), (1, 1)]))
    assert kept.index("ba") == 5 * r.buckets + h
    # not kept (coin digits 1, 0 read 0, 0), then the other bucket (8 bits)
    rand = scripted_fields([(5, 4), (0, 1), (0, 1), (10, 8)])
    moved = PrefixEncoder(r, metric="m", rand=rand)
    assert moved.index("ba") == 5 * r.buckets + 10 + (h <= 10)
    assert rand.left == 0
    report = PrefixEncoder(r, metric="m").encode("ba")
    assert len(report.bits) == r.report_bytes <= 64 and report.cohort == 0


def test_value_encoder_reports_none_for_other_values() -> None:
    r = ValueRound(symbols=SM, epsilon=20.0, candidates=("ab", "c"))
    enc = ValueEncoder(r, metric="m")  # ε = 20: the true index w.p. 1 − 2e-9
    assert enc.index("c") == 1
    assert enc.index("zz") == 2
    assert len(enc.encode("ab").bits) == 1


def test_default_randomness_is_the_csprng() -> None:
    r = PrefixRound(symbols=SM, start=0, stop=2, epsilon=3.0, seeds=16)
    assert isinstance(PrefixEncoder(r, metric="m")._rand, SecureBits)
    v = ValueRound(symbols=SM, epsilon=1.0, candidates=("a",))
    assert isinstance(ValueEncoder(v, metric="m")._rand, SecureBits)
