"""Shared helpers for the aggregator service tests: a registry, random batches, direct counts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.counting.counts import Counts
from crowdmix.aggregator.daemon.ingest import IngestBatch
from crowdmix.core.registry import MetricConfig, Registry, load_registry

# k=20 is not a multiple of 8, so padding bits exist and must be checked.
REGISTRY_TOML = """
[metrics.pages]
encoding = "rappor"
k = 20
h = 2
m = 8
f = 0.5
p = 0.5
q = 0.75

[metrics.pages.shuffle]
min_batch = 10
max_batch = 5000
max_delay_seconds = 0.2

[metrics.browser]
encoding = "krr"
epsilon = 2.0
domain = ["chrome", "firefox", "safari", "edge", "other"]
"""


def write_registry(directory: Path, text: str = REGISTRY_TOML) -> tuple[Path, Registry]:
    path = directory / "metrics.toml"
    path.write_text(text)
    return path, load_registry(path)


def now_window(registry: Registry) -> int:
    return registry.window_of(time.time())


def random_payload(rng: np.random.Generator, config: MetricConfig, n: int) -> np.ndarray:
    """n valid report payloads (n, report_bytes) uint8 for the metric."""
    if config.rappor is not None:
        k = config.rappor.k
        bits = rng.integers(0, 2, size=(n, 8 * config.report_bytes), dtype=np.uint8)
        bits[:, k:] = 0  # padding bits stay zero
        return np.packbits(bits, axis=1, bitorder="little")
    assert config.basic is not None
    d = config.basic.domain_size
    idx = rng.integers(0, d, size=n).astype(f"<u{config.report_bytes}")
    return idx.view(np.uint8).reshape(n, config.report_bytes)


def random_batch(
    rng: np.random.Generator,
    config: MetricConfig,
    n: int,
    window: int,
    batch_id: bytes | None = None,
) -> IngestBatch:
    """n valid reports of one window, each with a fresh report id."""
    return IngestBatch(
        batch_id=batch_id if batch_id is not None else os.urandom(16),
        window=window,
        metric=config.name,
        fingerprint=config.fingerprint,
        count=n,
        report_bytes=config.report_bytes,
        cohorts=rng.integers(0, config.num_cohorts, size=n).astype(np.int64),
        bits=random_payload(rng, config, n).tobytes(),
        report_ids=os.urandom(16 * n),
    )


def direct_count(config: MetricConfig, batches: list[IngestBatch]) -> Counts:
    """The counts of these batches, counted naively (one report at a time) as the oracle."""
    acc = accumulator_for(config)
    totals = np.zeros_like(acc.totals)
    ones = np.zeros_like(acc.ones)
    for b in batches:
        rows = np.frombuffer(b.bits, dtype=np.uint8).reshape(b.count, b.report_bytes)
        for c, row in zip(b.cohorts.tolist(), rows, strict=True):
            totals[c] += 1
            if config.rappor is not None:
                value = int.from_bytes(row.tobytes(), "little")
                for i in range(config.rappor.k):
                    ones[c, i] += (value >> i) & 1
            else:
                ones[0, int.from_bytes(row.tobytes(), "little")] += 1
    return accumulator_for(config, totals=totals, ones=ones)
