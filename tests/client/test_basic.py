"""Basic mechanisms: exact outputs with scripted bits, then seeded distributions.

Statistical checks are exact binomial / chi-square tests at ALPHA = 1e-9 each;
each test states its number of checks (false failure <= checks·1e-9 <= 1e-6).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from crowdmix.client import BasicEncoder, BasicParams, ParamsError
from crowdmix.client.randomness import probability_digits
from crowdmix.core.basic import OLH_PRIME, olh_hash
from tests.client.bitsources import SeededBits, scripted_fields
from tests.client.stats import binomial_ok, chi_square_ok

LN3 = math.log(3.0)


def _enc(params: BasicParams, fields: list[tuple[int, int]], **kw: object) -> BasicEncoder:
    return BasicEncoder(params, metric="m", rand=scripted_fields(fields), **kw)  # type: ignore[arg-type]


def _not_kept(prob: float) -> list[tuple[int, int]]:
    """A 1-lane script deciding 0: zero bits up to and including the first 0 digit."""
    digits = probability_digits(prob)
    n = digits.index(0) + 1 if 0 in digits else len(digits)
    return [(0, 1)] * n


# -- exact --------------------------------------------------------------------


def test_binary_rr_exact() -> None:
    # exp(ln 3) is 3 + 4e-16, so keep = 0.75 + 1e-16 = 0.1100...01b: u1 = 1 or u2 = 1
    # decides keep; u1 = u2 = 0 leaves it open and u3 = 0 (digit 0) decides flip.
    params = BasicParams(mechanism="binary-rr", epsilon=LN3)
    assert probability_digits(params.keep_probability)[:3] == (1, 1, 0)
    assert _enc(params, [(1, 1)]).randomize(1) == b"\x01"
    assert _enc(params, [(0, 1), (1, 1)]).randomize(0) == b"\x00"
    assert _enc(params, [(0, 1), (0, 1), (0, 1)]).randomize(0) == b"\x01"
    assert _enc(params, [(0, 1), (0, 1), (0, 1)]).randomize(1) == b"\x00"


def test_krr_exact() -> None:
    params = BasicParams(mechanism="krr", epsilon=math.log(9.0), domain_size=4)
    assert params.keep_probability == pytest.approx(0.75)
    no = _not_kept(params.keep_probability)
    assert _enc(params, [(1, 1)]).randomize(2) == b"\x02"
    # not kept, then uniform over the 3 others by rejection: r = 3 rejected, r = 1 -> skip
    # the true index 1 -> 2.
    assert _enc(params, [*no, (3, 2), (1, 2)]).randomize(1) == b"\x02"
    assert _enc(params, [*no, (0, 2)]).randomize(1) == b"\x00"
    assert _enc(params, [*no, (2, 2)]).randomize(0) == b"\x03"
    wide = BasicParams(mechanism="krr", epsilon=1.0, domain_size=300)
    assert wide.report_bytes == 2
    assert len(BasicEncoder(wide, metric="m").randomize(299)) == 2


def test_oue_exact() -> None:
    params = BasicParams(mechanism="oue", epsilon=LN3, domain_size=8)
    assert params.oue_q == pytest.approx(0.25)  # 0.01b: u1 = 0 -> 0, else u2 = 1 -> 1
    # u1 = 11110000, u2 = 10101010 -> others 10100000; true bit 2 cleared, then
    # its own coin (1 -> set).
    enc = _enc(params, [(0b11110000, 8), (0b10101010, 8), (1, 1)])
    assert enc.randomize(2) == bytes([0b10100100])
    enc = _enc(params, [(0b11110000, 8), (0b10101010, 8), (0, 1)])
    assert enc.randomize(5) == bytes([0b10000000])


def test_olh_exact() -> None:
    params = BasicParams(mechanism="olh", epsilon=LN3, domain_size=100)
    assert params.olh_buckets == 4 and params.keep_probability == pytest.approx(0.5)
    # keep = 0.5 + 1e-16 = 0.100...01b: u1 = 1 keeps, u1 = u2 = 0 moves.
    a, b = 12345, 678
    x = 42
    hx = olh_hash(a, b, x, 4)
    kept = _enc(params, [(a - 1, 31), (b, 31), (1, 1)]).randomize(x)
    assert kept == a.to_bytes(4, "little") + b.to_bytes(4, "little") + bytes([hx])
    moved = _enc(params, [(a - 1, 31), (b, 31), (0, 1), (0, 1), (0, 2)]).randomize(x)
    assert moved[8] == (1 if hx == 0 else 0)
    # a is drawn from [1, P): a draw of P - 1 is rejected.
    out = _enc(params, [(OLH_PRIME - 1, 31), (a - 1, 31), (b, 31), (1, 1)]).randomize(x)
    assert int.from_bytes(out[:4], "little") == a


def test_encode_with_domain_and_errors() -> None:
    params = BasicParams(mechanism="krr", epsilon=math.log(9.0), domain_size=3)
    enc = BasicEncoder(params, metric="m", domain=["a", "b", "c"], rand=scripted_fields([(1, 1)]))
    report = enc.encode("b")
    assert (report.metric, report.cohort, report.bits) == ("m", 0, b"\x01")
    assert report.params_fingerprint == params.fingerprint()
    with pytest.raises(ValueError, match="not in the metric's domain"):
        enc.encode("z")
    with pytest.raises(ValueError, match="index"):
        enc.encode(3)
    with pytest.raises(ParamsError, match="domain has 2 values"):
        BasicEncoder(params, metric="m", domain=["a", "b"])
    with pytest.raises(ParamsError, match="distinct"):
        BasicEncoder(params, metric="m", domain=["a", "a", "b"])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mechanism": "rr", "epsilon": 1.0}, "mechanism"),
        ({"mechanism": "krr", "epsilon": 0.0}, "epsilon"),
        ({"mechanism": "krr", "epsilon": float("nan")}, "epsilon"),
        ({"mechanism": "krr", "epsilon": 31.0}, "epsilon"),
        ({"mechanism": "krr", "epsilon": 1.0, "domain_size": 1}, "domain_size"),
        ({"mechanism": "binary-rr", "epsilon": 1.0, "domain_size": 3}, "domain_size"),
    ],
)
def test_basic_params_validation(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ParamsError, match=rf"^{field}\b"):
        BasicParams(**kwargs)  # type: ignore[arg-type]


# -- distributions --------------------------------------------------------------

N = 20000


def test_binary_rr_distribution() -> None:
    # 2 checks.
    params = BasicParams(mechanism="binary-rr", epsilon=1.3)
    enc = BasicEncoder(params, metric="m", rand=SeededBits(21))
    for x in (0, 1):
        kept = sum(enc.randomize(x)[0] == x for _ in range(N))
        assert binomial_ok(kept, N, math.exp(1.3) / (math.exp(1.3) + 1))


def test_krr_distribution() -> None:
    # 5 checks (one per output).
    d, eps = 5, 1.1
    params = BasicParams(mechanism="krr", epsilon=eps, domain_size=d)
    enc = BasicEncoder(params, metric="m", rand=SeededBits(22))
    counts = np.bincount([enc.randomize(2)[0] for _ in range(N)], minlength=d)
    keep = math.exp(eps) / (math.exp(eps) + d - 1)
    for y in range(d):
        assert binomial_ok(int(counts[y]), N, keep if y == 2 else (1 - keep) / (d - 1))


def test_oue_distribution() -> None:
    # 10 checks (one per bit).
    d, eps = 10, 0.9
    params = BasicParams(mechanism="oue", epsilon=eps, domain_size=d)
    enc = BasicEncoder(params, metric="m", rand=SeededBits(23))
    counts = np.zeros(d, dtype=np.int64)
    for _ in range(N):
        bits = int.from_bytes(enc.randomize(7), "little")
        counts += [(bits >> i) & 1 for i in range(d)]
    q = 1 / (math.exp(eps) + 1)
    for i in range(d):
        assert binomial_ok(int(counts[i]), N, 0.5 if i == 7 else q)


def test_olh_distribution() -> None:
    # 2 binomial checks + 2 chi-square checks.
    eps = 1.6
    params = BasicParams(mechanism="olh", epsilon=eps, domain_size=1000)
    g = params.olh_buckets
    enc = BasicEncoder(params, metric="m", rand=SeededBits(24))
    x = 417
    hits, others, a_buckets, b_buckets = 0, np.zeros(g - 1, dtype=np.int64), [], []
    for _ in range(N):
        out = enc.randomize(x)
        a, b, y = (int.from_bytes(out[i:j], "little") for i, j in ((0, 4), (4, 8), (8, 9)))
        assert 1 <= a < OLH_PRIME and 0 <= b < OLH_PRIME and 0 <= y < g
        hx = olh_hash(a, b, x, g)
        if y == hx:
            hits += 1
        else:
            others[(y - hx) % g - 1] += 1
        a_buckets.append((a - 1) * 16 // (OLH_PRIME - 1))
        b_buckets.append(b * 16 // OLH_PRIME)
    keep = math.exp(eps) / (math.exp(eps) + g - 1)
    assert binomial_ok(hits, N, keep)
    # given a move, the bucket is uniform over the other g - 1 (g = 6 here)
    assert g == 6
    assert chi_square_ok(others)
    assert chi_square_ok(np.bincount(a_buckets, minlength=16))
    assert chi_square_ok(np.bincount(b_buckets, minlength=16))


def test_olh_epsilon_is_capped_where_its_buckets_fit_the_payload() -> None:
    from crowdmix.core.basic import MAX_OLH_EPSILON

    params = BasicParams(mechanism="olh", epsilon=MAX_OLH_EPSILON, domain_size=4)
    assert params.olh_buckets < 2**31
    BasicEncoder(params, metric="m").encode(1)  # encodes without overflow
    with pytest.raises(ValueError, match=r"at most 20\.0 for olh"):
        BasicParams(mechanism="olh", epsilon=MAX_OLH_EPSILON + 1, domain_size=4)
