"""Empirical privacy audit of every encoder (see tests/client/audit.py).

False failure: each audit of a correct ε-LDP mechanism fails with probability
at most 4·2.5e-10·outputs <= 2.6e-7 (256 outputs at most). The broken variants
must be caught; their true log-ratio exceeds ε by > 0.5 at these sample sizes,
so missing them has probability far below 1e-6 (and the seeds fix the runs).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from crowdmix.client import BasicEncoder, BasicParams, RapporEncoder, RapporParams, epsilon_one
from crowdmix.client.randomness import bernoulli_bits
from crowdmix.core.basic import olh_hash
from tests.client.audit import audit_log_ratio
from tests.client.bitsources import SeededBits

# statistical, seconds each: the full check runs them, scripts/check --fast does not
pytestmark = pytest.mark.slow


def _rappor_sampler(
    params: RapporParams, values: tuple[str, str], seed: int, positions: list[int]
) -> Callable[[int], int]:
    """One report from a fresh client (fresh secret, so fresh PRR) per call, cohort 0,
    projected onto ``positions`` (output bit j = report bit positions[j])."""
    rng = random.Random(seed)
    rand = SeededBits(seed)

    def sample(which: int) -> int:
        enc = RapporEncoder(params, secret=rng.randbytes(16), metric="m", cohort=0, rand=rand)
        bits = int.from_bytes(enc.encode(values[which]).bits, "little")
        return sum((bits >> pos & 1) << j for j, pos in enumerate(positions))

    return sample


@pytest.mark.parametrize(
    ("params", "project"),
    [
        (RapporParams(k=4, h=1, m=1, f=0.5, p=0.25, q=0.75), False),
        (RapporParams(k=8, h=2, m=1, f=0.5, p=0.25, q=0.75), True),
        (RapporParams(k=8, h=2, m=1, f=0.25, p=0.5, q=0.75), True),
    ],
)
def test_rappor_one_report_within_epsilon_one(params: RapporParams, project: bool) -> None:
    values = ("a", "b")
    enc = RapporEncoder(params, secret=bytes(16), metric="m", cohort=0)
    bx, by = enc.bloom(values[0]), enc.bloom(values[1])
    # Disjoint Bloom filters: the worst case, where ε_1 is attained exactly.
    assert bx & by == 0
    assert bx.bit_count() == by.bit_count() == params.h
    # Either the whole report, or (k = 8) its 2h bits where the Bloom filters
    # differ: the other bits have the same law under both values and are
    # independent of these, so the projection keeps the worst ratio.
    positions = [i for i in range(params.k) if not project or (bx | by) >> i & 1]
    sample = _rappor_sampler(params, values, 31, positions)
    observed = audit_log_ratio(sample, 0, 1, 40000, 1 << len(positions))
    eps = epsilon_one(params)
    assert observed <= eps
    # ... and the audit is not vacuous: the observed bound comes within 30% of ε.
    assert observed > 0.7 * eps


def test_audit_catches_rappor_without_prr() -> None:
    # A broken client that skips the PRR (IRR straight on the Bloom filter) while
    # claiming ε_1 of f = 0.5: its real ratio is (q(1-p) / (p(1-q)))^h = 9 for h = 1.
    params = RapporParams(k=4, h=1, m=1, f=0.5, p=0.25, q=0.75)
    enc = RapporEncoder(params, secret=bytes(16), metric="m", cohort=0, rand=SeededBits(32))
    blooms = (enc.bloom("a"), enc.bloom("b"))

    def broken(which: int) -> int:
        return enc._irr(blooms[which])

    assert audit_log_ratio(broken, 0, 1, 40000, 16) > epsilon_one(params) + 0.5


def _basic_sampler(params: BasicParams, seed: int) -> Callable[[int], int]:
    enc = BasicEncoder(params, metric="m", rand=SeededBits(seed))
    if params.mechanism == "olh":
        g = params.olh_buckets

        # Project (a, b, y) onto (y == H(0), y == H(1)): post-processing, so its
        # ratio is bounded by the mechanism's.
        def project(x: int) -> int:
            out = enc.randomize(x)
            a, b, y = (int.from_bytes(out[i:j], "little") for i, j in ((0, 4), (4, 8), (8, 9)))
            return (y == olh_hash(a, b, 0, g)) + 2 * (y == olh_hash(a, b, 1, g))

        return project
    return lambda x: int.from_bytes(enc.randomize(x), "little")


@pytest.mark.parametrize(
    ("params", "outputs"),
    [
        (BasicParams(mechanism="binary-rr", epsilon=1.0), 2),
        (BasicParams(mechanism="krr", epsilon=1.0, domain_size=4), 4),
        (BasicParams(mechanism="oue", epsilon=1.0, domain_size=4), 16),
        (BasicParams(mechanism="olh", epsilon=1.5, domain_size=50), 4),
    ],
)
def test_basic_mechanisms_within_epsilon(params: BasicParams, outputs: int) -> None:
    observed = audit_log_ratio(_basic_sampler(params, 33), 0, 1, 40000, outputs)
    assert observed <= params.epsilon
    assert observed > 0.7 * params.epsilon


def test_audit_catches_broken_unary_encoding() -> None:
    # OUE with the other bits' probability computed for 2ε (forgetting that two bits
    # change between neighbours): its real ε is 2ε.
    eps, d = 1.0, 4
    rand = SeededBits(34)
    q_broken = 1 / (math.exp(2 * eps) + 1)

    def broken(x: int) -> int:
        bits = bernoulli_bits(rand, q_broken, d) & ~(1 << x)
        return bits | (rand.random_bits(1) << x)

    assert audit_log_ratio(broken, 0, 1, 40000, 1 << d) > eps + 0.5
