"""Shared test material: a small registry, report generators, a recording aggregator, a
shuffler served with a stub on it, and an aggregator key written as the daemons read it."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import numpy.typing as npt

from crowdmix.core.registry import Registry, parse_registry
from crowdmix.core.sealed import PROTOCOL_VERSION
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.columns import Chunk
from crowdmix.shuffler.serde import batch_from_proto
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from crowdmix.shuffler.store import InFlightBatch, ShufflerStore

if TYPE_CHECKING:
    from crowdmix.aggregator.sealing.keys import KeySet

RAPPOR = "home_page"  # k=16 (2 bytes), m=8 cohorts
OUE = "browser"  # oue over 5 values: 1 byte, bits 5..7 are padding


def make_registry(
    *,
    min_batch: int = 10,
    max_batch: int = 100,
    max_delay: float = 0.05,
    drop: float = 0.0,
    disposal_days: float = 30.0,
) -> Registry:
    shuffle = {
        "min_batch": min_batch,
        "max_batch": max_batch,
        "max_delay_seconds": max_delay,
        "drop_probability": drop,
        "disposal_days": disposal_days,
    }
    return parse_registry(
        {
            "metrics": {
                RAPPOR: {
                    "encoding": "rappor",
                    "k": 16,
                    "h": 2,
                    "m": 8,
                    "f": 0.5,
                    "p": 0.5,
                    "q": 0.75,
                    "shuffle": shuffle,
                },
                OUE: {
                    "encoding": "oue",
                    "epsilon": 1.0,
                    "domain": ["a", "b", "c", "d", "e"],
                    "shuffle": shuffle,
                },
            }
        }
    )


REGISTRY_TOML = """
[metrics.home_page]
encoding = "rappor"
k = 16
h = 2
m = 8
f = 0.5
p = 0.5
q = 0.75

[metrics.home_page.shuffle]
min_batch = {min_batch}
max_batch = {max_batch}
max_delay_seconds = {max_delay}
"""


def current_window(window_seconds: int = 86400, now: float | None = None) -> int:
    """The collection window of ``now`` (default: this moment) for a registry's length."""
    return int((time.time() if now is None else now) // window_seconds)


def submit_request(
    *,
    reports: Iterable[pb.Report] = (),
    columns: Iterable[pb.ReportColumns] = (),
    window: int | None = None,
    protocol: int = PROTOCOL_VERSION,
) -> pb.SubmitRequest:
    """A SubmitRequest as an SDK sends it: the protocol set, every report and column
    naming ``window`` (default: the current one of a day-long window) unless it names
    one already, and a fresh report id for every clear report that has none."""
    w = current_window() if window is None else window
    request = pb.SubmitRequest(reports=list(reports), columns=list(columns), protocol=protocol)
    for r in request.reports:
        r.window = r.window or w
        if not r.report_id and not (r.sealed or r.key_id):
            r.report_id = os.urandom(16)
    for c in request.columns:
        c.window = c.window or w
        if not c.report_ids and not (c.sealed or c.key_ids) and c.count:
            c.report_ids = os.urandom(16 * c.count)
    return request


def write_keys(
    directory: Path, now: int | None = None, *, valid_from: int | None = None
) -> tuple[KeySet, Path, Path]:
    """A new aggregator key, valid from ``valid_from`` (default ``now``, default this
    second): the key set saved as ``directory/keys.json`` at ``now`` and what a shuffler
    publishes of it as ``directory/public.json``. Returns the key set and both paths."""
    from crowdmix.aggregator.sealing.keys import KeySet, save_keyset, write_public_config

    now = int(time.time()) if now is None else now
    keys, _ = KeySet().with_new_key(now if valid_from is None else valid_from)
    private, public = directory / "keys.json", directory / "public.json"
    save_keyset(private, keys, now=now, create=True)
    write_public_config(public, keys, now=now)
    return keys, private, public


@contextlib.contextmanager
def serving(
    registry: Registry,
    store: ShufflerStore | None = None,
    aggregator: str | None = None,
    *,
    grace: float = 1,
    **options: Any,
) -> Iterator[tuple[ShufflerHandle, crowdmix_pb2_grpc.ShufflerStub]]:
    """A shuffler on 127.0.0.1:0 (``start_shuffler(registry, store, aggregator, **options)``)
    and a stub on one channel to it; the shuffler is stopped with ``grace`` on leaving,
    so what a test reads of the handle after the block is what the stop left."""
    handle = start_shuffler(registry, store, aggregator, **options)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{handle.port}") as channel:
            yield handle, crowdmix_pb2_grpc.ShufflerStub(channel)
    finally:
        handle.stop(grace=grace)


def unique_chunk(n: int, start: int = 0, *, num_cohorts: int = 8) -> Chunk:
    """n RAPPOR (k=16) reports whose (cohort, bits) pairs are all distinct: report i
    carries i in its 16 bits and i % num_cohorts as cohort (n ≤ 65536 - start)."""
    ids = np.arange(start, start + n, dtype=np.uint32)
    return Chunk(
        report_bytes=2,
        cohorts=(ids % num_cohorts).astype(np.uint32),
        bits=ids.astype("<u2").tobytes(),
    )


def report_ids(chunk: Chunk) -> npt.NDArray[np.int64]:
    """The ids of ``unique_chunk`` reports (checking cohorts agree)."""
    ids = np.frombuffer(chunk.bits, dtype="<u2").astype(np.int64)
    return ids


def as_multiset(chunk: Chunk) -> Counter[tuple[int, bytes]]:
    m = chunk.bit_matrix()
    return Counter((int(c), m[i].tobytes()) for i, c in enumerate(chunk.cohorts))


class RecordingAggregator(crowdmix_pb2_grpc.AggregatorServicer):  # type: ignore[misc]
    """A real gRPC Aggregator on 127.0.0.1:0 that records batches (deduped by id).

    ``fail_next`` makes the next N Ingest calls answer UNAVAILABLE.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: dict[bytes, InFlightBatch] = {}
        self.calls = 0
        self.fail_next = 0
        self.refuse: set[str] = set()  # metrics answered INVALID_ARGUMENT
        self.refused = 0
        self.server = grpc.server(ThreadPoolExecutor(max_workers=8))
        crowdmix_pb2_grpc.add_AggregatorServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def Ingest(self, request: pb.Batch, context: Any) -> pb.IngestResponse:
        with self.lock:
            self.calls += 1
            if self.fail_next > 0:
                self.fail_next -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "test: down")
            batch = batch_from_proto(request)
            if batch.metric in self.refuse:
                self.refused += 1
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "test: refused")
            dup = batch.batch_id in self.batches
            self.batches[batch.batch_id] = batch
        return pb.IngestResponse(applied=0 if dup else batch.chunk.count, duplicate=dup)

    def all_reports(self) -> list[InFlightBatch]:
        with self.lock:
            return list(self.batches.values())

    def total(self) -> int:
        with self.lock:
            return sum(b.chunk.count for b in self.batches.values())

    def stop(self) -> None:
        self.server.stop(0).wait()
