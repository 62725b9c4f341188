"""Shuffler → the real aggregator service (crowdmix.aggregator.daemon.server), both in-process on
loopback with memory stores, the way `crowdmix demo` runs them."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np

from crowdmix.aggregator.counting.counts import CohortCounts
from crowdmix.aggregator.daemon.server import start_aggregator
from crowdmix.aggregator.store.memory import MemoryCountStore
from crowdmix.shuffler.aggregator_client import AggregatorSender
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.store import PendingWrite, QueueKey
from tests.shuffler.helpers import RAPPOR, make_registry, serving
from tests.shuffler.test_pipeline import columns_request, ids_chunk, wait_for


def test_reports_are_counted_exactly_once_by_the_aggregator() -> None:
    registry = make_registry(min_batch=500, max_batch=2000, max_delay=0.05)
    fp = registry[RAPPOR].fingerprint
    counts_store = MemoryCountStore()
    aggregator = start_aggregator(registry, counts_store)
    store = MemoryStore()
    # a batch a crashed shuffler had delivered but not yet deleted: re-sent at start-up
    window = registry.window_of(time.time())
    key = QueueKey(window=window, fingerprint=fp)
    store.append([PendingWrite.of(RAPPOR, key, ids_chunk(np.arange(20_000, 21_000)))])
    early = store.take(RAPPOR, key, min_batch=500, max_batch=1000, batch_id=os.urandom(16))
    assert early is not None
    sender = AggregatorSender(f"127.0.0.1:{aggregator.port}")
    sender(early)
    sender.close()

    n = 10_000
    ids = np.arange(n, dtype=np.int64)

    def counted() -> int:
        stored = counts_store.load(RAPPOR)
        return 0 if stored is None else int(stored.totals.sum())

    settings, target = ShufflerSettings(tick_seconds=0.01), f"127.0.0.1:{aggregator.port}"
    try:
        with serving(registry, store, target, grace=5, settings=settings) as (_, stub):
            for i in range(0, n, 1000):
                stub.Submit(columns_request(ids[i : i + 1000], fp), timeout=10)
            wait_for(lambda: counted() == n + 1000)
            wait_for(lambda: store.inflight_ids(RAPPOR) == [])
    finally:
        aggregator.stop()
    expected = CohortCounts.create(num_cohorts=8, nbits=16)
    everything = ids_chunk(np.concatenate([ids, np.arange(20_000, 21_000)]))
    expected.add(everything.cohorts.astype(np.int64), everything.bit_matrix())
    stored = counts_store.load(RAPPOR)
    assert stored is not None
    assert np.array_equal(stored.totals, expected.totals)
    assert np.array_equal(stored.ones, expected.ones)
    assert counts_store.windows(RAPPOR) == [window]


def test_mtls_to_the_aggregator(tmp_path: Path) -> None:
    """Shuffler → aggregator over mutual TLS, with deploy/tls/make-certs.sh's material."""
    from crowdmix.aggregator.daemon.server import TlsFiles

    script = Path(__file__).resolve().parents[2] / "deploy" / "tls" / "make-certs.sh"
    subprocess.run(["bash", str(script), str(tmp_path)], check=True, capture_output=True)
    read = lambda name: (tmp_path / name).read_bytes()  # noqa: E731
    registry = make_registry(min_batch=10, max_batch=100, max_delay=0.01)
    fp = registry[RAPPOR].fingerprint
    counts_store = MemoryCountStore()
    aggregator = start_aggregator(
        registry,
        counts_store,
        tls=TlsFiles(
            cert=read("aggregator.crt"), key=read("aggregator.key"), client_ca=read("ca.crt")
        ),
    )
    settings = ShufflerSettings(
        tick_seconds=0.01,
        aggregator_ca=str(tmp_path / "ca.crt"),
        aggregator_cert=str(tmp_path / "shuffler-client.crt"),
        aggregator_key=str(tmp_path / "shuffler-client.key"),
    )
    target = f"localhost:{aggregator.port}"
    try:
        with serving(registry, MemoryStore(), target, grace=2, settings=settings) as (_, stub):
            stub.Submit(columns_request(np.arange(50, dtype=np.int64), fp), timeout=10)
            wait_for(
                lambda: (s := counts_store.load(RAPPOR)) is not None and int(s.totals.sum()) == 50
            )
    finally:
        aggregator.stop()
