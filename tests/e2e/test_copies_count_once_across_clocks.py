"""Two real shufflers whose clocks differ by most of a window: copies count once per sender.

``crowdmix shuffler serve`` twice, under Debian's ``faketime`` (libfaketime shifts the
process's wall clock: one 25 minutes behind, one 25 minutes ahead, 50 of a 60-minute
window apart), one ``crowdmix aggregator serve``, real Redis. Each sender learns the
server time from one shuffler, names its reports' window from it, seals each report
to the aggregator's key for that window, and sends a copy of every report to both
shufflers. Each report counts exactly once, in the window its sender named.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest

from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.client.sealing import seal_report
from crowdmix.cluster import DaemonProcess, LocalCluster
from crowdmix.core.registry import load_registry
from crowdmix.core.sealed import PublicKeySet
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from tests.daemons import local_cluster
from tests.shuffler.helpers import submit_request

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
WS = 3600
SHIFTS = (-1500, +1500)  # each shuffler's clock minus the true time, in seconds
SENDERS, REPORTS = 4, 25
METRIC = "pages"
REGISTRY = f"""
[collection]
window_seconds = {WS}

[metrics.{METRIC}]
encoding = "rappor"
k = 16
h = 2
m = 8
f = 0.5
p = 0.5
q = 0.75

[metrics.{METRIC}.shuffle]
min_batch = 1  # every report leaves: the test counts them all
max_batch = 1000
max_delay_seconds = 0.2
"""

pytestmark = pytest.mark.skipif(
    shutil.which("faketime") is None or not os.path.exists(LIBFAKETIME),
    reason="Debian's faketime is not installed (apt-get install faketime; scripts/bootstrap "
    "installs it): it shifts the shufflers' clocks",
)


def _shift_clocks(cluster: LocalCluster) -> None:
    """Start each shuffler again under libfaketime, on the same port and store."""
    for i, shift in enumerate(SHIFTS):
        old = cluster.shufflers[i]
        old.stop()
        env = {
            "LD_PRELOAD": LIBFAKETIME,
            "FAKETIME": f"{shift:+d}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # timeouts and gRPC keep the real pace
        }
        new = DaemonProcess(old.name, old.args, old.port, old.log_path, env=env)
        new.start()
        new.wait_healthy()
        cluster.shufflers[i] = new


def test_copies_sent_to_shufflers_a_most_of_a_window_apart_count_once(tmp_path: Path) -> None:
    rng = np.random.default_rng(41)
    with local_cluster(tmp_path, REGISTRY, shufflers=2, sealed=True) as cluster:
        _shift_clocks(cluster)
        registry = load_registry(cluster.registry_path)
        fingerprint = registry[METRIC].fingerprint
        key = PublicKeySet.from_json(cluster.public_keys_path.read_text()).keys[-1]
        md = (("authorization", f"Bearer {cluster.token}"),)
        channels = [grpc.insecure_channel(t) for t in cluster.shuffler_targets]
        stubs = [crowdmix_pb2_grpc.ShufflerStub(c) for c in channels]
        named: list[int] = []
        refused: list[str] = []
        try:
            # the shufflers' clocks really differ (GetConfig's server_time)
            times = [s.GetConfig(pb.GetConfigRequest(), metadata=md).server_time for s in stubs]
            assert 2900 < times[1] - times[0] < 3100, times
            for s in range(SENDERS):
                learned = stubs[s % 2].GetConfig(pb.GetConfigRequest(), metadata=md, timeout=10)
                # the server's time, as the SDK takes it (then run on its monotonic clock)
                window = int(learned.server_time // learned.window_seconds)
                named.append(window)
                for _ in range(REPORTS):
                    bits, rid = rng.bytes(2), os.urandom(16)
                    taken = 0
                    for stub in stubs:  # a copy to each, each sealed afresh
                        sealed = seal_report(
                            key, metric=METRIC, window=window, bits=bits, cohort=s,
                            fingerprint=fingerprint, report_id=rid, report_bytes=2,
                        ).sealed  # fmt: skip
                        one = pb.Report(
                            metric=METRIC, key_id=key.key_id, sealed=sealed, window=window
                        )
                        try:
                            stub.Submit(submit_request(reports=[one]), metadata=md, timeout=10)
                            taken += 1
                        except grpc.RpcError as exc:
                            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
                            refused.append(exc.details().partition(":")[0])
                    assert taken >= 1  # the shuffler it learned the time from takes it
        finally:
            for c in channels:
                c.close()
        # the shufflers flush and forward what they hold (their final pass waits for acks)
        codes = [sh.stop() for sh in cluster.shufflers]
        assert codes == [0, 0], [sh.tail_log() for sh in cluster.shufflers]
        assert set(refused) <= {"window_ahead", "window_closed"}, refused
        store = RedisCountStore.from_url(cluster.aggregator_redis_url)
        try:
            for s, window in enumerate(named):
                counts = store.load(METRIC, [window])
                assert counts is not None
                assert int(counts.totals[s]) == REPORTS, (s, window, counts.totals)
            total = store.load(METRIC)
            assert total is not None and int(total.totals.sum()) == SENDERS * REPORTS
        finally:
            store.close()
