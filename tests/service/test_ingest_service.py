"""Ingest through a real gRPC server on 127.0.0.1:0: exact counts, duplicates, garbage."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from crowdmix.aggregator.daemon.ingest import IngestBatch
from crowdmix.aggregator.daemon.server import AggregatorServer, start_aggregator
from crowdmix.aggregator.daemon.service import batch_to_proto
from crowdmix.aggregator.store import load_counts
from crowdmix.aggregator.store.base import ApplyOutcome, StoredCounts
from crowdmix.aggregator.store.memory import MemoryCountStore
from crowdmix.core.registry import Registry
from crowdmix.health import check_health
from crowdmix.protos import crowdmix_pb2, crowdmix_pb2_grpc
from tests.service.helpers import direct_count, now_window, random_batch, write_registry


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    return write_registry(tmp_path_factory.mktemp("reg"))[1]


@pytest.fixture(scope="module")
def server(registry: Registry) -> Iterator[AggregatorServer]:
    srv = start_aggregator(registry, MemoryCountStore(), metrics_port=0)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def stub(server: AggregatorServer) -> Iterator[crowdmix_pb2_grpc.AggregatorStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield crowdmix_pb2_grpc.AggregatorStub(channel)


def snapshot(server: AggregatorServer) -> dict[str, StoredCounts | None]:
    return {m: server.store.load(m) for m in ("pages", "browser")}


def unchanged(a: dict[str, StoredCounts | None], b: dict[str, StoredCounts | None]) -> bool:
    for key in a:
        x, y = a[key], b[key]
        if (x is None) != (y is None):
            return False
        if (
            x is not None
            and y is not None
            and not (np.array_equal(x.totals, y.totals) and np.array_equal(x.ones, y.ones))
        ):
            return False
    return True


def test_batches_are_counted_exactly_and_a_resent_batch_once(
    server: AggregatorServer, stub: crowdmix_pb2_grpc.AggregatorStub, registry: Registry
) -> None:
    rng = np.random.default_rng(11)
    window = now_window(registry) - 3  # a window of its own in the shared server
    config = registry["pages"]
    batches = [random_batch(rng, config, int(n), window) for n in (1, 17, 500, 2000)]
    for b in batches:
        resp = stub.Ingest(batch_to_proto(b))
        assert (resp.applied, resp.duplicate) == (b.count, False)
    # a simulated retry of every batch: acknowledged, not counted
    for b in batches:
        resp = stub.Ingest(batch_to_proto(b))
        assert (resp.applied, resp.duplicate) == (0, True)
    counts = load_counts(server.store, config, windows=[window])
    assert counts == direct_count(config, batches)
    assert counts.num_reports == sum(b.count for b in batches)


def test_basic_mechanism_batches_are_counted(
    server: AggregatorServer, stub: crowdmix_pb2_grpc.AggregatorStub, registry: Registry
) -> None:
    rng = np.random.default_rng(12)
    config = registry["browser"]
    window = now_window(registry) - 4
    batches = [random_batch(rng, config, 300, window) for _ in range(3)]
    for b in batches:
        assert stub.Ingest(batch_to_proto(b)).applied == 300
    assert load_counts(server.store, config, windows=[window]) == direct_count(config, batches)


def _garbage_cases(registry: Registry) -> dict[str, tuple[IngestBatch, str]]:
    rng = np.random.default_rng(13)
    pages = registry["pages"]
    ok = random_batch(rng, pages, 40, now_window(registry))
    bits = bytearray(ok.bits)
    bits[2] |= 0x80  # bit 23 of report 0: k=20, so a padding bit
    krr = random_batch(rng, registry["browser"], 40, now_window(registry))
    krr_bits = bytearray(krr.bits)
    krr_bits[5] = 7  # index 7 in a domain of 5
    return {
        "short_batch_id": (replace(ok, batch_id=b"short"), "batch_id must be 16 bytes"),
        "no_batch_id": (replace(ok, batch_id=b""), "batch_id must be 16 bytes"),
        "unknown_metric": (replace(ok, metric="nope"), "unknown metric 'nope'"),
        "fingerprint": (replace(ok, fingerprint=ok.fingerprint ^ 1), "fingerprint"),
        "report_bytes": (replace(ok, report_bytes=4, bits=ok.bits + bytes(40)), "report_bytes"),
        "bits_too_short": (replace(ok, bits=ok.bits[:-1]), "expected count*report_bytes"),
        "count_mismatch": (replace(ok, count=41), "cohorts for count=41"),
        "cohorts_missing": (replace(ok, cohorts=ok.cohorts[:-1]), "39 cohorts"),
        "cohort_range": (replace(ok, cohorts=ok.cohorts + 8), "out of range [0, 8)"),
        "padding": (replace(ok, bits=bytes(bits)), "padding bits"),
        "empty": (replace(ok, count=0, cohorts=ok.cohorts[:0], bits=b""), "empty batch"),
        "future_window": (replace(ok, window=ok.window + 5), "in the future"),
        "krr_index": (replace(krr, bits=bytes(krr_bits)), "browser"),
        "no_report_ids": (replace(ok, report_ids=b""), "report_ids has 0 bytes"),
        "zero_report_id": (
            replace(ok, report_ids=ok.report_ids[:16] + bytes(16) + ok.report_ids[32:]),
            "a report id is all zero",
        ),
    }


GARBAGE_CASES = [
    "short_batch_id", "no_batch_id", "unknown_metric", "fingerprint", "report_bytes",
    "bits_too_short", "count_mismatch", "cohorts_missing", "cohort_range", "padding", "empty",
    "future_window", "krr_index", "no_report_ids", "zero_report_id",
]  # fmt: skip


@pytest.mark.parametrize("case", GARBAGE_CASES)
def test_garbage_is_rejected_with_a_reason_and_counts_untouched(
    case: str,
    server: AggregatorServer,
    stub: crowdmix_pb2_grpc.AggregatorStub,
    registry: Registry,
) -> None:
    batch, reason = _garbage_cases(registry)[case]
    before = snapshot(server)
    ids_before = server.store.applied_batches(batch.metric)
    with pytest.raises(grpc.RpcError) as info:
        stub.Ingest(batch_to_proto(batch))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in (info.value.details() or "")
    assert unchanged(before, snapshot(server))
    assert server.store.applied_batches(batch.metric) == ids_before
    # the id of a rejected batch is not burnt: the same id with valid content applies
    if case == "padding":
        fixed = random_batch(np.random.default_rng(1), registry["pages"], 5, batch.window)
        assert stub.Ingest(batch_to_proto(replace(fixed, batch_id=batch.batch_id))).applied == 5


def test_undecodable_bytes_are_rejected_and_the_server_keeps_serving(
    server: AggregatorServer,
) -> None:
    with grpc.insecure_channel(server.target) as channel:
        raw = channel.unary_unary(
            "/crowdmix.v2.Aggregator/Ingest", request_serializer=None, response_deserializer=None
        )
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\xff\xff\xff\xff garbage")
        assert info.value.code() != grpc.StatusCode.OK
    assert check_health(server.target, service="crowdmix.v2.Aggregator") == "SERVING"


@st.composite
def wire_batches(draw: st.DrawFn) -> dict[str, object]:
    """A valid batch's fields, then zero to three random corruptions of them."""
    metric = draw(st.sampled_from(["pages", "browser"]))
    count = draw(st.integers(1, 30))
    nbytes = 3 if metric == "pages" else 1
    top = 8 if metric == "pages" else 1
    fields: dict[str, object] = {
        "batch_id": draw(st.binary(min_size=16, max_size=16)),
        "window_delta": draw(st.integers(-2, 0)),
        "metric": metric,
        "fingerprint_ok": True,
        "count": count,
        "report_bytes": nbytes,
        "cohorts": draw(st.lists(st.integers(0, top - 1), min_size=count, max_size=count)),
        "bits": bytes(
            v
            for _ in range(count)
            for v in (
                [draw(st.integers(0, 255)), draw(st.integers(0, 255)), draw(st.integers(0, 15))]
                if metric == "pages"
                else [draw(st.integers(0, 4))]
            )
        ),
        "report_ids": "fresh",  # count fresh ids, drawn when the batch is built
    }
    corruptions = {
        "batch_id": st.binary(max_size=40),
        "window_delta": st.integers(-3, 4),
        "metric": st.sampled_from(["", "pages ", "nope", "x" * 200, "browser", "pages"]),
        "fingerprint_ok": st.just(False),
        "count": st.integers(0, 40),
        "report_bytes": st.integers(0, 5),
        "cohorts": st.lists(st.integers(0, 2**32 - 1) | st.integers(0, 9), max_size=32),
        "bits": st.binary(max_size=120),
        "report_ids": st.sampled_from(["none", "short", "one_zero"]),
    }
    for key in draw(st.lists(st.sampled_from(sorted(corruptions)), max_size=3, unique=True)):
        fields[key] = draw(corruptions[key])
    return fields


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=wire_batches())
def test_hypothesis_batches_are_applied_iff_valid(
    fields: dict[str, object],
    server: AggregatorServer,
    stub: crowdmix_pb2_grpc.AggregatorStub,
    registry: Registry,
) -> None:
    """Arbitrary field values: a batch is counted iff an independent oracle says it is valid;
    anything else is INVALID_ARGUMENT and leaves counts and ids untouched."""
    metric = str(fields["metric"])
    config = registry.get(metric)
    fp = config.fingerprint if config is not None else 12345
    fingerprint = fp if fields["fingerprint_ok"] else fp ^ 0x5A5A
    window = now_window(registry) + int(fields["window_delta"])  # type: ignore[call-overload]
    cohorts = list(fields["cohorts"])  # type: ignore[call-overload]
    count, nbytes = int(fields["count"]), int(fields["report_bytes"])  # type: ignore[call-overload]
    bits = bytes(fields["bits"])  # type: ignore[call-overload]
    batch_id = bytes(fields["batch_id"])  # type: ignore[call-overload]
    ids = {
        "fresh": os.urandom(16 * count),
        "none": b"",
        "short": os.urandom(16 * count)[:-1],
        "one_zero": bytes(16) + os.urandom(16 * count)[16:],
    }[str(fields["report_ids"])]
    msg = crowdmix_pb2.Batch(
        batch_id=batch_id,
        window=window,
        reports=crowdmix_pb2.ReportColumns(
            metric=metric,
            params_fingerprint=fingerprint,
            count=count,
            report_bytes=nbytes,
            cohorts=cohorts,
            bits=bits,
            report_ids=ids,
        ),
    )
    shape_ok = (
        config is not None
        and len(batch_id) == 16
        and window <= now_window(registry) + 1
        and nbytes == config.report_bytes
        and count >= 1
        and len(cohorts) == count
        and len(bits) == count * nbytes
        and fields["report_ids"] == "fresh"
    )
    valid = (
        shape_ok
        and config is not None
        and fingerprint == config.fingerprint
        and config is not None
        and all(c < config.num_cohorts for c in cohorts)
        and _payload_ok(metric, bits, nbytes)
    )
    # a batch id applied before is answered as a duplicate once the O(1) shape checks pass,
    # whatever its params (the registry may have changed since it was counted)
    resent = shape_ok and server.store.is_applied(metric, batch_id)
    event("valid" if valid else "invalid")
    before = snapshot(server)
    ids_before = server.store.applied_batches(metric)
    try:
        resp = stub.Ingest(msg)
    except grpc.RpcError as exc:
        assert not valid, exc.details()
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert exc.details()
        assert unchanged(before, snapshot(server))
        assert server.store.applied_batches(metric) == ids_before
    else:
        assert valid or resent
        assert resp.duplicate == resent
        assert resp.applied == (0 if resent else count)
        assert server.store.applied_batches(metric) == ids_before + (0 if resp.duplicate else 1)


def _payload_ok(metric: str, bits: bytes, nbytes: int) -> bool:
    if metric == "pages":  # k=20: the top 4 bits of byte 2 of every report are padding
        return all(b >> 4 == 0 for b in bits[2::3])
    return all(b < 5 for b in bits)  # browser: a k-RR index in a domain of 5


def test_prometheus_metrics_count_outcomes(
    server: AggregatorServer, stub: crowdmix_pb2_grpc.AggregatorStub, registry: Registry
) -> None:
    rng = np.random.default_rng(14)
    b = random_batch(rng, registry["pages"], 10, now_window(registry) - 5)
    stub.Ingest(batch_to_proto(b))
    stub.Ingest(batch_to_proto(b))
    with pytest.raises(grpc.RpcError):
        stub.Ingest(batch_to_proto(replace(b, metric="nope", batch_id=os.urandom(16))))
    assert server.metrics_port is not None
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    assert 'crowdmix_aggregator_batches_total{metric="pages",outcome="duplicate_batch"}' in text
    assert 'crowdmix_aggregator_batches_rejected_total{reason="unknown_metric"}' in text
    assert "crowdmix_aggregator_ingest_seconds_count" in text
    assert "crowdmix_aggregator_serving 1.0" in text
    assert "crowdmix_aggregator_apply_retries 0.0" in text
    assert "crowdmix_aggregator_report_id_index_rebuilds 0.0" in text


def test_two_servers_in_one_process_and_stop_is_graceful(
    registry: Registry, tmp_path: Path
) -> None:
    store = MemoryCountStore()
    with start_aggregator(registry, store) as a, start_aggregator(registry, store) as b:
        assert a.port != b.port
        assert check_health(a.target) == "SERVING"
    assert check_health(a.target, timeout=1.0).startswith("UNREACHABLE")


class _BrokenStore(MemoryCountStore):
    def apply_reports(self, *args: object, **kwargs: object) -> ApplyOutcome:
        raise RuntimeError("secret internals")


def test_an_unexpected_error_is_internal_without_details(registry: Registry) -> None:
    rng = np.random.default_rng(15)
    b = random_batch(rng, registry["pages"], 10, now_window(registry))
    with (
        start_aggregator(registry, _BrokenStore()) as srv,
        grpc.insecure_channel(srv.target) as channel,
    ):
        stub = crowdmix_pb2_grpc.AggregatorStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Ingest(batch_to_proto(b))
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert info.value.details() == "internal error"
        assert check_health(srv.target) == "SERVING"
