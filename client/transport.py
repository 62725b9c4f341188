"""Send reports to a shuffler over gRPC in batches: ``ShufflerClient`` (simulators, bulk senders).

    from crowdmix.client.transport import ShufflerClient
    with ShufflerClient("shuffler.example:7400", token=TOKEN, tls=True) as sender:
        sender.submit(encoder.encode("example.com"))
        sender.flush()   # sends what is queued, batch_size reports a call
    # leaving the block flushes what is still queued and closes the channel

An app embeds ``crowdmix.client.Reporter`` instead (a durable outbox). Needs
``crowdmix[transport]``. Reports wait in a bounded queue (``max_queue``; when full the
oldest is dropped, counted in ``dropped``) until ``flush`` or ``close`` sends them,
``batch_size`` a call, each with its window and report id through every retry; refusals
are acted on as ``crowdmix.client.answers`` says; ``flush`` raises ``TransportError`` for
a batch not delivered. ``sealing="required"`` (default) never falls back to clear.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Literal, TypeVar

from crowdmix.client.answers import RETRY_CODES, Action, Answer, classify
from crowdmix.client.delivery import CachedConfig, check_server_time, read_clocks
from crowdmix.client.errors import CrowdmixClientError, TransportError
from crowdmix.client.report import REPORT_ID_BYTES, Report
from crowdmix.client.target import check_target

if TYPE_CHECKING:
    from crowdmix.core.device_config import DeviceConfig

try:
    import grpc
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
    raise ModuleNotFoundError(
        "crowdmix.client.transport needs grpc: pip install 'crowdmix[transport]'", name=exc.name
    ) from None

from crowdmix.client.link import make_channel
from crowdmix.client.request import COLUMNAR_THRESHOLD, submit_request
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc

__all__ = ["RETRYABLE", "ShufflerClient", "within_message_caps"]

#: Failures retried with the same report ids (``crowdmix.client.answers``: RETRY).
RETRYABLE = frozenset(grpc.StatusCode[name] for name in RETRY_CODES)
Sealing = Literal["required", "off"]
T = TypeVar("T")
#: A queued report and the window it names (None: the current one when first sent).
Item = tuple[Report, int | None]


def within_message_caps(
    batch: list[T],
    config: DeviceConfig,
    metric_of: Callable[[T], str] = lambda r: r.metric,  # type: ignore[attr-defined]
) -> tuple[list[T], list[T]]:
    """Split ``batch`` so that no call carries more reports of a shuffled-histogram
    metric than one device sends per window (1 + m): the shuffler refuses such a
    call (``too_many_messages``). Returns (this call's reports, the rest), each in order."""
    caps = {
        name: m.histogram.max_messages
        for name, m in config.metrics.items()
        if m.histogram is not None
    }
    if not caps:
        return batch, []
    now: list[T] = []
    rest: list[T] = []
    used: dict[str, int] = {}
    for r in batch:
        metric = metric_of(r)
        cap = caps.get(metric)
        if cap is not None:
            if used.get(metric, 0) >= cap:
                rest.append(r)
                continue
            used[metric] = used.get(metric, 0) + 1
        now.append(r)
    return now, rest


class ShufflerClient:
    """Queues reports and delivers them to a shuffler in batches, with retries."""

    def __init__(
        self,
        target: str,
        token: str | None = None,
        *,
        tls: bool = False,
        root_certificates: bytes | None = None,
        max_queue: int = 10_000,
        batch_size: int = 500,
        columnar_threshold: int = COLUMNAR_THRESHOLD,
        max_attempts: int = 5,
        backoff_base: float = 0.1,
        backoff_cap: float = 5.0,
        timeout: float = 10.0,
        sealing: Sealing = "required",
    ) -> None:
        for name, v in (("max_queue", max_queue), ("batch_size", batch_size)):
            if v < 1:
                raise ValueError(f"{name} must be positive, got {v}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        if sealing not in ("required", "off"):
            raise ValueError(f"sealing must be 'required' or 'off', got {sealing!r}")
        self.target = check_target(target)
        self.sealing: Sealing = sealing
        self._cached: CachedConfig | None = None
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = make_channel(target, tls=tls, root_certificates=root_certificates)
        self._stub = crowdmix_pb2_grpc.ShufflerStub(self._channel)
        self._max_queue = max_queue
        self._batch_size = batch_size
        self._columnar_threshold = columnar_threshold
        self._max_attempts = max_attempts
        self._backoff = (backoff_base, backoff_cap)
        self._timeout = timeout
        self._jitter = random.Random()  # timing jitter only; no privacy depends on it
        self._queue: deque[Item] = deque()
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._closed = False
        self.dropped = 0  # reports evicted from the full queue (oldest first)
        self.sent = 0  # reports the shuffler acknowledged
        self.failed = 0  # reports discarded after a refusal retrying cannot cure
        self.sealed = 0  # reports sent sealed (acknowledged)
        self.refetches = 0  # config refetches after a refusal that asked for one

    # -- queue ----------------------------------------------------------------

    def submit(self, report: Report, *, window: int | None = None) -> None:
        """Queue one report (never blocks on the network); see ``submit_many``."""
        self.submit_many((report,), window=window)

    def submit_many(self, reports: Iterable[Report], *, window: int | None = None) -> None:
        """Queue reports naming collection window ``window`` (None: the current one when
        first sent); ValueError (nothing queued) when a report id is not 16 bytes."""
        reports = list(reports)
        for i, r in enumerate(reports):
            if len(r.report_id) != REPORT_ID_BYTES:
                raise ValueError(
                    f"report {i}: report_id must be {REPORT_ID_BYTES} bytes "
                    f"(crowdmix.client.report.new_report_id), got {len(r.report_id)}"
                )
        with self._lock:
            if self._closed:
                raise TransportError("the client is closed")
            for r in reports:
                if len(self._queue) >= self._max_queue:
                    self._queue.popleft()
                    self.dropped += 1
                self._queue.append((r, window))

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _take(self) -> list[Item]:
        with self._lock:
            n = min(self._batch_size, len(self._queue))
            return [self._queue.popleft() for _ in range(n)]

    def _requeue(self, batch: list[Item]) -> None:
        with self._lock:
            room = self._max_queue - len(self._queue)
            keep = batch[-room:] if room > 0 else []
            self.dropped += len(batch) - len(keep)
            self._queue.extendleft(reversed(keep))

    # -- config ---------------------------------------------------------------

    def config(self, *, refresh: bool = False) -> DeviceConfig:
        """The shuffler's config (``Shuffler.GetConfig``), cached for its ``cache_seconds``:
        each metric's params (build encoders from them instead of hard-coding params
        that must match the server's), the window and the aggregator's public keys.
        ``grpc.RpcError`` when the call fails, ``TransportError`` for a bad answer."""
        if refresh or self._cached is None or self._cached.expired(read_clocks()):
            from crowdmix.client.device_config import from_proto

            answer = self._stub.GetConfig(
                pb.GetConfigRequest(), metadata=self._metadata, timeout=self._timeout
            )
            received = read_clocks()
            try:
                config = from_proto(answer)
                server_time = check_server_time(answer.server_time)
            except (CrowdmixClientError, ValueError) as exc:
                raise TransportError(f"shuffler {self.target}: bad config: {exc}") from None
            self._cached = CachedConfig(config, server_time, received)
        assert self._cached is not None
        return self._cached.config

    # -- sending --------------------------------------------------------------

    def flush(self) -> int:
        """Send everything queued now; returns reports acknowledged by this call.

        Raises ``TransportError`` when a batch could not be delivered (the
        reports stay queued after retryable failures).
        """
        total = 0
        while True:
            n = self._send_one_batch()
            if n == 0:
                return total
            total += n

    def _request(self, batch: list[Item]) -> tuple[pb.SubmitRequest, list[Item]]:
        """The request for ``batch``, and the batch with every report's window fixed
        (a report over a histogram's per-call cap goes back to the queue)."""
        config = self.config()
        assert self._cached is not None
        if any(w is None for _, w in batch):
            window = self._cached.window(read_clocks())
            batch = [(r, window if w is None else w) for r, w in batch]
        batch, rest = within_message_caps(batch, config, lambda item: item[0].metric)
        if rest:  # the next call takes them (see within_message_caps)
            self._requeue(rest)
        key = None
        if self.sealing == "required":
            from crowdmix.core.sealed import SealingError, choose_key

            try:
                key = choose_key(config.keys.keys, self._cached.server_now(read_clocks()))
            except SealingError:
                raise _Refused(
                    Answer(
                        Action.REFETCH,
                        "no_key",
                        f"{config.why_unsealed(self.target)} "
                        "(sealing='required' never sends clear reports)",
                        after_refetch=Action.FATAL,
                    )
                ) from None
        request = submit_request(
            [(r, w) for r, w in batch if w is not None],  # every window is fixed now
            key=key,
            report_bytes={n: m.report_bytes for n, m in config.metrics.items()},
            columnar_threshold=self._columnar_threshold,
            round_bound=frozenset(
                n for n, m in config.metrics.items() if m.heavy_hitters is not None
            ),
        )
        return request, batch

    def _send_one_batch(self) -> int:
        with self._send_lock:
            batch = self._take()
            if not batch:
                return 0
            delay_cap = self._backoff[0]
            attempt = 0
            refetched = False
            while True:
                attempt += 1
                try:
                    request, batch = self._request(batch)
                    resp = self._stub.Submit(
                        request, metadata=self._metadata, timeout=self._timeout
                    )
                except grpc.RpcError as exc:  # Submit, or GetConfig for the window or keys
                    call = isinstance(exc, grpc.Call)
                    answer = classify(
                        exc.code().name if call else "UNKNOWN",  # type: ignore[attr-defined]
                        (exc.details() if call else str(exc)) or "",  # type: ignore[attr-defined]
                    )
                except _Refused as exc:
                    answer = exc.answer
                except CrowdmixClientError as exc:  # a bad config, a report that cannot be sealed
                    answer = Answer(Action.DROP, "unsendable", str(exc))
                else:
                    self.sent += int(resp.accepted)
                    if self.sealing == "required":
                        self.sealed += int(resp.accepted)
                    return len(batch)
                action = answer.action
                if action is Action.REFETCH:
                    if not refetched:
                        refetched = True
                        self.refetches += 1
                        self._cached = None
                        continue
                    action = answer.after_refetch
                if action is Action.RETRY and attempt < self._max_attempts:
                    time.sleep(self._jitter.uniform(0.0, delay_cap))
                    delay_cap = min(delay_cap * 2, self._backoff[1])
                    continue
                if action is Action.RETRY:
                    self._requeue(batch)
                else:
                    self.failed += len(batch)
                raise TransportError(f"shuffler {self.target}: {answer.message}") from None

    # -- lifecycle ------------------------------------------------------------

    def close(self, *, flush: bool = True) -> None:
        """Send what is queued (unless ``flush=False``) and close the channel. Raises
        ``TransportError`` if the final flush fails."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if flush:
                self.flush()
        finally:
            self._channel.close()

    def __enter__(self) -> ShufflerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(flush=exc_type is None)


class _Refused(Exception):
    """A request not sent, for a reason the answer table names."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.message)
        self.answer = answer
