"""Counting is exact: every accumulator against a naive per-report count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.counting.basic import IndexCounts, OlhSupportCounts, olh_hashes
from crowdmix.aggregator.counting.counts import (
    BLOCK,
    CohortCounts,
    CountsShapeError,
    columns_to_arrays,
)
from crowdmix.aggregator.counting.files import CountsFileError, load_counts, save_counts
from crowdmix.client.basic import BasicEncoder
from crowdmix.client.randomness import SecureBits
from crowdmix.core.basic import BasicParams, olh_hash
from crowdmix.core.params import RapporParams
from crowdmix.core.registry import MetricConfig


def naive_counts(
    cohorts: np.ndarray, bits: np.ndarray, m: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    totals = np.zeros(m, dtype=np.int64)
    ones = np.zeros((m, k), dtype=np.int64)
    for c, row in zip(cohorts.tolist(), bits, strict=True):
        totals[c] += 1
        value = int.from_bytes(row.tobytes(), "little")
        for i in range(k):
            ones[c, i] += (value >> i) & 1
    return totals, ones


def unpacked_counts(
    cohorts: np.ndarray, bits: np.ndarray, m: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """A second independent count for big batches: unpack every bit, np.add.at per report."""
    unpacked = np.unpackbits(bits, axis=1, bitorder="little")[:, :k].astype(np.int64)
    ones = np.zeros((m, k), dtype=np.int64)
    np.add.at(ones, cohorts, unpacked)
    return np.bincount(cohorts, minlength=m), ones


def random_batch(rng: np.random.Generator, n: int, m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    nb = (k + 7) // 8
    cohorts = rng.integers(0, m, n)
    bits = rng.integers(0, 256, (n, nb), dtype=np.uint8)
    if k % 8:
        bits[:, -1] &= (1 << (k % 8)) - 1
    return cohorts, bits


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 300),
    k=st.integers(1, 70),
    sizes=st.lists(st.integers(0, 400), min_size=1, max_size=6),
    seed=st.integers(0, 2**32 - 1),
    presorted=st.booleans(),
)
@pytest.mark.slow  # statistical: the full check runs it
def test_counts_equal_naive_count(
    m: int, k: int, sizes: list[int], seed: int, presorted: bool
) -> None:
    rng = np.random.default_rng(seed)
    counts = CohortCounts.create(m, k)
    all_c, all_b = [], []
    for n in sizes:
        c, b = random_batch(rng, n, m, k)
        if presorted:
            order = np.argsort(c, kind="stable")
            c, b = c[order], b[order]
        counts.add(c, b)
        all_c.append(c)
        all_b.append(b)
    totals, ones = naive_counts(np.concatenate(all_c), np.concatenate(all_b), m, k)
    np.testing.assert_array_equal(counts.totals, totals)
    np.testing.assert_array_equal(counts.ones, ones)


def test_block_boundaries_and_lane_overflow_are_exact() -> None:
    # One cohort with far more than 255 reports (every lane would carry without
    # segmenting), batches straddling the block size, plus adds after an extract.
    rng = np.random.default_rng(7)
    m, k = 3, 128
    counts = CohortCounts.create(m, k)
    c1 = np.zeros(BLOCK + 1000, dtype=np.int64)
    b1 = np.full((BLOCK + 1000, 16), 0xFF, dtype=np.uint8)
    c2, b2 = random_batch(rng, 2 * BLOCK + 17, m, k)
    counts.add(c2[:100], b2[:100])
    counts.add(c1, b1)
    _ = counts.ones  # extract in between must not lose or double anything
    counts.add(c2[100:], b2[100:])
    totals, ones = unpacked_counts(
        np.concatenate([c2[:100], c1, c2[100:]]), np.concatenate([b2[:100], b1, b2[100:]]), m, k
    )
    np.testing.assert_array_equal(counts.totals, totals)
    np.testing.assert_array_equal(counts.ones, ones)
    assert counts.num_reports == 3 * BLOCK + 1017


def test_merge_equals_counting_everything_in_one() -> None:
    rng = np.random.default_rng(3)
    c, b = random_batch(rng, 5000, 16, 20)
    whole = CohortCounts.create(16, 20)
    whole.add(c, b)
    left, right = CohortCounts.create(16, 20), CohortCounts.create(16, 20)
    left.add(c[:1234], b[:1234])
    right.add(c[1234:], b[1234:])
    snapshot = left.copy()
    left.merge(right)
    assert left == whole
    assert snapshot != whole  # copy is independent of later merges
    with pytest.raises(CountsShapeError, match="cannot merge"):
        left.merge(CohortCounts.create(16, 21))
    with pytest.raises(CountsShapeError, match="cannot merge"):
        left.merge(IndexCounts(20))


@pytest.mark.parametrize(
    ("cohorts", "bits", "message"),
    [
        ([0, 5], [[1], [1]], "cohort 5 out of range"),
        ([0, -1], [[1], [1]], "cohort -1 out of range"),
        ([0], [[1, 2]], "each report must be 1 bytes"),
        ([0, 1], [[1]], "1 reports"),
        ([0], [[0x80]], "padding bits"),
    ],
)
def test_bad_batches_are_rejected_and_count_nothing(
    cohorts: list[int], bits: list[list[int]], message: str
) -> None:
    counts = CohortCounts.create(4, 7)
    with pytest.raises(CountsShapeError, match=message):
        counts.add(np.array(cohorts), np.array(bits, dtype=np.uint8))
    assert counts.num_reports == 0


def test_float_bits_are_rejected() -> None:
    with pytest.raises(CountsShapeError, match="uint8"):
        CohortCounts.create(1, 8).add(np.zeros(1, dtype=np.int64), np.zeros((1, 1)))


def test_columns_to_arrays_round_trip() -> None:
    c, b = columns_to_arrays([1, 0, 2], bytes([1, 2, 3, 4, 5, 6]), 3, 2)
    assert c.tolist() == [1, 0, 2]
    assert b.tolist() == [[1, 2], [3, 4], [5, 6]]
    with pytest.raises(CountsShapeError):
        columns_to_arrays([1], b"abc", 1, 2)


def test_olh_hashes_equal_the_clients_hash() -> None:
    rng = np.random.default_rng(11)
    a = rng.integers(1, 2**31 - 1, 3000)
    b = rng.integers(0, 2**31 - 1, 3000)
    x = rng.integers(0, 2**24, 3000)
    edge_a = np.array([1, 2**31 - 2, 2**31 - 2, 12345])
    edge_b = np.array([0, 2**31 - 2, 0, 2**31 - 2])
    edge_x = np.array([0, 2**24 - 1, 2**24 - 1, 1])
    a, b, x = np.concatenate([a, edge_a]), np.concatenate([b, edge_b]), np.concatenate([x, edge_x])
    for g in (2, 3, 8, 1001):
        got = olh_hashes(a, b, x, g)
        want = [olh_hash(int(ai), int(bi), int(xi), g) for ai, bi, xi in zip(a, b, x, strict=True)]
        assert got.tolist() == want


def _basic_metric(mechanism: str, d: int, eps: float = 1.5) -> MetricConfig:
    return MetricConfig(
        name="m",
        basic=BasicParams(mechanism=mechanism, epsilon=eps, domain_size=d),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("mechanism", "d"), [("binary-rr", 2), ("krr", 5), ("krr", 300), ("oue", 11), ("olh", 9)]
)
def test_basic_accumulators_count_supports_exactly(mechanism: str, d: int) -> None:
    metric = _basic_metric(mechanism, d)
    assert metric.basic is not None
    enc = BasicEncoder(metric.basic, metric="m", rand=SecureBits())
    values = [i % d for i in range(400)]
    payloads = [enc.randomize(v) for v in values]
    acc = accumulator_for(metric)
    bits = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(len(payloads), -1)
    acc.add(np.zeros(150, dtype=np.int64), bits[:150])
    acc.add(np.zeros(250, dtype=np.int64), bits[150:])
    # naive support per value, straight from the payload layout in client.basic
    support = np.zeros(max(d, 1) if mechanism != "binary-rr" else 1, dtype=np.int64)
    for p in payloads:
        if mechanism == "binary-rr":
            support[0] += p[0] & 1
        elif mechanism == "krr":
            support[int.from_bytes(p, "little")] += 1
        elif mechanism == "oue":
            word = int.from_bytes(p, "little")
            for v in range(d):
                support[v] += (word >> v) & 1
        else:
            a, b, y = (
                int.from_bytes(p[:4], "little"),
                int.from_bytes(p[4:8], "little"),
                int.from_bytes(p[8:], "little"),
            )
            for v in range(d):
                support[v] += olh_hash(a, b, v, metric.basic.olh_buckets) == y
    assert acc.num_reports == 400
    np.testing.assert_array_equal(acc.ones[0], support)
    merged = accumulator_for(metric)
    merged.merge(acc)
    assert merged == acc


def test_basic_accumulators_reject_out_of_range_payloads() -> None:
    krr = IndexCounts(5)
    with pytest.raises(CountsShapeError, match="index 7"):
        krr.add(np.zeros(2, dtype=np.int64), np.array([[1], [7]], dtype=np.uint8))
    olh = OlhSupportCounts(4, 3)
    bad_y = np.array([[1, 0, 0, 0, 0, 0, 0, 0, 3]], dtype=np.uint8)
    with pytest.raises(CountsShapeError, match="bucket"):
        olh.add(np.zeros(1, dtype=np.int64), bad_y)
    bad_a = np.array([[0, 0, 0, 0, 0, 0, 0, 0, 1]], dtype=np.uint8)
    with pytest.raises(CountsShapeError, match="parameter a"):
        olh.add(np.zeros(1, dtype=np.int64), bad_a)
    with pytest.raises(CountsShapeError, match="cohort 1"):
        krr.add(np.ones(1, dtype=np.int64), np.array([[1]], dtype=np.uint8))
    assert krr.num_reports == 0 and olh.num_reports == 0


def test_accumulator_for_rappor_and_restore_from_arrays() -> None:
    metric = MetricConfig(name="r", rappor=RapporParams(k=16, h=2, m=4))
    acc = accumulator_for(metric)
    assert isinstance(acc, CohortCounts) and (acc.num_cohorts, acc.nbits) == (4, 16)
    acc.add(np.array([0, 3]), np.array([[1, 0], [0, 128]], dtype=np.uint8))
    again = accumulator_for(metric, totals=acc.totals, ones=acc.ones)
    assert again == acc
    with pytest.raises(CountsShapeError, match="shape"):
        accumulator_for(metric, totals=np.zeros(3, dtype=np.int64), ones=acc.ones)


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    metric = _basic_metric("olh", 6)
    acc = accumulator_for(metric)
    assert metric.basic is not None
    enc = BasicEncoder(metric.basic, metric="m")
    payload = b"".join(enc.randomize(i % 6) for i in range(30))
    acc.add(np.zeros(30, dtype=np.int64), np.frombuffer(payload, np.uint8).reshape(30, -1))
    path = tmp_path / "c.npz"
    save_counts(path, acc, metric="m", encoding="olh", fingerprint=metric.fingerprint, window=7)
    saved = load_counts(path)
    assert saved.counts == acc and saved.window == 7 and saved.metric == "m"
    saved.check_metric(metric)
    with pytest.raises(CountsFileError, match="params mismatch"):
        saved.check_metric(_basic_metric("olh", 6, eps=2.0))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(CountsFileError, match="not a crowdmix counts file"):
        load_counts(tmp_path / "junk.npz")
    with pytest.raises(CountsFileError, match="does not exist"):
        load_counts(tmp_path / "missing.npz")


def test_a_protobuf_batch_counts_straight_from_its_columns() -> None:
    from crowdmix.protos import crowdmix_pb2

    rng = np.random.default_rng(21)
    cohorts, bits = random_batch(rng, 3000, 64, 128)
    wire = crowdmix_pb2.ReportColumns(
        metric="m",
        count=3000,
        report_bytes=16,
        cohorts=cohorts.tolist(),
        bits=bits.tobytes(),
    ).SerializeToString()
    batch = crowdmix_pb2.ReportColumns.FromString(wire)
    c, b = columns_to_arrays(batch.cohorts, batch.bits, batch.count, batch.report_bytes)
    assert not b.flags.writeable  # a view of the message's bytes, not a copy
    counts = CohortCounts.create(64, 128)
    counts.add(c, b)
    totals, ones = unpacked_counts(cohorts, bits, 64, 128)
    np.testing.assert_array_equal(counts.totals, totals)
    np.testing.assert_array_equal(counts.ones, ones)
