"""The asyncio front end (``--server aio``): grpc.aio on an event loop thread.

Same servicer logic as ``shuffler.servicer`` (parse, ``Intake.admit``, status
mapping) but a request waiting for its group commit holds no thread: it awaits
a future. One drain task does the store writes: whatever queued while the
previous write ran goes into the next one (the same group commit as the sync
server's leader/follower scheme). For Redis over TCP and for the memory store
the write itself runs on the loop (``AsyncCommitter``), so the device-style
path has no thread hand-off of ours at all. Chosen by measurement, see
BENCHMARKS.md.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protos import crowdmix_pb2 as pb
from shuffler.columns import Pending
from shuffler.commit import GroupCommitter
from shuffler.errors import ShufflerError, StoreOutcomeUnknown, StoreUnavailable
from shuffler.intake import Intake
from shuffler.metrics import ShufflerMetrics
from shuffler.serde import request_to_columns
from shuffler.servicer import (
    SERVICE_NAME,
    bearer,
    get_config,
    parse,
    rejection,
    shuffler_handler,
    stream_rejection,
)
from shuffler.store import AsyncAppender, async_appender

__all__ = ["AioFront", "AsyncCommitter"]

log = logging.getLogger("crowdmix.shuffler")

Parts = dict[tuple[str, int], Pending]

# A SubmitStream's commits pending at once: enough to overlap reading and writing,
# few enough that a stream holds at most this many messages in memory.
STREAM_COMMITS_IN_FLIGHT = 2


def _settle(
    batch: Sequence[tuple[Parts, asyncio.Future[None]]], error: ShufflerError | None
) -> None:
    for _, fut in batch:
        if fut.done():  # the caller went away; its reports are stored anyway
            continue
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)


class AsyncCommitter:
    """Group commit for coroutines: one store write at a time.

    Requests queue a future; a single drain task writes whatever queued while
    the previous write ran. With a store that offers an event-loop appender
    (``shuffler.store.async_appender``: Redis over plain TCP, memory) the write
    runs on the loop itself, so a request costs no thread hand-off; otherwise
    it runs in one writer thread.
    """

    def __init__(self, committer: GroupCommitter, appender: AsyncAppender | None) -> None:
        self._committer = committer
        self._appender = appender
        self._queue: list[tuple[Parts, asyncio.Future[None]]] = []
        self._writing = False
        self._closed = False
        self._executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="shuffler-write")
            if appender is None
            else None
        )
        self._task: asyncio.Task[None] | None = None

    async def commit(self, parts: Parts) -> None:
        if self._closed:
            raise StoreUnavailable("the shuffler is shutting down")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queue.append((parts, fut))
        if not self._writing:
            self._writing = True
            self._task = loop.create_task(self._drain())
        await fut

    async def _write(self, requests: Sequence[Parts]) -> ShufflerError | None:
        try:
            if self._appender is None:
                assert self._executor is not None
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._executor, self._committer.write, requests)
            else:
                writes = self._committer.prepare(requests)
                await self._appender.append(writes)
                self._committer.committed(writes)
        except ShufflerError as exc:
            return exc
        except Exception as exc:  # a store bug must fail the requests, not hang them
            log.exception("store write failed")
            # the write may or may not have happened: not an invitation to retry
            return StoreOutcomeUnknown(f"store write failed: {type(exc).__name__}")
        return None

    async def _drain(self) -> None:
        delay = self._committer.max_delay
        batch: list[tuple[Parts, asyncio.Future[None]]] = []
        try:
            while self._queue:
                if delay > 0:
                    await asyncio.sleep(delay)  # let more requests join this write
                batch, self._queue = self._queue, []
                error = await self._write([parts for parts, _ in batch])
                _settle(batch, error)
                batch = []
        except BaseException:
            # cancelled (the loop is being torn down): never leave a request waiting
            _settle(batch, StoreOutcomeUnknown("the store write was interrupted"))
            _settle(self._queue, StoreUnavailable("the shuffler is shutting down"))
            self._queue = []
            raise
        finally:
            self._writing = False

    async def aclose(self) -> None:
        """Refuse new commits, let the write in progress finish, close the connection."""
        self._closed = True
        if self._task is not None:
            await asyncio.shield(self._task)
        if self._appender is not None:
            await self._appender.aclose()
        if self._executor is not None:
            self._executor.shutdown(wait=True)


class AsyncShufflerServicer:
    def __init__(self, intake: Intake, committer: AsyncCommitter, metrics: ShufflerMetrics) -> None:
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
        self._metrics.accepted_reports.inc(n)
        self._metrics.accepted_requests.inc()
        self._metrics.request_latency.observe(time.perf_counter() - start)
        return n

    async def _submit_one(self, raw: bytes, context: Any) -> int:
        start = time.perf_counter()
        chunks, n = self._admit(raw, context)
        return await self._commit(chunks, n, start)

    async def Submit(self, raw: bytes, context: Any) -> pb.SubmitResponse:
        try:
            if self._intake.auth_required:
                self._intake.authenticate(bearer(context))
            accepted = await self._submit_one(raw, context)
        except ShufflerError as exc:
            await context.abort(*rejection(exc, self._metrics))
        return pb.SubmitResponse(accepted=accepted)

    async def SubmitStream(self, requests: AsyncIterator[bytes], context: Any) -> pb.SubmitResponse:
        """Each message is validated as it arrives and its commit overlaps the reading
        of the next one (a stream pays one gather window, not one per message), with at
        most ``STREAM_COMMITS_IN_FLIGHT`` commits pending, so a stream cannot queue
        unbounded memory behind a slow store. The first failure (a bad message or a
        failed commit) stops the stream; nothing read after it is stored."""
        total = messages = 0
        error: ShufflerError | None = None
        commits: deque[asyncio.Task[int]] = deque()
        try:
            if self._intake.auth_required:
                self._intake.authenticate(bearer(context))
            async for raw in requests:
                while commits and (commits[0].done() or len(commits) >= STREAM_COMMITS_IN_FLIGHT):
                    total += await commits.popleft()  # raises if that commit failed
                    messages += 1
                start = time.perf_counter()
                chunks, n = self._admit(raw, context)
                commits.append(asyncio.ensure_future(self._commit(chunks, n, start)))
        except ShufflerError as exc:
            error = exc
        for result in await asyncio.gather(*commits, return_exceptions=True):
            if isinstance(result, ShufflerError):
                error = error or result
            elif isinstance(result, BaseException):
                raise result
            else:
                total += result
                messages += 1
        if error is not None:
            code, details, trailing = stream_rejection(error, messages, total, self._metrics)
            context.set_trailing_metadata(trailing)
            await context.abort(code, details)
        return pb.SubmitResponse(accepted=total)


class AioFront:
    """A grpc.aio server on its own event-loop thread, driven from synchronous code."""

    def __init__(
        self,
        intake: Intake,
        committer: GroupCommitter,
        metrics: ShufflerMetrics,
        *,
        options: list[tuple[str, Any]],
        max_concurrent_rpcs: int,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="shuffler-aio", daemon=True
        )
        self._thread.start()
        self._committer = AsyncCommitter(committer, async_appender(committer.store))
        servicer = AsyncShufflerServicer(intake, self._committer, metrics)

        async def build() -> tuple[Any, Any]:
            server = grpc.aio.server(options=options, maximum_concurrent_rpcs=max_concurrent_rpcs)
            server.add_generic_rpc_handlers((servicer.handler(),))
            health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            return server, health_servicer

        self._server, self._health = self._run(build())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def add_port(self, listen: str, creds: grpc.ServerCredentials | None) -> int:
        if creds is None:
            return int(self._server.add_insecure_port(listen))
        return int(self._server.add_secure_port(listen, creds))

    def start(self) -> None:
        async def start() -> None:
            await self._server.start()
            for name in ("", SERVICE_NAME):
                await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)

        self._run(start())

    def enter_shutdown(self) -> None:
        """Health checks answer NOT_SERVING (load balancers move devices elsewhere)."""
        self._run(self._health.enter_graceful_shutdown())

    def stop(self, grace: float) -> None:
        """Refuse new commits and finish the write in progress before the server stops:
        gRPC answers calls it cancels at the end of ``grace`` UNAVAILABLE ("retry"), so
        no call may still be waiting on a write that could then succeed."""

        async def stop() -> None:
            await self._health.enter_graceful_shutdown()
            try:
                await self._committer.aclose()
            finally:  # a store that fails to close must not keep the server up
                await self._server.stop(grace)

        try:
            self._run(stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
