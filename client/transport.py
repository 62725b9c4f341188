"""Send reports to a shuffler over gRPC: ``ShufflerClient``.

    from crowdmix.client.transport import ShufflerClient
    with ShufflerClient("shuffler.example:7400", token=TOKEN, tls=True) as sender:
        sender.submit(encoder.encode("example.com"))
        ...                      # sent in the background in batches
    # leaving the block flushes what is queued and closes the channel

Importing this module loads grpc (``pip install 'crowdmix[transport]'``);
``import client`` does not.

- Reports wait in a bounded in-memory queue (``max_queue``); when it is full the
  *oldest* report is dropped and ``dropped`` counts it, so a device that is
  offline for long keeps its newest reports and never grows without bound.
- A background thread sends up to ``batch_size`` reports per request once that
  many are queued or every ``flush_interval`` seconds; ``flush()`` sends
  everything now. Requests of ``columnar_threshold`` reports or more go as
  ``ReportColumns`` (much cheaper for the server to parse than rows).
- Every report carries its report id (``Report.report_id``, drawn when it was
  encoded), and a retry re-sends the same reports with the same ids: the
  aggregator counts an id at most once per collection window, so retrying
  after an unknown outcome cannot count a report twice. Hence every transient
  failure is retried — ``UNAVAILABLE``, ``RESOURCE_EXHAUSTED``,
  ``DEADLINE_EXCEEDED`` and ``ABORTED`` — with exponential backoff and full
  jitter (delays uniform in [0, min(cap, base·2^attempt)]), up to
  ``max_attempts``; then the reports go back to the front of the queue (same
  ids) for the next flush. Other errors (``INVALID_ARGUMENT``,
  ``UNAUTHENTICATED``, ...) cannot succeed on a retry: the request's reports
  are counted in ``failed`` and discarded.

Sealing (``sealing="auto"``, the default): before its first send the client
fetches the shuffler's config (``Shuffler.GetConfig``: each metric's params and
the aggregator's public keys; cached for the lifetime it names, see ``config()``)
and, when the shuffler publishes keys, seals every report to the newest usable
key (``crowdmix.client.sealing``, RFC 9180 HPKE): bits, cohort, params fingerprint and
report id go inside the seal, only the metric name and key id stay outside, so
the shuffler learns who sent a report but not what it says. Reports stay clear
in the queue and are sealed per request, so a refusal ``FAILED_PRECONDITION``
"stale_key" (the key rotated away) makes the client refetch the config once and
reseal with the same report ids. ``sealing="required"`` refuses to send clear
reports to a shuffler that publishes no key (a shuffler that stopped publishing
keys cannot downgrade it); ``sealing="off"`` never fetches the config and sends
clear reports (plaintext setups, google/rappor files, benchmarks). Sealing needs
the ``cryptography`` package (in the ``transport`` extra), imported only then.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from crowdmix.client.errors import CrowdmixClientError, TransportError
from crowdmix.client.report import Report

if TYPE_CHECKING:
    from crowdmix.client.device_config import DeviceConfig

try:
    import grpc
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
    raise ModuleNotFoundError(
        "crowdmix.client.transport needs grpc: pip install 'crowdmix[transport]'", name=exc.name
    ) from None

from crowdmix.client.link import make_channel
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc

__all__ = ["RETRYABLE", "STALE_KEY", "ShufflerClient"]

log = logging.getLogger("crowdmix.client")

#: Transient failures: retried with the same report ids (the aggregator drops repeats).
RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
    }
)
REPORT_ID_BYTES = 16
#: The refusal that means "your key config is stale: refetch it and seal again".
STALE_KEY = "stale_key"
Sealing = Literal["auto", "required", "off"]


def within_message_caps(
    batch: list[Report], config: DeviceConfig
) -> tuple[list[Report], list[Report]]:
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
    now: list[Report] = []
    rest: list[Report] = []
    used: dict[str, int] = {}
    for r in batch:
        cap = caps.get(r.metric)
        if cap is not None:
            if used.get(r.metric, 0) >= cap:
                rest.append(r)
                continue
            used[r.metric] = used.get(r.metric, 0) + 1
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
        client_cert: bytes | None = None,
        client_key: bytes | None = None,
        max_queue: int = 10_000,
        batch_size: int = 500,
        columnar_threshold: int = 16,
        flush_interval: float = 5.0,
        max_attempts: int = 5,
        backoff_base: float = 0.1,
        backoff_cap: float = 5.0,
        timeout: float = 10.0,
        background: bool = True,
        sealing: Sealing = "auto",
    ) -> None:
        for name, v in (("max_queue", max_queue), ("batch_size", batch_size)):
            if v < 1:
                raise ValueError(f"{name} must be positive, got {v}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        if (client_cert is None) != (client_key is None):
            raise ValueError("client_cert and client_key must be given together")
        if sealing not in ("auto", "required", "off"):
            raise ValueError(f"sealing must be 'auto', 'required' or 'off', got {sealing!r}")
        self.sealing: Sealing = sealing
        self._config: DeviceConfig | None = None
        self._config_until = 0.0
        self.target = target
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = make_channel(
            target,
            tls=tls,
            root_certificates=root_certificates,
            client_cert=client_cert,
            client_key=client_key,
        )
        self._stub = crowdmix_pb2_grpc.ShufflerStub(self._channel)
        self._max_queue = max_queue
        self._batch_size = batch_size
        self._columnar_threshold = columnar_threshold
        self._flush_interval = flush_interval
        self._max_attempts = max_attempts
        self._backoff = (backoff_base, backoff_cap)
        self._timeout = timeout
        self._jitter = random.Random()  # timing jitter only; no privacy depends on it
        self._queue: deque[Report] = deque()
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._closed = False
        self.dropped = 0  # reports evicted from the full queue (oldest first)
        self.sent = 0  # reports the shuffler acknowledged
        self.failed = 0  # reports discarded after a non-retryable error
        self.sealed = 0  # reports sent sealed (acknowledged)
        self.refetches = 0  # config refetches after a stale_key refusal
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="crowdmix-sender", daemon=True)
            self._thread.start()

    # -- queue ----------------------------------------------------------------

    def submit(self, report: Report) -> None:
        """Queue one report (never blocks on the network)."""
        self.submit_many((report,))

    def submit_many(self, reports: Iterable[Report]) -> None:
        """Queue reports; ValueError (nothing queued) when a report id is not 16 bytes."""
        reports = list(reports)
        for i, r in enumerate(reports):
            if len(r.report_id) != REPORT_ID_BYTES:
                raise ValueError(
                    f"report {i}: report_id must be {REPORT_ID_BYTES} bytes "
                    f"(crowdmix.client.report.new_report_id), got {len(r.report_id)}"
                )
        with self._cond:
            if self._closed:
                raise TransportError("the client is closed")
            for r in reports:
                if len(self._queue) >= self._max_queue:
                    self._queue.popleft()
                    self.dropped += 1
                self._queue.append(r)
            if len(self._queue) >= self._batch_size:
                self._cond.notify()

    @property
    def queued(self) -> int:
        return len(self._queue)

    # -- sending --------------------------------------------------------------

    def flush(self) -> int:
        """Send everything queued now; returns reports acknowledged by this call.

        Raises ``TransportError`` when a batch could not be delivered (the
        reports stay queued after retryable failures).
        """
        total = 0
        while True:
            n = self._send_one_batch(raise_errors=True)
            if n == 0:
                return total
            total += n

    def _take(self) -> list[Report]:
        with self._cond:
            n = min(self._batch_size, len(self._queue))
            return [self._queue.popleft() for _ in range(n)]

    def _requeue(self, batch: list[Report]) -> None:
        with self._cond:
            room = self._max_queue - len(self._queue)
            keep = batch[-room:] if room > 0 else []
            self.dropped += len(batch) - len(keep)
            self._queue.extendleft(reversed(keep))

    # -- config and sealing -----------------------------------------------------

    def config(self, *, refresh: bool = False) -> DeviceConfig:
        """The shuffler's config (``Shuffler.GetConfig``), cached for its ``cache_seconds``:
        each metric's params (build encoders from them instead of hard-coding params
        that must match the server's) and the aggregator's public keys."""
        now = time.monotonic()
        if refresh or self._config is None or now >= self._config_until:
            from crowdmix.client.device_config import from_proto

            try:
                answer = self._stub.GetConfig(
                    pb.GetConfigRequest(), metadata=self._metadata, timeout=self._timeout
                )
                config = from_proto(answer)
            except CrowdmixClientError as exc:
                raise TransportError(f"shuffler {self.target}: bad config: {exc}") from None
            self._config, self._config_until = config, now + config.cache_seconds
        assert self._config is not None
        return self._config

    def _sealing_config(self) -> DeviceConfig | None:
        """The config to seal with, or None to send clear reports."""
        if self.sealing == "off":
            return None
        try:
            config = self.config()
        except grpc.RpcError as exc:
            old = isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNIMPLEMENTED
            if self.sealing == "auto" and old:  # an older shuffler: no GetConfig, no keys
                return None
            raise
        if config.sealed:
            return config
        if self.sealing == "required":
            raise TransportError(
                f"shuffler {self.target} publishes no aggregator key and sealing='required'"
            )
        return None

    # -- sending --------------------------------------------------------------

    def _send_one_batch(self, *, raise_errors: bool) -> int:
        with self._send_lock:
            batch = self._take()
            if not batch:
                return 0
            delay_cap = self._backoff[0]
            attempt = 0
            resealed = False
            request: pb.SubmitRequest | None = None
            sealed = False
            while True:
                attempt += 1
                try:
                    if request is None:
                        config = self._sealing_config()
                        sealed = config is not None
                        if config is not None:
                            batch, rest = within_message_caps(batch, config)
                            if rest:  # the next call takes them (see within_message_caps)
                                self._requeue(rest)
                        request = (
                            self._request(batch)
                            if config is None
                            else self._sealed_request(batch, config)
                        )
                    resp = self._stub.Submit(
                        request, metadata=self._metadata, timeout=self._timeout
                    )
                except grpc.RpcError as exc:
                    code = exc.code() if isinstance(exc, grpc.Call) else None
                    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                    if (
                        code == grpc.StatusCode.FAILED_PRECONDITION
                        and (details or "").startswith(STALE_KEY)
                        and not resealed
                    ):
                        # the key rotated away: refetch the config once, seal again
                        resealed = True
                        self.refetches += 1
                        self._config = None
                        request = None
                        continue
                    if code in RETRYABLE and attempt < self._max_attempts and not self._closing():
                        time.sleep(self._jitter.uniform(0.0, delay_cap))
                        delay_cap = min(delay_cap * 2, self._backoff[1])
                        continue
                    if code in RETRYABLE or (code is None and request is None):
                        self._requeue(batch)
                    else:
                        self.failed += len(batch)
                    message = f"shuffler {self.target}: {code}: {details}"
                except TransportError as exc:  # cannot seal: no usable key, unknown metric
                    self.failed += len(batch)
                    message = str(exc)
                else:
                    self.sent += int(resp.accepted)
                    if sealed:
                        self.sealed += int(resp.accepted)
                    return len(batch)
                if raise_errors:
                    raise TransportError(message) from None
                log.warning("could not send %d reports: %s", len(batch), message)
                return 0

    def _sealed_request(self, batch: list[Report], config: DeviceConfig) -> pb.SubmitRequest:
        """Every report sealed to the newest usable key (a fresh HPKE encapsulation each)."""
        from crowdmix.client.errors import ParamsError
        from crowdmix.client.sealed import SealingError, choose_key
        from crowdmix.client.sealing import seal_report

        try:
            key = choose_key(config.keys.keys, time.time())
        except SealingError as exc:
            raise TransportError(f"shuffler {self.target}: {exc}") from None
        sealed: list[tuple[str, bytes]] = []
        for r in batch:
            metric = config.metrics.get(r.metric)
            if metric is None:
                raise TransportError(
                    f"shuffler {self.target}: metric {r.metric!r} is not in its config"
                )
            try:
                value = seal_report(
                    key,
                    metric=r.metric,
                    bits=r.bits,
                    cohort=r.cohort,
                    fingerprint=r.params_fingerprint,
                    report_id=r.report_id,  # 16 bytes: submit() refused any other length
                    report_bytes=metric.report_bytes,
                )
            except ParamsError as exc:
                raise TransportError(f"cannot seal a report of {r.metric!r}: {exc}") from None
            sealed.append((r.metric, value.sealed))
        if len(batch) < self._columnar_threshold:
            return pb.SubmitRequest(
                reports=[pb.Report(metric=m, key_id=key.key_id, sealed=v) for m, v in sealed]
            )
        groups: dict[tuple[str, int], list[bytes]] = {}
        for m, v in sealed:
            groups.setdefault((m, len(v)), []).append(v)
        return pb.SubmitRequest(
            columns=[
                pb.ReportColumns(
                    metric=m,
                    count=len(values),
                    key_ids=[key.key_id] * len(values),
                    sealed=b"".join(values),
                    sealed_bytes=n,
                )
                for (m, n), values in groups.items()
            ]
        )

    def _closing(self) -> bool:
        """The background sender stops retrying once close() began; close() flushes."""
        return self._closed and threading.current_thread() is self._thread

    def _request(self, batch: list[Report]) -> pb.SubmitRequest:
        if len(batch) < self._columnar_threshold:
            return pb.SubmitRequest(
                reports=[
                    pb.Report(
                        metric=r.metric,
                        cohort=r.cohort,
                        bits=r.bits,
                        params_fingerprint=r.params_fingerprint,
                        report_id=r.report_id,
                    )
                    for r in batch
                ]
            )
        groups: dict[tuple[str, int, int], tuple[list[int], list[bytes], list[bytes]]] = {}
        for r in batch:
            cohorts, bits, ids = groups.setdefault(
                (r.metric, r.params_fingerprint, len(r.bits)), ([], [], [])
            )
            cohorts.append(r.cohort)
            bits.append(r.bits)
            ids.append(r.report_id)  # 16 bytes: submit_many checked
        return pb.SubmitRequest(
            columns=[
                pb.ReportColumns(
                    metric=metric,
                    params_fingerprint=fp,
                    count=len(cohorts),
                    report_bytes=nb,
                    cohorts=cohorts,
                    bits=b"".join(bits),
                    report_ids=b"".join(ids),
                )
                for (metric, fp, nb), (cohorts, bits, ids) in groups.items()
            ]
        )

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._closed and len(self._queue) < self._batch_size:
                    self._cond.wait(self._flush_interval)
                if self._closed:
                    return
            while self._send_one_batch(raise_errors=False):
                with self._cond:
                    if self._closed or len(self._queue) < self._batch_size:
                        break

    # -- lifecycle ------------------------------------------------------------

    def close(self, *, flush: bool = True) -> None:
        """Stop the background sender, send what is queued (unless ``flush=False``),
        close the channel. Raises ``TransportError`` if the final flush fails."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
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
