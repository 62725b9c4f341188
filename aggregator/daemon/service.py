"""The gRPC ``Aggregator`` servicer: an adapter, proto → domain → proto.

``Ingest(Batch)`` becomes :meth:`crowdmix.aggregator.daemon.ingest.Ingestor.ingest`; domain
errors become status codes here and only here (:func:`status_for`):

    InvalidBatch      → INVALID_ARGUMENT    (the reason; the sender must not retry; also a
                                           body that is not a Batch protobuf: one log line)
    ParamsConflict    → FAILED_PRECONDITION (counts exist under other params)
    StoreUnavailable  → UNAVAILABLE         (nothing applied; retry, the id dedupes)
    anything else     → INTERNAL            (logged here, never a stack trace to the caller)
"""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from crowdmix.aggregator.daemon.ingest import IngestBatch, Ingestor, IngestResult
from crowdmix.aggregator.daemon.metrics import IngestMetrics
from crowdmix.aggregator.errors import InvalidBatch, ParamsConflict, StoreUnavailable
from crowdmix.aggregator.sealing.ingest import SealedBatch
from crowdmix.protos import crowdmix_pb2

__all__ = [
    "SERVICE_NAME",
    "AggregatorServicer",
    "batch_from_proto",
    "batch_to_proto",
    "parse_batch",
    "status_for",
]

SERVICE_NAME = "crowdmix.v2.Aggregator"

log = logging.getLogger("crowdmix.aggregator")


def batch_from_proto(msg: crowdmix_pb2.Batch) -> IngestBatch | SealedBatch:
    """The wire batch as an IngestBatch (cohorts straight into numpy, bits not copied),
    or a SealedBatch when its columns are sealed; InvalidBatch ("mixed_sealed") when
    they set both forms."""
    cols = msg.reports
    if cols.sealed or cols.key_ids or cols.sealed_bytes:
        if cols.params_fingerprint or cols.report_bytes or cols.cohorts or cols.bits:
            raise InvalidBatch("a batch sets sealed and clear columns", reason="mixed_sealed")
        if cols.report_ids:
            raise InvalidBatch(
                "a sealed batch carries report ids in the clear", reason="mixed_sealed"
            )
        return SealedBatch(
            batch_id=msg.batch_id,
            window=msg.window,
            metric=cols.metric,
            count=cols.count,
            key_ids=np.array(cols.key_ids, dtype=np.int64),
            sealed=cols.sealed,
            sealed_bytes=cols.sealed_bytes,
        )
    return IngestBatch(
        batch_id=msg.batch_id,
        window=msg.window,
        metric=cols.metric,
        fingerprint=cols.params_fingerprint,
        count=cols.count,
        report_bytes=cols.report_bytes,
        cohorts=np.array(cols.cohorts, dtype=np.int64),
        bits=cols.bits,
        report_ids=cols.report_ids,
    )


def batch_to_proto(batch: IngestBatch) -> crowdmix_pb2.Batch:
    """The inverse of :func:`batch_from_proto` (for senders and tests)."""
    return crowdmix_pb2.Batch(
        batch_id=batch.batch_id,
        window=batch.window,
        reports=crowdmix_pb2.ReportColumns(
            metric=batch.metric,
            params_fingerprint=batch.fingerprint,
            count=batch.count,
            report_bytes=batch.report_bytes,
            cohorts=batch.cohorts.tolist(),
            bits=batch.bits,
            report_ids=batch.report_ids,
        ),
    )


def parse_batch(raw: bytes) -> crowdmix_pb2.Batch:
    """The request body as a Batch; InvalidBatch ("malformed") when it is not one."""
    try:
        return crowdmix_pb2.Batch.FromString(raw)
    except DecodeError:
        raise InvalidBatch("the request body is not a Batch protobuf", reason="malformed") from None


def status_for(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code and caller-visible message for an exception raised by ingest."""
    if isinstance(exc, InvalidBatch):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, ParamsConflict):
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, StoreUnavailable):
        return grpc.StatusCode.UNAVAILABLE, "count store unavailable, retry later"
    return grpc.StatusCode.INTERNAL, "internal error"


class AggregatorServicer:
    """Ingest on raw request bytes: registered with no request deserializer
    (:meth:`handler`), so a body that is not a Batch (random bytes, truncated,
    trailing garbage) is answered INVALID_ARGUMENT here, with one log line, instead
    of grpc's INTERNAL and a traceback (which the shuffler would retry forever)."""

    def __init__(self, ingestor: Ingestor, metrics: IngestMetrics | None = None) -> None:
        self._ingestor = ingestor
        self._metrics = metrics if metrics is not None else IngestMetrics()

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Ingest": grpc.unary_unary_rpc_method_handler(
                    self.Ingest,
                    response_serializer=crowdmix_pb2.IngestResponse.SerializeToString,
                )
            },
        )

    def Ingest(
        self, request: bytes | crowdmix_pb2.Batch, context: grpc.ServicerContext
    ) -> crowdmix_pb2.IngestResponse:
        start = time.perf_counter()
        try:
            result = self._ingest(request)
        except Exception as exc:
            code, message = status_for(exc)
            self._count_failure(exc)
            context.abort(code, message)
        finally:
            self._metrics.latency.observe(time.perf_counter() - start)
        return crowdmix_pb2.IngestResponse(
            applied=result.applied,
            duplicate=result.duplicate,
            duplicate_reports=result.duplicate_reports,
        )

    def _ingest(self, request: bytes | crowdmix_pb2.Batch) -> IngestResult:
        message = parse_batch(request) if isinstance(request, bytes) else request
        batch = batch_from_proto(message)
        result = self._ingestor.ingest(batch)
        # a re-sent batch (e.g. its first reply was lost): its reports were counted by the
        # first attempt, so this one adds none; the label says so instead of a silent 0
        outcome = "duplicate_batch" if result.duplicate else "applied"
        self._metrics.batches.labels(batch.metric, outcome).inc()
        if result.applied:
            self._metrics.reports.labels(batch.metric).inc(result.applied)
        if result.duplicate_reports:
            self._metrics.duplicate_reports.labels(batch.metric).inc(result.duplicate_reports)
        for reason, n in (result.dropped or {}).items():
            self._metrics.sealed_dropped.labels(batch.metric, reason).inc(n)
        return result

    def _count_failure(self, exc: Exception) -> None:
        if isinstance(exc, InvalidBatch):
            self._metrics.rejected.labels(exc.reason).inc()
            if exc.reason == "malformed":
                log.warning("ingest refused: %s", exc)
        elif isinstance(exc, ParamsConflict):
            self._metrics.rejected.labels("params_conflict").inc()
        elif isinstance(exc, StoreUnavailable):
            self._metrics.store_errors.inc()
            log.warning("ingest failed, store unavailable: %s", exc)
        else:
            log.exception("ingest failed unexpectedly")
