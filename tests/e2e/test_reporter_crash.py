"""A report claimed is a report delivered, exactly once, whenever the app is killed.

Real processes throughout: Redis (AOF), a ``crowdmix shuffler serve`` process that
publishes the aggregator's public key, ``crowdmix aggregator serve``; every device
is a separate Python process using ``client.Reporter`` (sealed, the default). Each
device is SIGKILLed by this test at one point of a report's life — the child
writes a marker file when it reaches the point and waits; the test sees the file
and kills it (no timing) — then restarted once with the same app directory, and
flushed. Per device and per report id, the aggregator's counts must show every
claimed report exactly once and nothing of a report whose claim never committed.

The kill points:

- ``in_claim``: the claim and the report are written, the transaction is not
  committed: after the restart neither exists, and a new report is made;
- ``after_claim``: committed, nothing sent yet;
- ``before_send``: the request is built, it has not left;
- ``in_flight``: the request was started and not answered (the shuffler may or
  may not have stored it: either way it is counted once);
- ``after_ack``: the shuffler acknowledged it, the outbox has not deleted it: the
  restarted device sends it again with the same id and the aggregator drops the
  repeat (its duplicate counter shows it).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.cluster import LocalCluster, free_port
from tests.daemons import aggregator_metric, kill_at, local_cluster
from tests.waiting import eventually

pytestmark = pytest.mark.slow  # real processes or servers, seconds each

METRIC = "night_mode"
REGISTRY = f"""
[metrics.{METRIC}]
encoding = "binary-rr"
epsilon = 1.0
domain_size = 2
[metrics.{METRIC}.shuffle]
min_batch = 1
max_delay_seconds = 0.1
"""

# The child: one device. argv: app_dir target token kill_point ("" for none).
CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from crowdmix import client
    from crowdmix.client import outbox as outbox_mod, reporter as reporter_mod

    app_dir, target, token, point = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]

    def stop_here(name):
        if name == point:
            (app_dir / f"at-{name}").write_text("")
            time.sleep(600)  # the test SIGKILLs us now

    orig_tx = outbox_mod.Outbox._tx
    def tx(self, body):
        def wrapped(db):
            result = body(db)
            if result is outbox_mod.Claim.MADE:
                stop_here("in_claim")  # written, not committed
            return result
        return orig_tx(self, wrapped)
    outbox_mod.Outbox._tx = tx

    orig_submit = reporter_mod.Reporter._submit
    def submit(self, request, timeout):
        stop_here("before_send")
        if point == "in_flight":
            link = self._get_link()
            link._stub.Submit.future(request, metadata=link._metadata, timeout=timeout)
            stop_here("in_flight")
        accepted = orig_submit(self, request, timeout)
        stop_here("after_ack")
        return accepted
    reporter_mod.Reporter._submit = submit

    r = client.Reporter(app_dir, target, token=token, tls=False, background=False)
    r.flush(timeout=20)  # the config (report() never waits for the network), and what waits
    made = r.report("night_mode", 1)
    stop_here("after_claim")
    left = r.flush(timeout=20)
    print(f"made={bool(made)} left={left} counters={r.counters()}")
    r.close()
    """
)
POINTS = ["in_claim", "after_claim", "before_send", "in_flight", "after_ack"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    work = tmp_path_factory.mktemp("reporter-crash")
    metrics = ["--metrics-port", str(free_port())]
    with local_cluster(work, REGISTRY, shufflers=1, extra_aggregator_args=metrics) as c:
        yield c


def _device(cluster: LocalCluster, app_dir: Path, point: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHILD,
            str(app_dir),
            cluster.shuffler_targets[0],
            cluster.token,
            point,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _rows(app_dir: Path) -> tuple[list[bytes], int | None]:
    """The outbox's report ids and the claimed window, read as the restart will."""
    db = sqlite3.connect(app_dir / "outbox.sqlite3")
    try:
        ids = [bytes(r[0]) for r in db.execute("SELECT report_id FROM outbox")]
        claim = db.execute("SELECT window FROM claims WHERE metric = ?", (METRIC,)).fetchone()
    finally:
        db.close()
    return ids, None if claim is None else int(claim[0])


def _counted(cluster: LocalCluster) -> tuple[int, list[bytes]]:
    """Reports counted (all windows) and the report ids the aggregator recorded."""
    store = RedisCountStore.from_url(cluster.aggregator_redis_url)
    try:
        got = store.load(METRIC)
        total = 0 if got is None else int(sum(int(x) for x in got.totals))
        windows = store.windows(METRIC)
    finally:
        store.close()
    r = redis.Redis.from_url(cluster.aggregator_redis_url)
    ids: list[bytes] = []
    for w in windows:
        for key in r.scan_iter(match=f"*:{{{METRIC}}}:w:{w}:rids"):
            for blob in r.lrange(key, 0, -1):
                raw = bytes(blob)
                ids += [raw[i : i + 16] for i in range(0, len(raw), 16)]
    r.close()
    return total, ids


def test_sigkill_at_every_point_loses_nothing_and_counts_nothing_twice(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    before_ids: dict[str, list[bytes]] = {}
    for point in [*POINTS, "in_claim_no_restart"]:
        app = tmp_path / point
        proc = _device(cluster, app, point.removesuffix("_no_restart"))
        kill_at(proc, app / f"at-{point.removesuffix('_no_restart')}")
        ids, claim = _rows(app)
        if point.startswith("in_claim"):
            assert (ids, claim) == ([], None), point  # the uncommitted claim left nothing
        else:
            assert len(ids) == 1 and claim is not None, point
        before_ids[point] = ids

    outputs = {}
    for point in POINTS:  # restart every device but the one that stays dead
        proc = _device(cluster, tmp_path / point, "")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs[point] = out
        # in_claim made nothing before its kill: the restart makes the window's report;
        # the others have one waiting, so the restart makes none (it sends the old one)
        assert f"made={point == 'in_claim'} left=0" in out, (point, out, err)
        after, claim = _rows(tmp_path / point)
        assert after == [] and claim is not None, point

    expected = len(POINTS)  # one report per restarted device; none of the dead one
    eventually(lambda: _counted(cluster)[0] >= expected, 60, 0.1)
    time.sleep(1.0)  # a late duplicate would have arrived by now (max_delay 0.1 s)
    total, ids = _counted(cluster)
    assert total == expected, outputs
    assert len(ids) == len(set(ids)) == expected
    for point in POINTS[1:]:
        assert before_ids[point][0] in ids, point  # delivered with the id it was claimed with
    # after_ack's report reached the aggregator twice; the repeat was dropped by its id
    name = "crowdmix_aggregator_duplicate_reports_total"
    assert 1 <= aggregator_metric(cluster, name, metric=METRIC) <= 2
