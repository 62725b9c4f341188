"""The batch permutation and the random drop: uniform, CSPRNG by default, wired in."""

from __future__ import annotations

import inspect
import itertools
import os
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from crowdmix.shuffler.commit import GroupCommitter
from crowdmix.shuffler.forwarding import Releaser
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.shuffle import keep_mask, secure_permutation
from crowdmix.shuffler.store import InFlightBatch, PendingWrite, QueueKey
from tests.shuffler.helpers import RAPPOR, make_registry, report_ids, unique_chunk


def seeded_bytes(seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    return lambda n: rng.bytes(n)


@pytest.mark.slow  # statistical: the full check runs it
def test_permutation_is_uniform_over_all_orders() -> None:
    # 4! = 24 orders, 48 000 draws: chi-square with 23 degrees of freedom. The
    # threshold is the 1 - 1e-7 quantile, so a correct (uniform) permutation fails
    # with probability 1e-7; the seed makes the test deterministic.
    draws = 48_000
    rb = seeded_bytes(20261121)
    counts = Counter(tuple(secure_permutation(4, rb).tolist()) for _ in range(draws))
    assert set(counts) == set(itertools.permutations(range(4)))
    observed = np.array([counts[p] for p in itertools.permutations(range(4))])
    chi2 = float(((observed - draws / 24) ** 2 / (draws / 24)).sum())
    assert chi2 < stats.chi2.isf(1e-7, df=23)


def test_every_report_is_equally_likely_at_every_position() -> None:
    # n = 50, 20 000 permutations: the 50×50 position table, chi-square with
    # 49² = 2401 degrees of freedom, threshold the 1 - 1e-7 quantile (false failure 1e-7).
    n, draws = 50, 20_000
    rb = seeded_bytes(7)
    table = np.zeros((n, n), dtype=np.int64)
    for _ in range(draws):
        table[np.arange(n), secure_permutation(n, rb)] += 1
    expected = draws / n
    chi2 = float(((table - expected) ** 2 / expected).sum())
    assert chi2 < stats.chi2.isf(1e-7, df=(n - 1) ** 2)


def test_permutation_is_exact_with_injected_bytes() -> None:
    keys = np.array([30, 10, 20], dtype=np.uint64).tobytes()
    assert secure_permutation(3, lambda n: keys[:n]).tolist() == [1, 2, 0]
    assert secure_permutation(0).tolist() == [] and secure_permutation(1).tolist() == [0]


def test_defaults_are_the_os_csprng() -> None:
    for fn, param in (
        (secure_permutation, "random_bytes"),
        (keep_mask, "random_bytes"),
        (Releaser.__init__, "random_bytes"),
        (GroupCommitter.__init__, "random_bytes"),
    ):
        assert inspect.signature(fn).parameters[param].default is os.urandom


def test_keep_mask_rate_and_exact_threshold() -> None:
    # P(draw < round(0.25·2^32)) = 0.25 exactly for these injected draws
    draws = np.array([0, 2**30 - 1, 2**30, 2**32 - 1], dtype=np.uint32).tobytes()
    assert keep_mask(4, 0.25, lambda n: draws[:n]).tolist() == [False, False, True, True]
    assert keep_mask(5, 0.0).all()
    # Binomial(10^5, 0.3): sd 145; 7 sd → false failure < 3e-12.
    kept = int(keep_mask(100_000, 0.3, seeded_bytes(3)).sum())
    assert abs(kept - 70_000) < 7 * 145


def test_releaser_forwards_a_permutation_of_the_taken_batch() -> None:
    registry = make_registry(min_batch=10, max_batch=1000, max_delay=0.0001)
    store = MemoryStore()
    key = QueueKey(window=registry.window_of(__import__("time").time()), fingerprint=1)
    store.append([PendingWrite.of(RAPPOR, key, unique_chunk(1000))])
    sent: list[InFlightBatch] = []
    keys = np.arange(1000, 0, -1, dtype=np.uint64).tobytes()  # sorts into reverse order
    releaser = Releaser(registry, store, sent.append, random_bytes=lambda n: keys[:n])
    assert releaser.run_once(lambda: False, final=True) == 1
    assert report_ids(sent[0].chunk).tolist() == list(range(999, -1, -1))
    assert store.inflight_ids(RAPPOR) == []
