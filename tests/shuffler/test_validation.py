"""Every malformed input gets its status code and leaves the store unchanged;
the server keeps serving. Real gRPC server on 127.0.0.1:0, real client stubs."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.shuffler.helpers import OUE, RAPPOR, make_registry, serving, submit_request

TOKEN = "test-token-0123456789abcdef"
REGISTRY = make_registry()
FP = REGISTRY[RAPPOR].fingerprint
OUE_FP = REGISTRY[OUE].fingerprint
AUTH = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture(scope="module")
def shuffler() -> Iterator[ShufflerHandle]:
    handle = start_shuffler(
        REGISTRY,
        MemoryStore(),
        None,  # nothing is released: the store shows exactly what was accepted
        settings=ShufflerSettings(max_request_bytes=64 * 1024, max_reports_per_request=2000),
        tokens=frozenset({TOKEN}),
    )
    yield handle
    handle.stop(grace=1)


@pytest.fixture(scope="module")
def channel(shuffler: ShufflerHandle) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{shuffler.port}") as ch:
        yield ch


def pending(handle: ShufflerHandle) -> dict[str, int]:
    return {m: sum(handle.store.pending(m).values()) for m in REGISTRY.metrics}


def row(
    metric: str = RAPPOR, cohort: int = 3, bits: bytes = b"\x01\x80", fp: int = FP
) -> pb.Report:
    return pb.Report(metric=metric, cohort=cohort, bits=bits, params_fingerprint=fp)


def submit(channel: grpc.Channel, request: pb.SubmitRequest, metadata=AUTH) -> int:  # type: ignore[no-untyped-def]
    stub = crowdmix_pb2_grpc.ShufflerStub(channel)
    return int(stub.Submit(request, metadata=metadata, timeout=10).accepted)


def _ids(request: pb.SubmitRequest, rid: bytes) -> pb.SubmitRequest:
    """``request`` with every report id set to ``rid`` (b"": none)."""
    for r in request.reports:
        r.report_id = rid
    for c in request.columns:
        c.report_ids = rid * c.count
    return request


def _columns(
    count: int = 2, *, cohorts: list[int] | None = None, bits: bytes | None = None
) -> pb.ReportColumns:
    """``count`` columnar RAPPOR reports (2 bytes each): cohorts 0, 1, … and zero bits
    unless given (a test of malformed columns gives lists that do not match ``count``)."""
    return pb.ReportColumns(
        metric=RAPPOR,
        params_fingerprint=FP,
        count=count,
        report_bytes=2,
        cohorts=list(range(count)) if cohorts is None else cohorts,
        bits=b"\x00" * 2 * count if bits is None else bits,
    )


BAD = {
    "empty": submit_request(),
    # a report id is required: 16 bytes, not all zero
    "row_without_report_id": _ids(submit_request(reports=[row(), row()]), b""),
    "row_with_zero_report_id": _ids(submit_request(reports=[row()]), bytes(16)),
    "row_with_short_report_id": _ids(submit_request(reports=[row()]), b"\x01" * 15),
    "columns_without_report_ids": _ids(submit_request(columns=[_columns()]), b""),
    "columns_with_a_zero_report_id": _ids(submit_request(columns=[_columns()]), bytes(16)),
    "protocol_1": submit_request(reports=[row()], protocol=1),
    "unknown_metric": submit_request(reports=[row(), row(metric="nope")]),
    "fingerprint_mismatch": submit_request(reports=[row(fp=FP ^ 1)]),
    "bit_length": submit_request(reports=[row(), row(bits=b"\x01\x02\x03")]),
    "padding_bits": submit_request(reports=[row(metric=OUE, cohort=0, bits=b"\x21", fp=OUE_FP)]),
    "cohort_range": submit_request(reports=[row(cohort=8)]),
    "cohort_range_basic": submit_request(
        reports=[row(metric=OUE, cohort=1, bits=b"\x01", fp=OUE_FP)]
    ),
    "malformed_columns": submit_request(columns=[_columns(3, cohorts=[0, 1])]),
    "columns_bits_short": submit_request(columns=[_columns(2, bits=b"\x00" * 3)]),
    "one_bad_column_sinks_the_rows": submit_request(
        reports=[row(), row()], columns=[_columns(1, cohorts=[99])]
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_requests_are_refused_and_store_nothing(
    case: str, shuffler: ShufflerHandle, channel: grpc.Channel
) -> None:
    before = pending(shuffler)
    with pytest.raises(grpc.RpcError) as err:
        submit(channel, BAD[case])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details()  # a reason, no stack trace
    assert "Traceback" not in err.value.details()
    assert pending(shuffler) == before
    assert submit(channel, submit_request(reports=[row()])) == 1  # still serving


def test_not_a_protobuf_is_invalid_argument(
    shuffler: ShufflerHandle, channel: grpc.Channel
) -> None:
    raw = channel.unary_unary("/crowdmix.v2.Shuffler/Submit")
    with pytest.raises(grpc.RpcError) as err:
        raw(b"\xff\xff\xff\xff\x0f", metadata=AUTH, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("malformed")


def test_oversized_and_too_many_are_resource_exhausted(
    shuffler: ShufflerHandle, channel: grpc.Channel
) -> None:
    before = pending(shuffler)
    too_big = submit_request(reports=[row(bits=b"\x00" * 70_000)])  # > 64 KiB message
    too_many = submit_request(columns=[_columns(2001, cohorts=[0] * 2001)])
    for request in (too_big, too_many):
        with pytest.raises(grpc.RpcError) as err:
            submit(channel, request)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert pending(shuffler) == before


def test_missing_or_wrong_token_is_unauthenticated(
    shuffler: ShufflerHandle, channel: grpc.Channel
) -> None:
    before = pending(shuffler)
    for metadata in ((), (("authorization", "Bearer not-the-token-at-all"),)):
        with pytest.raises(grpc.RpcError) as err:
            submit(channel, submit_request(reports=[row()]), metadata=metadata)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert pending(shuffler) == before


def test_valid_rows_and_columns_are_stored_all_together(
    shuffler: ShufflerHandle, channel: grpc.Channel
) -> None:
    before = pending(shuffler)
    request = submit_request(
        reports=[row(), row(metric=OUE, cohort=0, bits=b"\x1f", fp=OUE_FP)],
        columns=[_columns(3, cohorts=[0, 7, 2], bits=b"\xff\xff\x00\x00\x12\x34")],
    )
    assert submit(channel, request) == 5
    after = pending(shuffler)
    assert after[RAPPOR] - before[RAPPOR] == 4
    assert after[OUE] - before[OUE] == 1


def test_stream_stores_each_message_all_or_nothing(
    shuffler: ShufflerHandle, channel: grpc.Channel
) -> None:
    stub = crowdmix_pb2_grpc.ShufflerStub(channel)
    before = pending(shuffler)
    good = submit_request(reports=[row(), row()])
    resp = stub.SubmitStream(iter([good, good, good]), metadata=AUTH, timeout=10)
    assert resp.accepted == 6
    assert pending(shuffler)[RAPPOR] - before[RAPPOR] == 6
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitStream(iter([good, BAD["cohort_range"], good]), metadata=AUTH, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # the first message was stored before the bad one was seen; nothing after it
    assert pending(shuffler)[RAPPOR] - before[RAPPOR] == 8


def _expected_valid(request: pb.SubmitRequest) -> bool:
    """An independent per-report oracle of validity, for rows."""
    if not request.reports:
        return False
    for r in request.reports:
        metric = REGISTRY.get(r.metric)
        if metric is None or r.params_fingerprint != metric.fingerprint:
            return False
        if len(r.bits) != metric.report_bytes or r.cohort >= metric.num_cohorts:
            return False
        if r.metric == OUE and r.bits[0] >> 5:
            return False
    return True


reports = st.builds(
    pb.Report,
    metric=st.sampled_from([RAPPOR, OUE, "", "other", RAPPOR + "x"]),
    cohort=st.one_of(st.integers(0, 9), st.integers(0, 2**32 - 1)),
    bits=st.one_of(st.binary(min_size=0, max_size=4), st.binary(min_size=1, max_size=1)),
    params_fingerprint=st.sampled_from([FP, OUE_FP, 0, FP ^ (1 << 63)]),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(request=st.builds(pb.SubmitRequest, reports=st.lists(reports, max_size=6)))
def test_generated_requests_are_stored_exactly_when_valid(
    request: pb.SubmitRequest, shuffler: ShufflerHandle, channel: grpc.Channel
) -> None:
    before = pending(shuffler)
    valid = _expected_valid(request)
    try:
        accepted = submit(channel, request)
    except grpc.RpcError as err:
        assert not valid, err.details()
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert pending(shuffler) == before
        return
    assert valid
    assert accepted == len(request.reports)
    assert sum(pending(shuffler).values()) - sum(before.values()) == accepted


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.binary(max_size=300))
def test_garbage_bytes_never_store_or_kill(
    raw: bytes, shuffler: ShufflerHandle, channel: grpc.Channel
) -> None:
    before = pending(shuffler)
    call = channel.unary_unary("/crowdmix.v2.Shuffler/Submit")
    try:
        call(raw, metadata=AUTH, timeout=10)
    except grpc.RpcError as err:
        assert err.code() in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        )
        assert pending(shuffler) == before
    assert submit(channel, submit_request(reports=[row()])) == 1


def test_numpy_view_of_pending_matches() -> None:
    """The stored chunks decode to the cohorts and bits that were sent."""
    store = MemoryStore()
    with serving(REGISTRY, store, None, tokens=None) as (_, stub):
        stub.Submit(submit_request(reports=[row(cohort=5, bits=b"\xab\x0c")]), timeout=10)
        (key,) = store.pending(RAPPOR)
        batch = store.take(RAPPOR, key, min_batch=1, max_batch=10, batch_id=b"x" * 16)
        assert batch is not None and key.fingerprint == FP
        assert batch.chunk.cohorts.tolist() == [5]
        assert np.array_equal(batch.chunk.bit_matrix(), [[0xAB, 0x0C]])
        assert key.window == REGISTRY.window_of(__import__("time").time())
