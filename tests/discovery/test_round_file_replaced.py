"""A heavy-hitters batch counted, then re-sent after the round file was replaced, is a
duplicate: acknowledged, counted once, never refused as ``round``.

A shuffler re-sends a batch whose acknowledgement it lost; meanwhile the round job (or an
operator) replaced the round file, so the batch's window serves no round, or another. The
batch id was applied, so the answer must be "duplicate" (the shuffler then deletes it);
refusing it as ``round`` would park a batch that was counted at the shuffler for ever.
A new batch of that window is still refused as ``round``. Real components: the aggregator
on real gRPC at 127.0.0.1:0, its counts in a real redis-server.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from crowdmix.aggregator.daemon.ingest import IngestBatch
from crowdmix.aggregator.daemon.server import start_aggregator
from crowdmix.aggregator.daemon.service import batch_to_proto
from crowdmix.aggregator.store import open_store
from crowdmix.core.discovery import REPORT_BYTES
from crowdmix.core.rounds import RoundBook, write_rounds
from crowdmix.protos import crowdmix_pb2_grpc
from tests.discovery.test_round_config import HOUR, W, _file, _prefix, _registry


def _batch(batch_id: bytes, fingerprint: int, indexes: list[int]) -> IngestBatch:
    return IngestBatch(
        batch_id=batch_id,
        window=W,
        metric="words",
        fingerprint=fingerprint,
        count=len(indexes),
        report_bytes=REPORT_BYTES,
        cohorts=np.zeros(len(indexes), dtype=np.int64),
        bits=b"".join(i.to_bytes(REPORT_BYTES, "little") for i in indexes),
        report_ids=b"".join(batch_id[:8] + bytes([k + 1]) * 8 for k in range(len(indexes))),
    )


@pytest.mark.parametrize("replaced_by", ["another discovery", "no round"])
def test_a_counted_batch_resent_after_the_round_file_changed_is_a_duplicate(
    tmp_path: Path, redis_url: str, replaced_by: str
) -> None:
    registry = _registry()
    metric = registry["words"]
    rounds = _file(tmp_path, registry, _prefix(W))
    fingerprint = _prefix(W).fingerprint(metric.fingerprint)
    store = open_store(redis_url)
    clock = lambda: W * HOUR + HOUR / 2  # noqa: E731
    server = start_aggregator(
        registry, store, listen="127.0.0.1:0", clock=clock, rounds_file=str(rounds)
    )
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = crowdmix_pb2_grpc.AggregatorStub(channel)
            first = _batch(b"A" * 16, fingerprint, [3, 5, 5, 7])
            answer = stub.Ingest(batch_to_proto(first))
            assert (answer.applied, answer.duplicate) == (4, False)
            # the file is replaced: window W now serves another round, or none
            book = RoundBook()
            if replaced_by == "another discovery":
                book = book.with_round("words", metric.fingerprint, _prefix(W + 1))
            write_rounds(rounds, book)
            resent = stub.Ingest(batch_to_proto(first))
            assert (resent.applied, resent.duplicate) == (0, True)
            with pytest.raises(grpc.RpcError) as refused:  # a new batch of it is not counted
                stub.Ingest(batch_to_proto(_batch(b"B" * 16, fingerprint, [1, 2])))
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "round" in (refused.value.details() or "")
        stored = store.load("words", [W])
        assert stored is not None and stored.num_reports == 4  # counted once
        assert store.applied_batches("words") == 1
    finally:
        server.stop()
        store.close()
