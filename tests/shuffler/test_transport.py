"""ShufflerClient against a real shuffler server on 127.0.0.1:0."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from crowdmix.client.errors import TransportError
from crowdmix.client.report import Report
from crowdmix.client.transport import ShufflerClient
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.config_service import ConfigService
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.shuffler.helpers import RAPPOR, make_registry

REGISTRY = make_registry()
FP = REGISTRY[RAPPOR].fingerprint
TOKEN = "transport-token-0123456789"
#: plaintext shufflers here: clear reports, said explicitly (never a fallback)
CLEAR = {"sealing": "off"}


def report(i: int, fp: int = FP) -> Report:
    return Report(metric=RAPPOR, cohort=i % 8, bits=(i % 65536).to_bytes(2, "little"),
                  params_fingerprint=fp)  # fmt: skip


@pytest.fixture
def shuffler() -> Iterator[ShufflerHandle]:
    handle = start_shuffler(REGISTRY, MemoryStore(), None, tokens=frozenset({TOKEN}))
    yield handle
    handle.stop(grace=1)


def stored(handle: ShufflerHandle) -> int:
    return sum(handle.store.pending(RAPPOR).values())


def test_import_client_loads_no_grpc() -> None:
    code = (
        "import sys, crowdmix.client; "
        "assert 'grpc' not in sys.modules and 'numpy' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_batches_rows_and_columns_and_flushes_on_close(shuffler: ShufflerHandle) -> None:
    with ShufflerClient(f"127.0.0.1:{shuffler.port}", TOKEN, batch_size=100,
                        columnar_threshold=16, **CLEAR) as c:  # fmt: skip
        c.submit_many(report(i) for i in range(250))
        assert c.flush() == 250 and c.queued == 0  # 100, 100, 50: columnar requests
        c.submit(report(1))  # below the columnar threshold: rows
    assert stored(shuffler) == 251
    assert c.sent == 251 and c.dropped == 0 and c.failed == 0
    assert shuffler.metrics.accepted_requests._value.get() == 4


@pytest.mark.parametrize("bad_id", [b"", b"x" * 15, b"x" * 17])
def test_a_malformed_report_id_is_refused_at_submit_on_both_paths(bad_id: bytes) -> None:
    """The row path would send it as is and the columnar one turned it into a zero id
    (counted without de-duplication): both refuse it, queueing nothing of the call."""
    for columnar_threshold in (1, 1000):  # columnar, rows
        c = ShufflerClient("127.0.0.1:1", TOKEN, columnar_threshold=columnar_threshold)
        good = report(1)
        bad = Report(metric=RAPPOR, cohort=1, bits=b"\x01\x00", params_fingerprint=FP,
                     report_id=bad_id)  # fmt: skip
        with pytest.raises(
            ValueError, match=f"report 1: report_id must be 16 bytes.*{len(bad_id)}"
        ):
            c.submit_many([good, bad])
        with pytest.raises(ValueError, match="report_id must be 16 bytes"):
            c.submit(bad)
        assert c.queued == 0
        c.close()


def test_bounded_queue_drops_oldest(shuffler: ShufflerHandle) -> None:
    c = ShufflerClient(f"127.0.0.1:{shuffler.port}", TOKEN, max_queue=10, **CLEAR)
    c.submit_many(report(i) for i in range(25))
    assert c.queued == 10 and c.dropped == 15
    assert c.flush() == 10
    c.close()
    (key,) = shuffler.store.pending(RAPPOR)
    batch = shuffler.store.take(RAPPOR, key, min_batch=1, max_batch=100, batch_id=b"t" * 16)
    assert batch is not None
    assert sorted(int.from_bytes(b.tobytes(), "little") for b in batch.chunk.bit_matrix()) == list(
        range(15, 25)
    )  # the newest ten survived


def test_non_retryable_errors_raise_and_count(shuffler: ShufflerHandle) -> None:
    c = ShufflerClient(f"127.0.0.1:{shuffler.port}", "wrong-token-000000000", **CLEAR)
    c.submit(report(1))
    with pytest.raises(TransportError, match="UNAUTHENTICATED"):
        c.flush()
    assert c.failed == 1 and c.queued == 0
    c2 = ShufflerClient(f"127.0.0.1:{shuffler.port}", TOKEN, **CLEAR)
    c2.submit(report(1, fp=123))
    with pytest.raises(TransportError, match="fingerprint_mismatch"):
        c2.flush()
    c.close()
    c2.close()
    assert stored(shuffler) == 0


class PlaintextConfig(crowdmix_pb2_grpc.ShufflerServicer):  # type: ignore[misc]
    """A fake shuffler's GetConfig: a plaintext shuffler's answer for ``REGISTRY``."""

    def GetConfig(self, request: pb.GetConfigRequest, context: Any) -> pb.ConfigResponse:
        return ConfigService(REGISTRY, None).answer(request.SerializeToString())


class FlakyShuffler(PlaintextConfig):
    """Answers UNAVAILABLE / RESOURCE_EXHAUSTED a set number of times, then accepts."""

    def __init__(self, failures: list[grpc.StatusCode]) -> None:
        self.failures = failures
        self.calls: list[float] = []
        self.accepted = 0

    def Submit(self, request: pb.SubmitRequest, context: Any) -> pb.SubmitResponse:
        self.calls.append(time.monotonic())
        if self.failures:
            context.abort(self.failures.pop(0), "test: try later")
        n = len(request.reports) + sum(c.count for c in request.columns)
        self.accepted += n
        return pb.SubmitResponse(accepted=n)


def test_retries_with_backoff_then_requeues() -> None:
    flaky = FlakyShuffler([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED] * 3)
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    crowdmix_pb2_grpc.add_ShufflerServicer_to_server(flaky, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        c = ShufflerClient(f"127.0.0.1:{port}", max_attempts=4,
                           backoff_base=0.01, backoff_cap=0.05, **CLEAR)  # fmt: skip
        c.submit_many(report(i) for i in range(3))
        with pytest.raises(TransportError, match="RESOURCE_EXHAUSTED"):
            c.flush()  # four attempts, all refused: the reports go back in the queue
        assert c.queued == 3 and len(flaky.calls) == 4
        assert c.flush() == 3  # two more refusals, then accepted
        assert flaky.accepted == 3 and len(flaky.calls) == 7
        c.close()
    finally:
        server.stop(0)


def test_unreachable_shuffler_keeps_reports_queued() -> None:
    from tests.redis_server import free_port

    c = ShufflerClient(f"127.0.0.1:{free_port()}", max_attempts=2,
                       backoff_base=0.01, timeout=2, **CLEAR)  # fmt: skip
    c.submit_many(report(i) for i in range(4))
    with pytest.raises(TransportError, match="UNAVAILABLE"):
        c.flush()
    assert c.queued == 4
    c.close(flush=False)


def test_many_threads_submitting(shuffler: ShufflerHandle) -> None:
    c = ShufflerClient(f"127.0.0.1:{shuffler.port}", TOKEN, batch_size=64, **CLEAR)

    def work(t: int) -> None:
        for i in range(500):
            c.submit(report(t * 1000 + i))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.close()
    assert stored(shuffler) == 2000 and c.sent == 2000


def _readme_retry_table() -> dict[str, bool]:
    """The operators' retry table (docs/operating.md): status name -> whether the SDK
    retries it."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "operating.md").read_text()
    table = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[2] in ("retried", "not retried"):
            table[cells[0].strip("`")] = cells[2] == "retried"
    return table


class RecordingShuffler(PlaintextConfig):
    """Refuses every call with one status and records the report ids of each attempt."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code
        self.ids: list[list[bytes]] = []

    def Submit(self, request: pb.SubmitRequest, context: Any) -> pb.SubmitResponse:
        ids = [r.report_id for r in request.reports]
        for c in request.columns:
            ids += [c.report_ids[i : i + 16] for i in range(0, len(c.report_ids), 16)]
        self.ids.append(ids)
        context.abort(self.code, "test")


def test_the_transport_does_what_the_readme_retry_table_says() -> None:
    """Every status in the operators' table: retried ones are sent max_attempts times with
    the same report ids and the reports stay queued (ids unchanged); the others once (and
    once more after the one config refetch INVALID_ARGUMENT asks for), then the reports
    are dropped as failed."""
    table = _readme_retry_table()
    assert {"UNAVAILABLE", "DEADLINE_EXCEEDED", "INVALID_ARGUMENT"} <= set(table)
    for name, retried in table.items():
        for batch in (3, 40):  # rows and columns
            shuffler = RecordingShuffler(grpc.StatusCode[name])
            server = grpc.server(ThreadPoolExecutor(max_workers=2))
            crowdmix_pb2_grpc.add_ShufflerServicer_to_server(shuffler, server)
            port = server.add_insecure_port("127.0.0.1:0")
            server.start()
            try:
                c = ShufflerClient(f"127.0.0.1:{port}", max_attempts=3,
                                   backoff_base=0.001, backoff_cap=0.002,
                                   **CLEAR)  # fmt: skip
                reports = [report(i) for i in range(batch)]
                c.submit_many(reports)
                with pytest.raises(TransportError, match=name):
                    c.flush()
                sent = [r.report_id for r in reports]
                if retried:
                    assert shuffler.ids == [sent] * 3, name
                    assert (c.queued, c.failed) == (batch, 0), name
                    with pytest.raises(TransportError):
                        c.flush()  # the next flush: the same ids again
                    assert shuffler.ids[3] == sent
                else:
                    assert c.refetches == (name == "INVALID_ARGUMENT"), name
                    assert shuffler.ids == [sent] * (1 + c.refetches), name
                    assert (c.queued, c.failed) == (0, batch), name
                c.close(flush=False)
            finally:
                server.stop(0)
