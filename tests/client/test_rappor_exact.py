"""RAPPOR encoder with injected bits: every output is computed by hand or by an
independent reimplementation of the rule in docs/design.md ("Client", RAPPOR encoder)."""

from __future__ import annotations

import hashlib

import pytest

from crowdmix.client import (
    InstantaneousResponse,
    PermanentResponse,
    RapporEncoder,
    RapporParams,
    Report,
    cohort_for_secret,
)
from crowdmix.client.randomness import probability_digits
from tests.client.bitsources import ScriptedBits

SECRET = bytes(range(32))


def _enc(params: RapporParams, words: list[int] | None = None, **kw: object) -> RapporEncoder:
    rand = ScriptedBits(words or [], params.k)
    return RapporEncoder(params, secret=kw.pop("secret", SECRET), metric="m", rand=rand, **kw)  # type: ignore[arg-type]


# -- PRR ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "f", "bloom", "expected"),
    [(8, 0.45, "00001100", "01100000"), (16, 0.5, "0000000000001100", "1000100001100000")],
)
def test_rappor_md5_prr_golden_vectors(k: int, f: float, bloom: str, expected: str) -> None:
    # google/rappor's Python client, secret 'c1' (strings most significant bit first).
    params = RapporParams(k=k, h=2, m=4, f=f, p=0.5, q=0.75)
    enc = RapporEncoder(params, secret="c1", metric="m", hashing="rappor-md5", cohort=0)
    assert enc.permanent_response(int(bloom, 2)) == PermanentResponse(int(expected, 2))


def _reference_prr(secret: bytes, metric: str, bloom: int, k: int, f: float) -> int:
    """The PRR rule written out again: BLAKE2b block stream, word 0 uniform, then
    Bernoulli(f) lanes decided digit by digit (b=1,u=1 -> 1; b=0,u=0 -> 0)."""
    mb = metric.encode()
    msg = len(mb).to_bytes(4, "little") + mb + bloom.to_bytes((k + 7) // 8, "little")
    stream, nblocks = 0, 0

    def word(j: int) -> int:
        nonlocal stream, nblocks
        while nblocks * 512 < (j + 1) * k:
            block = hashlib.blake2b(
                msg + nblocks.to_bytes(4, "little"),
                key=secret,
                person=b"crowdmix.prr.v1",
                digest_size=64,
            ).digest()
            stream |= int.from_bytes(block, "little") << (512 * nblocks)
            nblocks += 1
        return (stream >> (j * k)) & ((1 << k) - 1)

    uniform = word(0)
    noise, undecided = 0, (1 << k) - 1
    for j, digit in enumerate(probability_digits(f), start=1):
        if not undecided:
            break
        u = word(j)
        if digit:
            noise |= undecided & u
            undecided &= ~u
        else:
            undecided &= u
    return (bloom & ~noise) | (uniform & noise)


@pytest.mark.parametrize(
    ("k", "f"),
    [(8, 0.5), (128, 0.5), (128, 0.25), (128, 0.45), (100, 0.875), (4096, 0.5), (13, 0.3)],
)
def test_mmh3_prr_matches_reference(k: int, f: float) -> None:
    params = RapporParams(k=k, h=2, m=4, f=f, p=0.25, q=0.75)
    enc = _enc(params)
    for value in ("a", "b", "example.com"):
        bloom = enc.bloom(value)
        prr = enc.permanent_response(bloom).bits
        assert prr == _reference_prr(SECRET, "m", bloom, k, f)
        assert prr >> k == 0


@pytest.mark.parametrize(
    ("k", "f", "bloom", "prr"),
    [
        (128, 0.5, 0x1000000000000000000000010, 0x1628148B0891E7400407800121A41210),
        (13, 0.45, 0x18, 0x218),
    ],
)
def test_mmh3_prr_golden_vectors(k: int, f: float, bloom: int, prr: int) -> None:
    # Pinned once: a client that upgrades must keep its PRRs (else averaging its
    # old and new reports leaks more than ε_∞). Any change here is a protocol change.
    params = RapporParams(k=k, h=2, m=64, f=f, p=0.5, q=0.75)
    enc = RapporEncoder(params, secret=SECRET, metric="home_page", cohort=3)
    assert enc.bloom("example.com") == bloom
    assert enc.permanent_response(bloom).bits == prr


def test_prr_depends_on_secret_metric_and_bloom_only() -> None:
    params = RapporParams(k=128, h=2, m=4, f=0.5)
    a = RapporEncoder(params, secret=SECRET, metric="m", cohort=1)
    b = RapporEncoder(params, secret=SECRET, metric="m", cohort=2)
    other_metric = RapporEncoder(params, secret=SECRET, metric="n", cohort=1)
    other_secret = RapporEncoder(params, secret=bytes(32), metric="m", cohort=1)
    bloom = 0b1001
    assert a.permanent_response(bloom) == b.permanent_response(bloom)
    assert a.permanent_response(bloom) != other_metric.permanent_response(bloom)
    assert a.permanent_response(bloom) != other_secret.permanent_response(bloom)
    assert a.permanent_response(bloom) != a.permanent_response(0b0110)


def test_f_zero_prr_is_the_bloom_filter() -> None:
    enc = _enc(RapporParams(k=64, h=2, m=4, f=0.0, p=0.25, q=0.75))
    assert enc.permanent_response(0xDEADBEEF).bits == 0xDEADBEEF


# -- IRR ----------------------------------------------------------------------


def test_irr_general_p_q_from_injected_words() -> None:
    # p = 1/4 -> u0 & u1 ; q = 3/4 -> u2 | u3 ; report = P on PRR 0-bits, Q on PRR 1-bits.
    params = RapporParams(k=8, h=2, m=4, f=0.5, p=0.25, q=0.75)
    words = [0b10101010, 0b11001100, 0b00000001, 0b00010000]
    enc = _enc(params, words)
    irr = enc.instantaneous_response(PermanentResponse(0b11110000))
    # P = 10001000, Q = 00010001 -> high nibble from Q (0001), low from P (1000)
    assert irr == InstantaneousResponse(0b00011000)
    assert enc._rand.left == 0  # type: ignore[attr-defined]


def test_irr_half_three_quarters_draws_three_words() -> None:
    params = RapporParams(k=8, h=2, m=4, f=0.5, p=0.5, q=0.75)
    enc = _enc(params, [0b01010101, 0b00000011, 0b11000000])
    # P = u0 = 01010101, Q = u1 | u2 = 11000011
    assert enc.instantaneous_response(PermanentResponse(0b00001111)).bits == 0b01010011
    assert enc._rand.left == 0  # type: ignore[attr-defined]


def test_irr_with_long_expansions_uses_the_digit_loop() -> None:
    # p = 0.3 and q = 0.7 have 50+ binary digits: each mask is drawn word by word
    # until decided. With u = all ones each digit b=1 decides 1, b=0 keeps lanes open.
    params = RapporParams(k=4, h=1, m=4, f=0.5, p=0.3, q=0.7)
    # 0.3 = 0.0100110011...b: u=1111 at digit 1 (b=0) keeps all open, digit 2 (b=1) decides 1.
    # 0.7 = 0.1011001100...b: u=0000 at digit 1 (b=1) keeps open, digit 2 (b=0) decides 0.
    enc = _enc(params, [0b1111, 0b1111, 0b0000, 0b0000])
    assert enc.instantaneous_response(PermanentResponse(0b0011)).bits == 0b1100
    assert enc._rand.left == 0  # type: ignore[attr-defined]


def test_irr_p0_q1_is_the_prr_and_draws_nothing() -> None:
    enc = _enc(RapporParams(k=16, h=2, m=4, f=0.5, p=0.0, q=1.0))
    assert enc.instantaneous_response(PermanentResponse(0xBEEF)).bits == 0xBEEF


# -- encode -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "hashing"),
    [
        (RapporParams(k=128, h=2, m=64, f=0.5, p=0.25, q=0.75), "mmh3"),
        (RapporParams(k=128, h=4, m=64, f=0.5, p=0.5, q=0.75), "mmh3"),
        (RapporParams(k=12, h=1, m=8, f=0.45, p=0.3, q=0.7), "mmh3"),
        (RapporParams(k=16, h=2, m=8, f=0.5, p=0.5, q=0.75), "rappor-md5"),
    ],
)
def test_encode_is_irr_of_prr_of_bloom(params: RapporParams, hashing: str) -> None:
    words = [w * 2654435761 % (1 << params.k) for w in range(1, 400)]
    fast = _enc(params, words, hashing=hashing)
    slow = _enc(params, words, hashing=hashing)
    for value in ("a", "bb", "example.com", b"\xff\x00", "é"):
        report = fast.encode(value)
        irr = slow.instantaneous_response(slow.permanent_response(slow.bloom(value)))
        expected = Report(
            metric="m",
            cohort=fast.cohort,
            bits=irr.bits.to_bytes(params.report_bytes, "little"),
            params_fingerprint=params.fingerprint(hashing),  # type: ignore[arg-type]
        )
        assert report == expected
        assert hash(report) == hash(expected)
        assert fast._rand.left == slow._rand.left  # type: ignore[attr-defined]


def test_str_value_is_its_utf8_bytes() -> None:
    params = RapporParams(k=64, h=2, m=4, f=0.5, p=0.0, q=1.0)
    enc = _enc(params)
    assert enc.encode("naïve") == enc.encode("naïve".encode())
    with pytest.raises(TypeError):
        enc.encode(5)  # type: ignore[arg-type]


def test_cohort_comes_from_the_secret() -> None:
    params = RapporParams(k=16, m=64)
    enc = RapporEncoder(params, secret=SECRET, metric="m")
    assert enc.cohort == cohort_for_secret(SECRET, 64) == cohort_for_secret(SECRET, 64)
    assert enc.encode("x").cohort == enc.cohort
    assert RapporEncoder(params, secret=SECRET, metric="m", cohort=5).cohort == 5


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"secret": b"short"}, "secret must be at least 16 bytes"),
        ({"secret": b""}, "secret"),
        ({"metric": ""}, "metric"),
        ({"cohort": 64}, "cohort"),
        ({"cohort": -1}, "cohort"),
        ({"cohort": True}, "cohort"),
        ({"hashing": "sha1"}, "hashing"),
    ],
)
def test_encoder_rejects_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"secret": SECRET, "metric": "m", **kwargs}
    with pytest.raises(ValueError, match=match):
        RapporEncoder(RapporParams(k=16, m=64), **args)  # type: ignore[arg-type]


def test_rappor_md5_with_a_short_secret_warns_that_the_prr_rests_on_it() -> None:
    import warnings

    from crowdmix.client.rappor import ShortSecretWarning

    params = RapporParams(k=16, h=2, m=8, f=0.5, p=0.5, q=0.75)
    with pytest.warns(ShortSecretWarning, match="secret's entropy"):
        RapporEncoder(params, secret="c1", metric="m", hashing="rappor-md5", cohort=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RapporEncoder(params, secret=bytes(range(16)), metric="m", hashing="rappor-md5", cohort=0)
