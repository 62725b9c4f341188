"""The gRPC servicer: a thin adapter, proto → ``Intake`` → proto.

Domain errors become status codes here and only here (``_STATUS``); the details
string is the error's message, never a stack trace and never report contents.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import NoReturn

import grpc

from protos import crowdmix_pb2 as pb
from protos import crowdmix_pb2_grpc
from shuffler.errors import (
    InvalidRequest,
    Overloaded,
    RequestRejected,
    ShufflerError,
    StoreUnavailable,
    Unauthenticated,
)
from shuffler.intake import Intake
from shuffler.metrics import ShufflerMetrics
from shuffler.serde import request_to_columns

__all__ = ["ShufflerServicer", "status_for"]

log = logging.getLogger("crowdmix.shuffler")

_STATUS: tuple[tuple[type[ShufflerError], grpc.StatusCode], ...] = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
)


def status_for(exc: ShufflerError) -> grpc.StatusCode:
    for kind, code in _STATUS:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def _bearer(context: grpc.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :].strip()
    return None


class ShufflerServicer(crowdmix_pb2_grpc.ShufflerServicer):  # type: ignore[misc]
    def __init__(self, intake: Intake, metrics: ShufflerMetrics) -> None:
        self._intake = intake
        self._metrics = metrics

    def _abort(self, context: grpc.ServicerContext, exc: ShufflerError) -> NoReturn:
        reason = exc.reason if isinstance(exc, RequestRejected) else "store_unavailable"
        self._metrics.rejected_requests.labels(reason).inc()
        if not isinstance(exc, RequestRejected):
            log.warning("submit failed: %s", exc)
        context.abort(status_for(exc), f"{reason}: {exc}")

    def Submit(self, request: pb.SubmitRequest, context: grpc.ServicerContext) -> pb.SubmitResponse:
        start = time.perf_counter()
        try:
            self._intake.authenticate(_bearer(context))
            accepted = self._intake.submit(request_to_columns(request), connection=context.peer())
        except ShufflerError as exc:
            self._abort(context, exc)
        self._metrics.accepted_reports.inc(accepted)
        self._metrics.accepted_requests.inc()
        self._metrics.request_latency.observe(time.perf_counter() - start)
        return pb.SubmitResponse(accepted=accepted)

    def SubmitStream(
        self, request_iterator: Iterator[pb.SubmitRequest], context: grpc.ServicerContext
    ) -> pb.SubmitResponse:
        total = 0
        try:
            self._intake.authenticate(_bearer(context))
            for request in request_iterator:
                start = time.perf_counter()
                accepted = self._intake.submit(
                    request_to_columns(request), connection=context.peer()
                )
                total += accepted
                self._metrics.accepted_reports.inc(accepted)
                self._metrics.accepted_requests.inc()
                self._metrics.request_latency.observe(time.perf_counter() - start)
        except ShufflerError as exc:
            self._abort(context, exc)
        return pb.SubmitResponse(accepted=total)
