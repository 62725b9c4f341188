"""Sealed reports through the real daemons: Redis (AOF), `crowdmix shuffler serve`
processes holding only the public key file, `crowdmix aggregator serve --keys`.

The shuffler learns who, never what: after reports whose plaintext carries a
known pattern went through the public SDK, neither the shuffler's Redis (every
key) nor its AOF files hold the pattern or any report id; the shuffler process
never sees the private key (args, environment, memory); counts are exact per
sender, across a key rotation in the middle of a stream; a tampered ciphertext,
one replayed under another metric, one sealed to an unknown or an expired key
are refused or dropped, by reason, without failing their batch.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crowdmix.aggregator.sealing.keys import load_keyset
from crowdmix.client.report import Report
from crowdmix.client.sealing import seal_report
from crowdmix.client.transport import ShufflerClient
from crowdmix.cluster import LocalCluster, free_port
from crowdmix.core.registry import load_registry
from crowdmix.core.sealed import PROTOCOL_VERSION, PublicKeySet
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from tests.daemons import aggregator_metric, local_cluster, stored_counts

A, B = "sealed_a", "sealed_b"
# 16 bytes = k 128 bits: the known plaintext every test report carries as its bits
PATTERN = b"KNOWN-PLAINTEXT!"
REGISTRY = """
[metrics.sealed_a]
encoding = "rappor"
k = 128
h = 2
m = 16
f = 0.5
p = 0.5
q = 0.75
[metrics.sealed_a.shuffle]
min_batch = 20
max_delay_seconds = 0.2

[metrics.sealed_b]
encoding = "rappor"
k = 128
h = 2
m = 16
f = 0.25
p = 0.5
q = 0.75
[metrics.sealed_b.shuffle]
min_batch = 20
max_delay_seconds = 0.2
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(
        tmp_path_factory.mktemp("sealed"),
        REGISTRY,
        shufflers=2,
        extra_aggregator_args=["--metrics-port", str(free_port())],
    ) as c:
        yield c


def _fp(cluster: LocalCluster, metric: str) -> int:
    return load_registry(cluster.registry_path)[metric].fingerprint


def _reports(cluster: LocalCluster, metric: str, cohort: int, n: int) -> list[Report]:
    fp = _fp(cluster, metric)
    return [
        Report(metric=metric, cohort=cohort, bits=PATTERN, params_fingerprint=fp) for _ in range(n)
    ]


def _per_cohort(cluster: LocalCluster, metric: str) -> list[int]:
    got = stored_counts(cluster, metric)
    return [0] * 16 if got is None else [int(x) for x in got.totals]


def _wait_counts(cluster: LocalCluster, metric: str, want: dict[int, int]) -> list[int]:
    deadline = time.monotonic() + 60
    while True:
        got = _per_cohort(cluster, metric)
        if all(got[c] >= n for c, n in want.items()) or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def _dropped(cluster: LocalCluster, metric: str, reason: str) -> float:
    name = "crowdmix_aggregator_sealed_dropped_total"
    return aggregator_metric(cluster, name, metric=metric, reason=reason)


def _shuffler_bytes(cluster: LocalCluster) -> bytes:
    """Everything the shufflers' Redis holds: every key's value, and every file in its
    directory (the AOF: base and incremental files)."""
    import redis

    r = redis.Redis.from_url(cluster.shuffler_redis_url)
    parts: list[bytes] = []
    for key in r.scan_iter(count=1000):
        parts.append(key)
        kind = r.type(key)
        if kind == b"string":
            parts.append(r.get(key) or b"")
        elif kind == b"hash":
            for f, v in r.hgetall(key).items():
                parts += [f, v]
        elif kind == b"list":
            parts += r.lrange(key, 0, -1)
        elif kind == b"set":
            parts += list(r.smembers(key))
        elif kind == b"zset":
            parts += [m for m, _ in r.zrange(key, 0, -1, withscores=True)]
        else:
            parts.append(r.dump(key) or b"")
    r.close()
    files = [p for p in Path(cluster.redis.dir).rglob("*") if p.is_file()]
    assert any("appendonly" in p.name for p in files), files  # the AOF is there to scan
    parts += [p.read_bytes() for p in files]
    return b"\x00".join(parts)


def _process_memory(pid: int) -> bytes:
    """The readable memory of a child process (the test is its ancestor, so ptrace
    rules allow reading /proc/PID/mem)."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
        for line in maps:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+)", line)
            assert m is not None
            start, end, perms = int(m[1], 16), int(m[2], 16), m[3]
            if "r" not in perms or "[vvar" in line or "[vsyscall" in line:
                continue
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except OSError:
                continue
    return b"".join(chunks)


def _stub(cluster: LocalCluster, i: int = 0) -> tuple[crowdmix_pb2_grpc.ShufflerStub, tuple]:
    channel = grpc.insecure_channel(cluster.shuffler_targets[i])
    return crowdmix_pb2_grpc.ShufflerStub(channel), (("authorization", f"Bearer {cluster.token}"),)


def _window() -> int:
    """The current collection window (the test registry's day)."""
    return int(time.time() // 86400)


def _submit_error(stub: crowdmix_pb2_grpc.ShufflerStub, md: tuple, *reports: pb.Report) -> tuple:
    with pytest.raises(grpc.RpcError) as info:
        request = pb.SubmitRequest(reports=list(reports), protocol=PROTOCOL_VERSION)
        for r in request.reports:
            r.window = r.window or _window()
        stub.Submit(request, metadata=md, timeout=10)
    err = info.value
    assert isinstance(err, grpc.Call)
    return err.code(), err.details()


def test_sealed_end_to_end_exact_per_sender_and_no_plaintext_at_the_shuffler(
    cluster: LocalCluster,
) -> None:
    sent: list[Report] = []
    # every request (batch_size 50; the last of each sender 50, 40, 20, 20) holds at
    # least min_batch = 20: a shuffler that released everything before a sender's last
    # request arrived would otherwise hold that request's reports below min_batch, as
    # it must (a box loaded by the rest of the suite once did that to a last 10)
    per_sender = {0: 150, 1: 90, 2: 120, 3: 70}
    for sender, n in per_sender.items():
        reports = _reports(cluster, A, sender, n)
        sent += reports
        with ShufflerClient(
            cluster.shuffler_targets[sender % 2],
            cluster.token,
            sealing="required",
            batch_size=50,
            # sender 0 sends rows (Report messages), the others columns
            columnar_threshold=1000 if sender == 0 else 16,
        ) as client:
            client.submit_many(reports)
            client.flush()
            assert (client.sent, client.sealed, client.failed) == (n, n, 0)
    got = _wait_counts(cluster, A, per_sender)
    assert {c: got[c] for c in per_sender} == per_sender
    assert _dropped(cluster, A, "not_authentic") == 0
    held = _shuffler_bytes(cluster)
    assert PATTERN not in held
    assert PATTERN[:8] not in held and PATTERN[8:] not in held
    assert not any(r.report_id in held for r in sent)


def test_the_scan_finds_plaintext_when_sealing_is_off(tmp_path: Path) -> None:
    """The known-plaintext check above can fail: with --plaintext the pattern is there."""
    with local_cluster(tmp_path, REGISTRY, shufflers=1, sealed=False) as c:
        with ShufflerClient(c.shuffler_targets[0], c.token, sealing="off") as client:
            client.submit_many(_reports(c, A, 0, 30))
            client.flush()
            assert client.sealed == 0
        _wait_counts(c, A, {0: 30})
        assert PATTERN in _shuffler_bytes(c)


def test_refusals_and_drops_by_reason(cluster: LocalCluster) -> None:
    stub, md = _stub(cluster)
    key = PublicKeySet.from_json(cluster.public_keys_path.read_text()).keys[-1]
    fa, fb = _fp(cluster, A), _fp(cluster, B)

    def sealed(metric: str, fp: int, cohort: int = 8) -> bytes:
        return seal_report(
            key,
            metric=metric,
            window=_window(),
            bits=PATTERN,
            cohort=cohort,
            fingerprint=fp,
            report_id=os.urandom(16),
            report_bytes=16,
        ).sealed

    good = sealed(A, fa)
    # the shuffler can see these are wrong, and says why
    code, details = _submit_error(stub, md, pb.Report(metric=A, key_id=999, sealed=good))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith("stale_key")
    code, details = _submit_error(
        stub, md, pb.Report(metric=A, key_id=key.key_id, sealed=good[:-1])
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("sealed_length")
    code, details = _submit_error(
        stub, md, pb.Report(metric=A, key_id=key.key_id, sealed=good, cohort=3)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("mixed_sealed")
    code, details = _submit_error(
        stub,
        md,
        pb.Report(
            metric=A, cohort=1, bits=PATTERN, params_fingerprint=fa, report_id=os.urandom(16)
        ),
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("sealing_required")

    # these it cannot see: the aggregator drops them, by reason, and counts the rest
    tampered = bytearray(sealed(A, fa))
    tampered[40] ^= 0x01
    replayed = sealed(A, fa)  # sealed for metric A, sent as metric B
    wrong_fp = sealed(A, fb)  # opens, but encoded under B's params
    bad_cohort = sealed(A, fa, cohort=16)  # opens, cohort out of range
    rows = [pb.Report(metric=A, key_id=key.key_id, sealed=sealed(A, fa)) for _ in range(30)]
    rows += [pb.Report(metric=B, key_id=key.key_id, sealed=sealed(B, fb)) for _ in range(30)]
    rows += [
        pb.Report(metric=A, key_id=key.key_id, sealed=bytes(tampered)),
        pb.Report(metric=B, key_id=key.key_id, sealed=replayed),
        pb.Report(metric=A, key_id=key.key_id, sealed=wrong_fp),
        pb.Report(metric=A, key_id=key.key_id, sealed=bad_cohort),
    ]
    before = {
        (m, r): _dropped(cluster, m, r)
        for m in (A, B)
        for r in ("not_authentic", "fingerprint", "cohort_range")
    }
    for r in rows:
        r.window = _window()
    request = pb.SubmitRequest(reports=rows, protocol=PROTOCOL_VERSION)
    assert stub.Submit(request, metadata=md, timeout=10).accepted == 64
    assert _wait_counts(cluster, A, {8: 30})[8] == 30
    assert _wait_counts(cluster, B, {8: 30})[8] == 30
    deadline = time.monotonic() + 20
    want = {
        (A, "not_authentic"): 1,
        (B, "not_authentic"): 1,
        (A, "fingerprint"): 1,
        (A, "cohort_range"): 1,
    }
    while time.monotonic() < deadline:
        now = {k: _dropped(cluster, *k) - before[k] for k in want}
        if now == want:
            break
        time.sleep(0.1)
    assert now == want


def test_key_rotation_in_the_middle_of_a_stream_loses_nothing(cluster: LocalCluster) -> None:
    per_cohort = {4: 0, 5: 0, 6: 0, 7: 0}
    before = _per_cohort(cluster, A)
    client = ShufflerClient(cluster.shuffler_targets[1], cluster.token, sealing="required")
    old = client.config().keys.keys[-1].key_id
    for step in range(8):
        cohort = 4 + step % 4
        client.submit_many(_reports(cluster, A, cohort, 25))
        per_cohort[cohort] += 25
        client.flush()
        if step == 3:
            out = subprocess.run(
                [sys.executable, "-m", "crowdmix", "keys", "rotate",
                 "--file", str(cluster.keys_path), "--public", str(cluster.public_keys_path)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            time.sleep(1.3)  # the shufflers re-read the public file within a second
    client.close()
    assert client.refetches == 1  # the stale key was refused once, then resealed
    assert client.config().keys.keys[-1].key_id != old
    assert (client.sent, client.sealed, client.failed) == (200, 200, 0)
    want = {c: before[c] + n for c, n in per_cohort.items()}
    got = _wait_counts(cluster, A, want)
    assert {c: got[c] for c in per_cohort} == want
    assert _dropped(cluster, A, "unknown_key") == 0
    assert _dropped(cluster, A, "expired_key") == 0


def test_an_expired_key_is_refused_at_the_shuffler_and_dropped_at_the_aggregator(
    cluster: LocalCluster,
) -> None:
    keys_cli = [sys.executable, "-m", "crowdmix", "keys"]
    files = ["--file", str(cluster.keys_path), "--public", str(cluster.public_keys_path)]
    old = PublicKeySet.from_json(cluster.public_keys_path.read_text()).keys[-1]
    subprocess.run([*keys_cli, "rotate", *files], check=True, capture_output=True, timeout=60)
    subprocess.run(
        [*keys_cli, "retire", "--id", str(old.key_id), "--now", *files],
        check=True,
        capture_output=True,
        timeout=60,
    )
    value = seal_report(
        old,
        metric=A,
        window=_window(),
        bits=PATTERN,
        cohort=9,
        fingerprint=_fp(cluster, A),
        report_id=os.urandom(16),
        report_bytes=16,
    ).sealed
    stub, md = _stub(cluster)
    deadline = time.monotonic() + 10
    while True:  # the shuffler re-reads the public file within a second
        try:
            stub.Submit(
                pb.SubmitRequest(
                    reports=[
                        pb.Report(metric=A, key_id=old.key_id, sealed=value, window=_window())
                    ],
                    protocol=PROTOCOL_VERSION,
                ),
                metadata=md,
                timeout=10,
            )
        except grpc.RpcError as exc:
            assert isinstance(exc, grpc.Call)
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert exc.details().startswith("stale_key")
            break
        assert time.monotonic() < deadline, "the shuffler kept accepting an expired key"
        time.sleep(0.2)
    # a batch sealed to it that reaches the aggregator anyway is opened report by report
    before = _dropped(cluster, A, "expired_key")
    agg = crowdmix_pb2_grpc.AggregatorStub(grpc.insecure_channel(cluster.aggregator_target))
    batch = pb.Batch(
        batch_id=os.urandom(16),
        window=int(time.time() // 86400),
        reports=pb.ReportColumns(
            metric=A, count=3, key_ids=[old.key_id] * 3, sealed=value * 3, sealed_bytes=len(value)
        ),
    )
    reply = agg.Ingest(batch, timeout=10)
    assert (reply.applied, reply.duplicate) == (0, False)
    assert agg.Ingest(batch, timeout=10).duplicate  # the batch id was applied once
    assert _dropped(cluster, A, "expired_key") - before == 3


def test_the_shuffler_process_never_holds_a_private_key(cluster: LocalCluster) -> None:
    secrets = [k.private_key for k in load_keyset(cluster.keys_path).keys if k.private_key]
    assert secrets
    needles = [*secrets, *(base64.b64encode(s) for s in secrets)]
    agg = cluster.aggregator
    assert agg is not None and agg.proc is not None
    for s in cluster.shufflers:
        assert s.proc is not None
        pid = s.proc.pid
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert str(cluster.keys_path).encode() not in cmdline
        assert str(cluster.public_keys_path).encode() in cmdline
        assert b"keys.json" not in Path(f"/proc/{pid}/environ").read_bytes()
        assert "cryptography" not in Path(f"/proc/{pid}/maps").read_text()
        memory = _process_memory(pid)
        assert not any(n in memory for n in needles)
    # the same scan finds the key in the aggregator, which does hold it
    assert any(n in _process_memory(agg.proc.pid) for n in needles)
    assert not any(n in _shuffler_bytes(cluster) for n in needles)
    assert not any(n in cluster.registry_path.read_bytes() for n in needles)
