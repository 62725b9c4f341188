"""A dead opening worker is never fatal: the batch is opened in process, the pool restarts."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np

from crowdmix.aggregator.sealing.ingest import KeyFile, SealedBatch
from crowdmix.aggregator.sealing.keys import KeySet, save_keyset
from crowdmix.client.sealing import seal_many
from crowdmix.core.params import RapporParams
from crowdmix.core.registry import MetricConfig


def test_a_killed_worker_does_not_lose_the_batch(tmp_path: Path) -> None:
    now = int(time.time())
    keys, key = KeySet().with_new_key(now)
    save_keyset(tmp_path / "keys.json", keys, now=now, create=True)
    metric = MetricConfig(name="m", rappor=RapporParams(k=16, h=2, m=4))
    n = 600  # above the pool's threshold (2 × 256)
    rows = [(bytes([i % 256, 0]), i % 4, metric.fingerprint, os.urandom(16)) for i in range(n)]
    sealed = seal_many(key.public(), "m", 0, rows)
    batch = SealedBatch(
        batch_id=bytes(16),
        window=0,
        metric="m",
        count=n,
        key_ids=np.full(n, key.key_id, dtype=np.int64),
        sealed=b"".join(sealed),
        sealed_bytes=len(sealed[0]),
    )
    kf = KeyFile(tmp_path / "keys.json", workers=1)
    try:
        assert kf.open(batch, metric, now).opened == n  # the pool works
        pool = kf.opener._pool
        assert pool is not None
        for pid in list(pool._processes):  # type: ignore[attr-defined]
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        assert kf.open(batch, metric, now).opened == n  # opened in process
        assert kf.open(batch, metric, now).opened == n  # and by a fresh pool
    finally:
        kf.close()
