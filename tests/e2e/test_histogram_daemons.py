"""Shuffled histograms through the real daemons: `crowdmix shuffler serve`
and `crowdmix aggregator serve` processes, each on a redis-server this test starts,
sealed reports over real gRPC.

- Counts per bucket equal what the devices sent (real and fake alike), exactly:
  the devices' coins are seeded, so the test knows every report.
- A clear report of the metric is refused INVALID_ARGUMENT ``histogram_unsealed``;
  a call with more than 1 + m of its reports INVALID_ARGUMENT ``too_many_messages``.
- (A shuffler without public keys, or an aggregator without a key set, refuses to
  start: rows of tests/e2e/test_bad_input.py.)
- The report job decodes the live counts and states both figures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from crowdmix.client.histogram import HistogramEncoder
from crowdmix.client.sealing import seal_report
from crowdmix.client.transport import ShufflerClient
from crowdmix.cluster import LocalCluster
from crowdmix.core.registry import load_registry
from crowdmix.core.sealed import PROTOCOL_VERSION, PublicKeySet
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from tests.client.bitsources import SeededBits
from tests.daemons import local_cluster, stored_counts
from tests.waiting import eventually

METRIC = "screens"
D = 12
REGISTRY = f"""
[metrics.{METRIC}]
encoding = "shuffled-histogram"
domain_size = {D}
fake_slots = 3
fake_probability = 0.5
local_epsilon = 4.0
[metrics.{METRIC}.shuffle]
min_batch = 1
max_delay_seconds = 0.2
# this test checks counting through the subprocess daemons, not the window release
# (tests/e2e/test_histogram_window.py): batches by max_batch arrive within the test
release = "max_batch"
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("histogram"), REGISTRY, shufflers=1) as c:
        yield c


def _aggregator_counts(cluster: LocalCluster) -> np.ndarray:
    got = stored_counts(cluster, METRIC)
    return np.zeros(D, dtype=np.int64) if got is None else np.asarray(got.ones[0])


def _submit_error(cluster: LocalCluster, *reports: pb.Report) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(cluster.shuffler_targets[0]) as channel:
        stub = crowdmix_pb2_grpc.ShufflerStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Submit(
                pb.SubmitRequest(reports=list(reports), protocol=PROTOCOL_VERSION),
                metadata=(("authorization", f"Bearer {cluster.token}"),),
                timeout=10,
            )
    err = info.value
    assert isinstance(err, grpc.Call)
    return err.code(), err.details() or ""


def test_counts_per_bucket_equal_what_the_devices_sent(cluster: LocalCluster) -> None:
    metric = load_registry(cluster.registry_path)[METRIC]
    assert metric.histogram is not None
    devices = 300
    rng = np.random.default_rng(3)
    values = rng.integers(0, D, size=devices).tolist()
    encoder = HistogramEncoder(metric.histogram, metric=METRIC, rand=SeededBits(11))
    device_reports = [encoder.encode(v) for v in values]
    sent = np.zeros(D, dtype=np.int64)
    for reports in device_reports:
        assert 1 <= len(reports) <= metric.histogram.max_messages
        for r in reports:
            sent[int.from_bytes(r.bits, "little")] += 1
    total = int(sent.sum())
    with ShufflerClient(
        cluster.shuffler_targets[0],
        cluster.token,
        sealing="required",
        batch_size=64,  # the SDK splits it: at most 1 + m of the metric per call
    ) as sender:
        for reports in device_reports:
            sender.submit_many(reports)
        assert sender.flush() == total
        assert sender.sealed == total
    eventually(lambda: int(_aggregator_counts(cluster).sum()) >= total, 60, 0.1)
    assert _aggregator_counts(cluster).tolist() == sent.tolist()

    # the report job on the live counts: the histogram and both figures
    out = cluster.workdir / "report"
    run = subprocess.run(
        [
            sys.executable, "-m", "crowdmix", "report",
            "--redis", cluster.aggregator_redis_url, "--config", str(cluster.registry_path),
            "--metric", METRIC, "--out", str(out), "--no-plot",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode in (0, 1), run.stderr  # 1: nothing significant is allowed
    assert "Traceback" not in run.stderr
    assert "shuffled histogram" in run.stdout
    assert "Shuffler + aggregator colluding: 4.000-LDP" in run.stdout
    assert (out / "results.csv").read_text().count("\n") == D + 1


def test_crowdmix_simulate_sends_each_clients_reports_within_the_cap(
    cluster: LocalCluster,
) -> None:
    before = int(_aggregator_counts(cluster).sum())
    run = subprocess.run(
        [
            sys.executable, "-m", "crowdmix", "simulate",
            "--target", cluster.shuffler_targets[0], "--config", str(cluster.registry_path),
            "--metric", METRIC, "--token-file", str(cluster.tokens_path), "--clients", "200",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    line = run.stdout.strip().splitlines()[-1]
    reports = int(line.split("(")[1].split(" reports")[0])
    assert 200 <= reports <= 200 * 4 and f"{reports} acknowledged, 0 failed" in line
    assert eventually(lambda: int(_aggregator_counts(cluster).sum()) >= before + reports, 60, 0.1)


def test_unsealed_and_over_the_cap_calls_are_refused_with_a_reason(
    cluster: LocalCluster,
) -> None:
    metric = load_registry(cluster.registry_path)[METRIC]
    assert metric.histogram is not None
    window = load_registry(cluster.registry_path).window_of(time.time())
    clear = pb.Report(
        metric=METRIC, cohort=0, bits=b"\x03", params_fingerprint=metric.fingerprint,
        report_id=os.urandom(16), window=window,
    )  # fmt: skip
    code, details = _submit_error(cluster, clear)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("histogram_unsealed"), details

    key = PublicKeySet.from_json(cluster.public_keys_path.read_text()).keys[-1]

    def sealed() -> pb.Report:
        value = seal_report(
            key, metric=METRIC, window=window, bits=b"\x01", cohort=0,
            fingerprint=metric.fingerprint, report_id=os.urandom(16), report_bytes=1,
        ).sealed  # fmt: skip
        return pb.Report(metric=METRIC, key_id=key.key_id, sealed=value, window=window)

    cap = metric.histogram.max_messages
    code, details = _submit_error(cluster, *(sealed() for _ in range(cap + 1)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("too_many_messages"), details
    assert f"at most {cap}" in details
