"""crowdmix.client.batch: same Bloom bits and PRRs as the per-report encoder, same report law.

Statistical checks are exact binomial tests (or a two-sample z-test at
z = 6.5, two-sided tail 8e-11) per bit; each test states its number of checks,
so false failure <= checks · 1e-9 <= 1e-6.
"""

from __future__ import annotations

import itertools
import os
import random

import numpy as np
import pytest

from crowdmix.client import RapporEncoder, RapporParams, cohort_for_secret
from crowdmix.client.batch import (
    AesCtrKeystream,
    BatchEncoder,
    EncodedBatch,
    UrandomBytes,
    bernoulli_array,
)
from crowdmix.client.randomness import probability_digits
from crowdmix.core.hashing import bloom_int
from crowdmix.core.privacy import p_star, q_star
from tests.client.bitsources import ScriptedBytes, SeededBits, SeededBytes
from tests.client.stats import binomial_ok


def _bits_of(rows: np.ndarray, k: int) -> np.ndarray:
    return np.unpackbits(rows, axis=1, bitorder="little")[:, :k]


@pytest.mark.parametrize(
    ("params", "hashing"),
    [
        (RapporParams(k=128, h=2, m=16), "mmh3"),
        (RapporParams(k=13, h=4, m=5), "mmh3"),
        (RapporParams(k=32, h=2, m=16), "rappor-md5"),
    ],
)
def test_bloom_bits_identical_to_per_report(params: RapporParams, hashing: str) -> None:
    enc = BatchEncoder(params, metric="m", hashing=hashing, source=SeededBytes(0))  # type: ignore[arg-type]
    candidates: list[str | bytes] = ["a", "b", "example.com", b"\xff", "é"]
    table = enc.bloom_table(candidates)
    assert table.shape == (5, params.m, params.report_bytes)
    for v, c in itertools.product(range(5), range(params.m)):
        expected = bloom_int(candidates[v], c, params, hashing)  # type: ignore[arg-type]
        assert int.from_bytes(table[v, c].tobytes(), "little") == expected


def test_memoised_prr_identical_to_per_report_encoder() -> None:
    params = RapporParams(k=100, h=2, m=8, f=0.45, p=0.25, q=0.75)
    enc = BatchEncoder(params, metric="home", source=SeededBytes(1))
    rng = random.Random(2)
    secrets = [rng.randbytes(32) for _ in range(30)]
    values = [rng.choice(["a", "b", "c"]) for _ in range(30)]
    secrets += secrets[:5]  # the same clients again: same PRRs
    values += values[:5]
    cohorts, prrs = enc.permanent_responses(secrets, values)
    for i, (s, v) in enumerate(zip(secrets, values, strict=True)):
        one = RapporEncoder(params, secret=s, metric="home")
        assert cohorts[i] == one.cohort == cohort_for_secret(s, 8)
        assert int.from_bytes(prrs[i].tobytes(), "little") == (
            one.permanent_response(one.bloom(v)).bits
        )
    assert np.array_equal(prrs[:5], prrs[30:])
    batch = enc.encode_clients(secrets, values)
    assert np.array_equal(batch.cohorts, cohorts)
    assert batch.bits.shape == (35, 13) and not (batch.bits[:, -1] >> 4).any()


@pytest.mark.parametrize("prob", [0.5, 0.25, 0.75, 0.3125, 0.875, 2.0**-12])
def test_bernoulli_array_is_exact(prob: float) -> None:
    # Enumerate every digit pattern per lane: element i of each scripted word is
    # 0xFF or 0x00 by bit j of i, so lane patterns run over all 2**d cases; each
    # lane must be 1 in exactly prob · 2**d of them.
    d = len(probability_digits(prob))
    n = 1 << d
    words = [[0xFF if (i >> j) & 1 else 0 for i in range(n)] for j in range(d)]
    out = bernoulli_array(ScriptedBytes(words), prob, (n,))
    assert set(out.tolist()) <= {0, 0xFF}
    assert int((out == 0xFF).sum()) == prob * n


@pytest.mark.parametrize("prob", [0.3, 0.7, 0.1, 0.5, 0.0, 1.0])
def test_bernoulli_array_frequencies(prob: float) -> None:
    # 1 check per prob (6): the number of ones among 8·n lanes is Binomial(8n, prob);
    # and lanes are not correlated within a byte (bit 0 and bit 7 agree as independent).
    n = 200_000
    out = bernoulli_array(SeededBytes(3), prob, (n,))
    bits = np.unpackbits(out)
    assert binomial_ok(int(bits.sum()), bits.size, prob)
    lo, hi = bits[0::8], bits[7::8]
    assert binomial_ok(int((lo & hi).sum()), n, prob * prob)


@pytest.mark.parametrize(
    "params",
    [
        RapporParams(k=32, h=2, m=4, f=0.5, p=0.25, q=0.75),
        RapporParams(k=20, h=2, m=4, f=0.45, p=0.3, q=0.7),
    ],
)
def test_fresh_mode_bits_follow_p_star_q_star(params: RapporParams) -> None:
    # 2·k checks per params: bits on Bloom 1s ~ q*, on Bloom 0s ~ p*; padding bits 0.
    enc = BatchEncoder(params, metric="m", source=SeededBytes(4))
    table = enc.bloom_table(["a", "b"])
    n = 200_000
    batch = enc.encode_indices(table, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64))
    assert isinstance(batch, EncodedBatch) and len(batch) == n
    bloom = _bits_of(table[0, 0][None, :], params.k)[0].astype(bool)
    counts = _bits_of(batch.bits, params.k).sum(axis=0)
    assert binomial_ok(counts[bloom], n, q_star(params))
    assert binomial_ok(counts[~bloom], n, p_star(params))
    if params.k % 8:
        assert not (batch.bits[:, -1] >> (params.k % 8)).any()


def test_irr_bits_follow_p_and_q() -> None:
    # 32 checks.
    params = RapporParams(k=32, h=2, m=4, f=0.5, p=0.3, q=0.875)
    enc = BatchEncoder(params, metric="m", source=SeededBytes(5))
    prr = np.frombuffer((0xF0F0_0FF1).to_bytes(4, "little"), dtype=np.uint8)
    n = 100_000
    out = enc.instantaneous_responses(np.tile(prr, (n, 1)))
    counts = _bits_of(out, 32).sum(axis=0)
    ones = _bits_of(prr[None, :], 32)[0].astype(bool)
    assert binomial_ok(counts[ones], n, 0.875)
    assert binomial_ok(counts[~ones], n, 0.3)


def test_batch_matches_per_report_encoder_frequencies() -> None:
    # Two-sample test per bit (k = 32 checks, z = 6.5 each: tail 8e-11): one report
    # per fresh client from the per-report encoder vs from the batch encoder.
    params = RapporParams(k=32, h=2, m=2, f=0.5, p=0.25, q=0.75)
    n1, n2 = 20_000, 200_000
    rng = random.Random(6)
    rand = SeededBits(6)
    per_report = np.zeros(32, dtype=np.int64)
    for _ in range(n1):
        enc = RapporEncoder(params, secret=rng.randbytes(16), metric="m", cohort=1, rand=rand)
        bits = int.from_bytes(enc.encode("example.com").bits, "little")
        per_report += [(bits >> i) & 1 for i in range(32)]
    batch_enc = BatchEncoder(params, metric="m", source=SeededBytes(6))
    table = batch_enc.bloom_table(["example.com"])
    batch = batch_enc.encode_indices(table, np.zeros(n2, np.int64), np.ones(n2, np.int64))
    in_batch = _bits_of(batch.bits, 32).sum(axis=0)
    p1, p2 = per_report / n1, in_batch / n2
    pooled = (per_report + in_batch) / (n1 + n2)
    z = np.abs(p1 - p2) / np.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    assert float(z.max()) < 6.5


def test_reports_and_columns() -> None:
    params = RapporParams(k=16, h=2, m=4, f=0.5, p=0.25, q=0.75)
    enc = BatchEncoder(params, metric="m", source=SeededBytes(7))
    batch = enc.encode_indices(enc.bloom_table(["a"]), [0, 0, 0], [3, 1, 2])
    assert batch.cohorts.dtype == np.uint32 and batch.cohorts.tolist() == [3, 1, 2]
    assert batch.bits_bytes() == batch.bits.tobytes() and len(batch.bits_bytes()) == 6
    reports = batch.reports()
    assert [r.cohort for r in reports] == [3, 1, 2]
    assert b"".join(r.bits for r in reports) == batch.bits_bytes()
    assert {r.params_fingerprint for r in reports} == {params.fingerprint()}


def test_bad_input_is_rejected() -> None:
    params = RapporParams(k=16, h=2, m=4)
    enc = BatchEncoder(params, metric="m", source=SeededBytes(8))
    table = enc.bloom_table(["a"])
    with pytest.raises(ValueError, match="cohorts"):
        enc.encode_indices(table, [0], [4])
    with pytest.raises(ValueError, match="cohorts"):
        enc.encode_indices(table, [0, 0], [1])
    with pytest.raises(ValueError, match="value indexes"):
        enc.encode_indices(table, [1], [0])
    with pytest.raises(ValueError, match="uint8"):
        enc.instantaneous_responses(np.zeros((2, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="secrets"):
        enc.permanent_responses([b"x" * 16], ["a", "b"])
    with pytest.raises(ValueError, match="at least 16 bytes"):
        enc.permanent_responses([b"short"], ["a"], [0])
    with pytest.raises(ValueError, match="metric"):
        BatchEncoder(params, metric="")


def test_default_source_is_aes_ctr_keyed_from_os_urandom(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.urandom

    def counting(n: int) -> bytes:
        calls.append(n)
        return real(n)

    monkeypatch.setattr(os, "urandom", counting)
    enc = BatchEncoder(RapporParams(k=16, h=2, m=4), metric="m")
    assert type(enc._source) is AesCtrKeystream
    assert calls == [32]  # the AES-256 key
    a = enc._source.random_array(1 << 16)
    b = BatchEncoder(RapporParams(k=16, h=2, m=4), metric="m")._source.random_array(1 << 16)
    assert not np.array_equal(a, b)  # two encoders, two keys
    assert UrandomBytes().random_array(8).size == 8 and calls[-1] == 8


def test_a_forked_child_never_replays_the_parents_keystream() -> None:
    import os

    from crowdmix.client.batch import AesCtrKeystream

    stream = AesCtrKeystream()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report its next 32 bytes and leave at once
        try:
            os.write(write_fd, bytes(stream.random_array(32)))
        finally:
            os._exit(0)
    os.close(write_fd)
    child = os.read(read_fd, 32)
    os.close(read_fd)
    os.waitpid(pid, 0)
    parent = bytes(stream.random_array(32))
    assert len(child) == 32 and child != parent
