"""The gRPC servicer: a thin adapter, proto → ``Intake`` → proto.

Domain errors become status codes here and only here (``_STATUS``); the details
string is the error's message, never a stack trace and never report contents.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from protos import crowdmix_pb2 as pb
from shuffler.errors import (
    InvalidRequest,
    Overloaded,
    RequestRejected,
    ShufflerError,
    StaleKey,
    StoreOutcomeUnknown,
    StoreUnavailable,
    Unauthenticated,
)
from shuffler.intake import Intake
from shuffler.metrics import ShufflerMetrics
from shuffler.serde import request_to_columns

__all__ = [
    "SERVICE_NAME",
    "ShufflerServicer",
    "bearer",
    "get_config",
    "parse",
    "rejection",
    "shuffler_handler",
    "status_for",
    "stream_rejection",
]

SERVICE_NAME = "crowdmix.v1.Shuffler"

log = logging.getLogger("crowdmix.shuffler")

_STATUS: tuple[tuple[type[ShufflerError], grpc.StatusCode], ...] = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (StaleKey, grpc.StatusCode.FAILED_PRECONDITION),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StoreOutcomeUnknown, grpc.StatusCode.DEADLINE_EXCEEDED),  # before its base class
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
)


def status_for(exc: ShufflerError) -> grpc.StatusCode:
    for kind, code in _STATUS:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def parse(raw: bytes) -> pb.SubmitRequest:
    try:
        return pb.SubmitRequest.FromString(raw)
    except DecodeError:
        raise InvalidRequest("malformed", "the request is not a SubmitRequest") from None


def rejection(exc: ShufflerError, metrics: ShufflerMetrics) -> tuple[grpc.StatusCode, str]:
    """Status code and details for a domain error; counts it by reason."""
    reason = exc.reason
    metrics.rejected_requests.labels(reason).inc()
    if not isinstance(exc, RequestRejected):
        log.warning("submit failed: %s", exc)
    return status_for(exc), f"{reason}: {exc}"


STORED_REPORTS_KEY = "crowdmix-stored-reports"
STORED_MESSAGES_KEY = "crowdmix-stored-messages"


def stream_rejection(
    exc: ShufflerError, messages: int, reports: int, metrics: ShufflerMetrics
) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """Status, details and trailing metadata of a SubmitStream that ``exc`` stopped
    after its first ``messages`` messages (``reports`` reports) were stored.

    The status is the failure's own (INVALID_ARGUMENT for a bad message, UNAVAILABLE
    for a store outage, ...); the details start with what was stored, and the
    trailing metadata carries the same two numbers for programs. Resending the
    whole stream is safe for reports with ids (the aggregator drops repeated ids);
    a sender without report ids resends only the messages after ``messages``.
    """
    code, details = rejection(exc, metrics)
    summary = f"stored {reports} report(s) of {messages} message(s) before this failure"
    trailing = ((STORED_REPORTS_KEY, str(reports)), (STORED_MESSAGES_KEY, str(messages)))
    return code, f"{summary}; {details}", trailing


def bearer(context: Any) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :].strip()
    return None


def shuffler_handler(
    submit: Any, submit_stream: Any, get_config: Any
) -> grpc.GenericRpcHandler[Any, Any]:
    """The Shuffler service's method table, shared by the sync and aio servers.

    Requests arrive as raw bytes (no request deserializer): the servicer parses
    them itself, so a request that is not a protobuf is INVALID_ARGUMENT.
    """
    serialize = pb.SubmitResponse.SerializeToString
    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Submit": grpc.unary_unary_rpc_method_handler(submit, response_serializer=serialize),
            "SubmitStream": grpc.stream_unary_rpc_method_handler(
                submit_stream, response_serializer=serialize
            ),
            "GetConfig": grpc.unary_unary_rpc_method_handler(
                get_config, response_serializer=pb.ConfigResponse.SerializeToString
            ),
        },
    )


def get_config(intake: Intake, raw: bytes, token: str | None) -> pb.ConfigResponse:
    """GetConfig's domain call (no I/O but a stat of the public key file): the same
    authentication as Submit, then the cached answer."""
    if intake.auth_required:
        intake.authenticate(token)
    return intake.config.answer(raw)


class ShufflerServicer:
    """Submit and SubmitStream on raw request bytes.

    The methods are registered with no request deserializer (``handler``), so a
    request that is not a valid protobuf is answered INVALID_ARGUMENT
    ("malformed") here instead of grpc's generic INTERNAL.
    """

    def __init__(self, intake: Intake, metrics: ShufflerMetrics) -> None:
        self._intake = intake
        self._metrics = metrics

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        return shuffler_handler(self.Submit, self.SubmitStream, self.GetConfig)

    def GetConfig(self, raw: bytes, context: grpc.ServicerContext) -> pb.ConfigResponse:
        try:
            return get_config(self._intake, raw, bearer(context))
        except ShufflerError as exc:
            self._abort(context, exc)

    def _abort(self, context: grpc.ServicerContext, exc: ShufflerError) -> NoReturn:
        context.abort(*rejection(exc, self._metrics))

    def _submit_one(self, raw: bytes, context: grpc.ServicerContext) -> int:
        start = time.perf_counter()
        request = parse(raw)
        connection = context.peer() if self._intake.rate_limited else ""
        accepted = self._intake.submit(request_to_columns(request), connection=connection)
        self._metrics.accepted_reports.inc(accepted)
        self._metrics.accepted_requests.inc()
        self._metrics.request_latency.observe(time.perf_counter() - start)
        return accepted

    def Submit(self, raw: bytes, context: grpc.ServicerContext) -> pb.SubmitResponse:
        try:
            if self._intake.auth_required:
                self._intake.authenticate(bearer(context))
            accepted = self._submit_one(raw, context)
        except ShufflerError as exc:
            self._abort(context, exc)
        return pb.SubmitResponse(accepted=accepted)

    def SubmitStream(
        self, request_iterator: Iterator[bytes], context: grpc.ServicerContext
    ) -> pb.SubmitResponse:
        total = messages = 0
        try:
            if self._intake.auth_required:
                self._intake.authenticate(bearer(context))
            for raw in request_iterator:
                total += self._submit_one(raw, context)
                messages += 1
        except ShufflerError as exc:
            code, details, trailing = stream_rejection(exc, messages, total, self._metrics)
            context.set_trailing_metadata(trailing)
            context.abort(code, details)
        return pb.SubmitResponse(accepted=total)
