"""Real processes for the end-to-end tests, set up the same way in every test file.

- :func:`local_cluster`: a :class:`LocalCluster` (redis-servers, ``crowdmix shuffler
  serve``, ``crowdmix aggregator serve``) started from a registry's text, stopped on exit.
- :func:`stored_counts`: what the cluster's aggregator has counted for a metric;
  :func:`counted`: how many reports that is.
- :func:`aggregator_metric`: a sample of the aggregator's metrics endpoint.
- :func:`kill_at`: SIGKILL a child process once it has written its marker file.
"""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from crowdmix.aggregator.store.base import StoredCounts
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.cluster import LocalCluster

__all__ = ["aggregator_metric", "counted", "kill_at", "local_cluster", "stored_counts"]


@contextmanager
def local_cluster(work: Path, registry: str, **options: Any) -> Iterator[LocalCluster]:
    """A started cluster in ``work`` whose metric registry is ``registry`` (TOML text);
    ``options`` go to :class:`LocalCluster` (``shufflers``, ``sealed``, ...)."""
    reg = work / "registry.toml"
    reg.write_text(registry)
    c = LocalCluster(work / "cluster", registry_path=reg, **options)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def stored_counts(cluster: LocalCluster, metric: str) -> StoredCounts | None:
    """The aggregator's counts of ``metric`` in its Redis (None: nothing counted yet)."""
    store = RedisCountStore.from_url(cluster.aggregator_redis_url)
    try:
        return store.load(metric)
    finally:
        store.close()


def counted(cluster: LocalCluster, metric: str) -> int:
    """Reports of ``metric`` the cluster's aggregator has counted (0 before the first)."""
    got = stored_counts(cluster, metric)
    return 0 if got is None else int(got.totals.sum())


def aggregator_metric(cluster: LocalCluster, name: str, **labels: str) -> float:
    """The sample ``name{labels}`` (labels in the order the aggregator prints them) of the
    aggregator's metrics endpoint, started with ``--metrics-port``; 0 while absent."""
    args = cluster.aggregator.args if cluster.aggregator else []
    port = args[args.index("--metrics-port") + 1]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    sample = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    m = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def kill_at(proc: subprocess.Popen[str], marker: Path) -> None:
    """Wait (60 s at most) until ``proc`` has written ``marker``, then SIGKILL it."""
    deadline = time.monotonic() + 60
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the device exited before {marker.name}: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the device never reached {marker.name}")
        time.sleep(0.02)
    proc.kill()  # SIGKILL
    proc.wait(timeout=30)
