"""Opening batches of sealed reports: every failure is dropped and counted, never fatal."""

from __future__ import annotations

import os

import numpy as np
import pytest

from crowdmix.aggregator.sealing.keys import KeySet
from crowdmix.aggregator.sealing.opening import OpenedBatch, Opener, open_batch
from crowdmix.client.sealing import seal_report
from crowdmix.core.sealed import MLKEM768_X25519_SUITE, PublicKeyConfig, choose_key

T0 = 1_800_000_000
RB = 3  # report bytes of the test metric
FP = 0x1234_5678_9ABC_DEF0
W = T0 // 3600  # the collection window the reports name


def _seal(
    pub: PublicKeyConfig, i: int, *, metric: str = "m", fp: int = FP, window: int = W
) -> tuple[int, bytes, bytes]:
    rid = os.urandom(16)
    r = seal_report(
        pub,
        metric=metric,
        window=window,
        bits=bytes([i % 256, (i * 7) % 256, 0x80]),
        cohort=i % 5,
        fingerprint=fp,
        report_id=rid,
        report_bytes=RB,
    )
    return r.key_id, r.sealed, rid


def _open(
    keys: KeySet,
    rows: list[tuple[int, bytes, bytes]],
    now: int,
    metric: str = "m",
    window: int = W,
) -> OpenedBatch:
    return open_batch(
        keys,
        metric=metric,
        window=window,
        report_bytes=RB,
        fingerprint=FP,
        key_ids=[r[0] for r in rows],
        sealed=[r[1] for r in rows],
        now=now,
    )


@pytest.fixture(scope="module")
def keys() -> KeySet:
    ks, _ = KeySet().with_new_key(T0, grace_seconds=100)
    return ks


def test_round_trip_columns(keys: KeySet) -> None:
    pub = keys.get(1).public()  # type: ignore[union-attr]
    rows = [_seal(pub, i) for i in range(20)]
    rows.append(_seal(pub, 20, fp=FP + 1))  # opens, but under other params
    ob = _open(keys, rows, T0 + 1)
    assert ob.opened == 21 and ob.dropped == {}
    assert ob.bits.dtype == np.uint8 and ob.bits.shape == (21, RB)
    assert ob.bits[5].tolist() == [5, 35, 0x80]
    assert ob.cohorts.tolist() == [i % 5 for i in range(21)]
    assert ob.fingerprints_ok.tolist() == [True] * 20 + [False]
    assert [bytes(r) for r in ob.report_ids] == [r[2] for r in rows]


def test_each_failure_is_dropped_by_reason_and_the_rest_open() -> None:
    ks, _ = KeySet().with_new_key(T0)
    ks, _ = ks.rotate(T0 + 10, grace_seconds=1000)
    k1, k2 = ks.get(1).public(), ks.get(2).public()  # type: ignore[union-attr]
    good = [_seal(k2, i) for i in range(6)]
    rows = list(good)
    kid, ct, rid = _seal(k2, 100)
    for pos in (0, 40, len(ct) - 1):  # in enc, in the ciphertext, in the tag
        rows.append((kid, ct[:pos] + bytes([ct[pos] ^ 1]) + ct[pos + 1 :], rid))
    rows.append((2, _seal(k1, 101)[1], rid))  # sealed to key 1, labelled key 2
    rows.append((99, ct, rid))  # a key id the aggregator never had
    rows.append(_seal(k2, 102, metric="other"))  # replayed under another metric
    rows.append(_seal(k2, 104, window=W - 1))  # re-filed under another window
    rows.append(_seal(k2, 105, window=W + 1))
    rows.append((kid, ct + b"\x00", rid))  # wrong length
    rows.append((kid, ct[:-1], rid))
    rows.append(_seal(k1, 103))  # key 1 in its grace period still opens
    ob = _open(ks, rows, T0 + 20)
    assert ob.dropped == {"not_authentic": 7, "unknown_key": 1, "bad_length": 2}
    assert ob.index.tolist() == [0, 1, 2, 3, 4, 5, len(rows) - 1]
    assert ob.bits[-1].tolist() == [103, (103 * 7) % 256, 0x80]
    # the same report after key 1's grace: dropped as expired, not as unknown
    late = _open(ks, [rows[-1], good[0]], T0 + 10 + 1000)
    assert late.dropped == {"expired_key": 1} and late.opened == 1


def test_rotation_mid_stream_loses_nothing_within_the_grace_period() -> None:
    ks, _ = KeySet().with_new_key(T0, grace_seconds=3600)
    stream = []
    for t in range(T0, T0 + 100, 10):
        if t == T0 + 50:
            ks, _ = ks.rotate(t)  # devices pick up the new key from the published config
        pub = choose_key(ks.public_config(t).keys, t)
        stream.append(_seal(pub, t - T0))
    assert {r[0] for r in stream} == {1, 2}
    ob = _open(ks, stream, T0 + 3000)  # the batch is opened later, in key 1's grace
    assert ob.opened == len(stream) and ob.dropped == {}


def test_post_quantum_suite_opens() -> None:
    ks, key = KeySet().with_new_key(T0, suite=MLKEM768_X25519_SUITE.name)
    rows = [_seal(key.public(), i) for i in range(3)]
    assert len({len(r[1]) for r in rows}) == 1
    ob = _open(ks, rows, T0 + 1)
    assert ob.opened == 3
    # an X25519-length value under the hybrid key is refused by length
    other, _ = KeySet().with_new_key(T0)
    x = _seal(other.get(1).public(), 0)  # type: ignore[union-attr]
    assert _open(ks, [x], T0 + 1).dropped == {"bad_length": 1}


def test_a_worker_pool_gives_the_same_result_as_in_process(keys: KeySet) -> None:
    pub = keys.get(1).public()  # type: ignore[union-attr]
    rows = [_seal(pub, i) for i in range(700)]
    ct = rows[10][1]
    rows[10] = (1, ct[:-1] + bytes([ct[-1] ^ 1]), rows[10][2])  # tampered tag
    rows[600] = (42, rows[600][1], rows[600][2])
    local = _open(keys, rows, T0 + 1)
    with Opener(keys, workers=2) as pool:
        pooled = pool.open(
            metric="m",
            window=W,
            report_bytes=RB,
            fingerprint=FP,
            key_ids=np.array([r[0] for r in rows], dtype=np.uint32),
            sealed=[r[1] for r in rows],
            now=T0 + 1,
        )
    assert pooled.dropped == local.dropped == {"not_authentic": 1, "unknown_key": 1}
    for col in ("bits", "cohorts", "fingerprints_ok", "report_ids", "index"):
        assert np.array_equal(getattr(pooled, col), getattr(local, col)), col


def test_bad_arguments_are_value_errors(keys: KeySet) -> None:
    with pytest.raises(ValueError, match="workers"):
        Opener(keys, workers=-1)
    with pytest.raises(ValueError, match="2 key ids for 1 sealed"):
        open_batch(
            keys,
            metric="m",
            window=W,
            report_bytes=RB,
            fingerprint=FP,
            key_ids=[1, 1],
            sealed=[b"x"],
        )
    empty = open_batch(
        keys, metric="m", window=W, report_bytes=RB, fingerprint=FP, key_ids=[], sealed=[]
    )
    assert empty.opened == 0 and empty.bits.shape == (0, RB)
