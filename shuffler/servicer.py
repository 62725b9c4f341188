"""The gRPC servicer (grpc.aio): a thin adapter, proto → ``Intake`` → group
commit → proto.

The service's method table is ``shuffler_handler``, the one place that names the
RPCs. Domain errors become status codes here and only here (``_STATUS``); the
details string is the error's message, never a stack trace and never report
contents. A request waiting for its group commit holds no thread: it awaits a
future (``crowdmix.shuffler.commit``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from crowdmix.core.log_limit import RepeatedFailure
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.shuffler.commit import GroupCommitter, Parts
from crowdmix.shuffler.errors import (
    InvalidRequest,
    Overloaded,
    RequestRejected,
    RoundMismatch,
    ShufflerError,
    StaleKey,
    StoreOutcomeUnknown,
    StoreUnavailable,
    Unauthenticated,
    WindowRefused,
)
from crowdmix.shuffler.intake import Intake
from crowdmix.shuffler.metrics import ShufflerMetrics
from crowdmix.shuffler.serde import request_to_columns

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

SERVICE_NAME = "crowdmix.v2.Shuffler"

log = logging.getLogger("crowdmix.shuffler")
#: requests refused by the store (not by their content): an outage refuses thousands a
#: second, logged when it starts, once a minute, and when a commit succeeds again
SUBMIT_FAILURES = RepeatedFailure(log, "submit (store)")

_STATUS: tuple[tuple[type[ShufflerError], grpc.StatusCode], ...] = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (StaleKey, grpc.StatusCode.FAILED_PRECONDITION),
    (WindowRefused, grpc.StatusCode.FAILED_PRECONDITION),
    (RoundMismatch, grpc.StatusCode.FAILED_PRECONDITION),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    # StoreNotReplicated is a StoreOutcomeUnknown: the write ran on the master, so it is
    # "may have been stored" (DEADLINE_EXCEEDED), never "nothing was stored" (UNAVAILABLE)
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
    if not isinstance(exc, RequestRejected):  # the store: one line per outage, not per call
        SUBMIT_FAILURES.failed(exc)
    return status_for(exc), f"{reason}: {exc}"


STORED_REPORTS_KEY = "crowdmix-stored-reports"
STORED_MESSAGES_KEY = "crowdmix-stored-messages"


def stream_rejection(
    exc: ShufflerError, messages: int, reports: int, metrics: ShufflerMetrics, *, later: int = 0
) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """Status, details and trailing metadata of a SubmitStream that ``exc`` stopped
    after its first ``messages`` messages (``reports`` reports) were stored.

    The status is the failure's own (INVALID_ARGUMENT for a bad message, UNAVAILABLE
    for a store outage, ...); the details start with what was stored, and the
    trailing metadata carries the same two numbers for programs. The messages
    counted are always a prefix of the stream: ``later`` reports of messages after
    the failed one may have been stored too (their commits overlapped), and the
    details say so. Resending the whole stream is safe: every report carries its id and
    window, and the aggregator drops a repeated id in its window.
    """
    code, details = rejection(exc, metrics)
    summary = f"stored {reports} report(s) of {messages} message(s) before this failure"
    if later:
        summary += f" ({later} report(s) of later messages were stored too)"
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
    """The Shuffler service's method table: every RPC the shuffler serves is here.

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


# A SubmitStream's commits pending at once: enough to overlap reading and writing,
# few enough that a stream holds at most this many messages in memory.
STREAM_COMMITS_IN_FLIGHT = 2


class ShufflerServicer:
    """Submit and SubmitStream on raw request bytes.

    The methods are registered with no request deserializer (``handler``), so a
    request that is not a valid protobuf is answered INVALID_ARGUMENT
    ("malformed") here instead of grpc's generic INTERNAL.
    """

    def __init__(self, intake: Intake, committer: GroupCommitter, metrics: ShufflerMetrics) -> None:
        self._intake = intake
        self._committer = committer
        self._metrics = metrics

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        return shuffler_handler(self.Submit, self.SubmitStream, self.GetConfig)

    async def GetConfig(self, raw: bytes, context: Any) -> pb.ConfigResponse:
        try:
            return get_config(self._intake, raw, bearer(context))
        except ShufflerError as exc:
            await context.abort(*rejection(exc, self._metrics))
            raise  # unreachable: abort raises

    def _admit(self, raw: bytes, context: Any) -> tuple[Parts, int]:
        request = parse(raw)
        connection = context.peer() if self._intake.rate_limited else ""
        return self._intake.admit(request_to_columns(request), connection=connection)

    async def _commit(self, chunks: Parts, n: int, start: float) -> int:
        await self._committer.commit(chunks)
        SUBMIT_FAILURES.succeeded()
        self._metrics.accepted_reports.inc(n)
        self._metrics.accepted_requests.inc()
        self._metrics.request_latency.observe(time.perf_counter() - start)
        return n

    async def Submit(self, raw: bytes, context: Any) -> pb.SubmitResponse:
        try:
            if self._intake.auth_required:
                self._intake.authenticate(bearer(context))
            start = time.perf_counter()
            chunks, n = self._admit(raw, context)
            accepted = await self._commit(chunks, n, start)
        except ShufflerError as exc:
            await context.abort(*rejection(exc, self._metrics))
        return pb.SubmitResponse(accepted=accepted)

    async def SubmitStream(self, requests: AsyncIterator[bytes], context: Any) -> pb.SubmitResponse:
        """Each message is validated as it arrives and its commit overlaps the reading
        of the next one (a stream pays one gather window, not one per message), with at
        most ``STREAM_COMMITS_IN_FLIGHT`` commits pending, so a stream cannot queue
        unbounded memory behind a slow store. The first failure (a bad message or a
        failed commit) stops the stream; nothing read after it is stored."""
        outcomes: list[int | ShufflerError] = []  # per message, in stream order
        admit_error: ShufflerError | None = None
        commits: deque[asyncio.Task[int]] = deque()
        try:
            if self._intake.auth_required:
                self._intake.authenticate(bearer(context))
            async for raw in requests:
                while commits and (commits[0].done() or len(commits) >= STREAM_COMMITS_IN_FLIGHT):
                    outcomes.append(await _settled(commits.popleft()))
                    if isinstance(outcomes[-1], ShufflerError):
                        raise outcomes[-1]  # stop reading: nothing after it is admitted
                start = time.perf_counter()
                chunks, n = self._admit(raw, context)
                commits.append(asyncio.ensure_future(self._commit(chunks, n, start)))
        except ShufflerError as exc:
            admit_error = exc
        outcomes += [await _settled(task) for task in commits]
        # What was stored is reported as a prefix: the messages before the first
        # failure in stream order (a commit that overlapped a failed one and succeeded
        # is "later", never counted among the first M messages).
        first = next((i for i, o in enumerate(outcomes) if isinstance(o, ShufflerError)), None)
        stored = [o for o in outcomes[:first] if isinstance(o, int)]
        failed = outcomes[first] if first is not None else None
        error = failed if isinstance(failed, ShufflerError) else admit_error
        if error is not None:
            later = sum(o for o in outcomes[len(stored) :] if isinstance(o, int))
            code, details, trailing = stream_rejection(
                error, len(stored), sum(stored), self._metrics, later=later
            )
            context.set_trailing_metadata(trailing)
            await context.abort(code, details)
        return pb.SubmitResponse(accepted=sum(stored))


async def _settled(task: asyncio.Task[int]) -> int | ShufflerError:
    """A commit's outcome: the reports it stored, or the domain error that refused it."""
    try:
        return await task
    except ShufflerError as exc:
        return exc
