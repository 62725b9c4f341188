"""Seeded statistical tests of the RAPPOR encoder.

Each check is an exact binomial (or chi-square) test at level ALPHA = 1e-9;
every test states how many checks it makes, so its false-failure probability
is at most (checks)·1e-9 <= 1e-6 by the union bound. Seeds make runs
reproducible; the statistics do not depend on the seeds' values.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from crowdmix.client import RapporEncoder, RapporParams, cohort_for_secret
from crowdmix.core.privacy import p_star, q_star
from tests.client.bitsources import SeededBits
from tests.client.stats import binomial_ok, chi_square_ok

# statistical, seconds each: the full check runs them, scripts/check --fast does not
pytestmark = pytest.mark.slow


def _secrets(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(32) for _ in range(n)]


def _bit_counts(values: list[int], k: int) -> np.ndarray:
    counts = np.zeros(k, dtype=np.int64)
    for v in values:
        counts += np.unpackbits(
            np.frombuffer(v.to_bytes((k + 7) // 8, "little"), dtype=np.uint8), bitorder="little"
        )[:k]
    return counts


BLOOM = 0b1011_0000_0000_0001_0010_0000_1000_0110  # 8 of k = 32 bits set
K = 32


@pytest.mark.parametrize("f", [0.5, 0.25, 0.45])
def test_prr_bit_frequencies_are_f_over_2(f: float) -> None:
    # 32 checks per f (3 params): false failure <= 96e-9.
    params = RapporParams(k=K, h=2, m=4, f=f, p=0.25, q=0.75)
    n = 20000
    prrs = [
        RapporEncoder(params, secret=s, metric="m", cohort=0).permanent_response(BLOOM).bits
        for s in _secrets(n, seed=11)
    ]
    counts = _bit_counts(prrs, K)
    ones = np.array([BLOOM >> i & 1 for i in range(K)], dtype=bool)
    assert binomial_ok(counts[ones], n, 1 - f / 2)
    assert binomial_ok(counts[~ones], n, f / 2)


@pytest.mark.parametrize(("p", "q"), [(0.25, 0.75), (0.5, 0.75), (0.3, 0.7), (0.0, 0.875)])
def test_irr_bit_frequencies_are_p_and_q(p: float, q: float) -> None:
    # 32 checks per (p, q) (4 params): false failure <= 128e-9.
    params = RapporParams(k=K, h=2, m=4, f=0.5, p=p, q=q)
    enc = RapporEncoder(params, secret=bytes(32), metric="m", cohort=0, rand=SeededBits(1))
    n = 20000
    prr = enc.permanent_response(BLOOM)
    counts = _bit_counts([enc.instantaneous_response(prr).bits for _ in range(n)], K)
    ones = np.array([prr.bits >> i & 1 for i in range(K)], dtype=bool)
    assert 0 < ones.sum() < K
    assert binomial_ok(counts[ones], n, q)
    assert binomial_ok(counts[~ones], n, p)


@pytest.mark.parametrize(
    "params",
    [
        RapporParams(k=K, h=2, m=4, f=0.5, p=0.25, q=0.75),
        RapporParams(k=K, h=2, m=4, f=0.45, p=0.3, q=0.7),
    ],
)
def test_one_report_per_client_has_bit_frequencies_p_star_q_star(params: RapporParams) -> None:
    # Fresh client per report: report bit i is 1 w.p. q* on Bloom 1-bits, p* on 0-bits.
    # 32 checks per params (2 params): false failure <= 64e-9.
    n = 20000
    rand = SeededBits(2)
    reports = []
    for s in _secrets(n, seed=12):
        enc = RapporEncoder(params, secret=s, metric="m", cohort=3, rand=rand)
        reports.append(enc.instantaneous_response(enc.permanent_response(BLOOM)).bits)
    counts = _bit_counts(reports, K)
    ones = np.array([BLOOM >> i & 1 for i in range(K)], dtype=bool)
    assert binomial_ok(counts[ones], n, q_star(params))
    assert binomial_ok(counts[~ones], n, p_star(params))


def test_memoisation_same_secret_same_prr_across_reports() -> None:
    # One client reporting one value many times: the PRR is fixed, so bit i of its
    # reports is 1 w.p. q where its PRR bit is 1 and p where it is 0 (not p*, q*).
    # 128 checks: false failure <= 128e-9.
    params = RapporParams(k=128, h=2, m=4, f=0.5, p=0.25, q=0.75)
    secret = bytes(range(32))
    enc = RapporEncoder(params, secret=secret, metric="m", rand=SeededBits(3))
    again = RapporEncoder(params, secret=secret, metric="m")
    prr = enc.permanent_response(enc.bloom("example.com")).bits
    assert prr == again.permanent_response(again.bloom("example.com")).bits
    n = 20000
    reports = [int.from_bytes(enc.encode("example.com").bits, "little") for _ in range(n)]
    counts = _bit_counts(reports, 128)
    ones = np.array([prr >> i & 1 for i in range(128)], dtype=bool)
    assert binomial_ok(counts[ones], n, 0.75)
    assert binomial_ok(counts[~ones], n, 0.25)


@pytest.mark.parametrize("f", [0.5, 0.25])
def test_different_secrets_give_independent_prrs(f: float) -> None:
    # Two independent PRRs of one Bloom bit agree w.p. a = (1-f/2)^2 + (f/2)^2;
    # the agreements of n pairs x k bits are Binomial(n·k, a). 1 check per f.
    params = RapporParams(k=64, h=2, m=4, f=f)
    bloom = (1 << 64) - 1 ^ 0xF0F0
    secrets = _secrets(2 * 3000, seed=13)
    agree = 0
    for a, b in zip(secrets[::2], secrets[1::2], strict=True):
        pa = RapporEncoder(params, secret=a, metric="m", cohort=0).permanent_response(bloom)
        pb = RapporEncoder(params, secret=b, metric="m", cohort=0).permanent_response(bloom)
        agree += 64 - (pa.bits ^ pb.bits).bit_count()
    assert binomial_ok(agree, 3000 * 64, (1 - f / 2) ** 2 + (f / 2) ** 2)


def test_cohorts_are_uniform_across_secrets() -> None:
    # Chi-square over 64 cohorts and over 5 cohorts (a non-power of two): 2 checks.
    secrets = _secrets(32000, seed=14)
    for m in (64, 5):
        counts = np.bincount([cohort_for_secret(s, m) for s in secrets], minlength=m)
        assert counts.size == m
        assert chi_square_ok(counts)
