"""Release and forward: thresholding, disposal, permutation, Aggregator.Ingest.

``Releaser.run_once`` releases a pending queue (metric × window × fingerprint) when
``max_batch`` reports are pending, or ``min_batch`` are and the queue has waited
``max_delay``, or at shut-down with ``min_batch``. A metric with ``release = "window"``
goes out once per window, in ONE batch, after the window closed (``WindowRule.closed_at``)
and ``release_grace_seconds`` passed. Fewer than ``min_batch`` are never released (the
store's ``take`` re-checks atomically). A batch is permuted with ``secure_permutation``
(CSPRNG) before each send and deleted only after the aggregator acknowledged it; failures
retry with backoff; a queue's batches go out two at a time. In-flight batches are
re-offered at start-up (``recover``) and while running (``sweep_inflight``, after
``inflight_retry_seconds``); the aggregator applies a batch id once. Batches older than
``disposal_days`` are discarded, never forwarded. Why: docs/design.md, "Shuffler".
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from crowdmix.core.log_limit import RepeatedFailure
from crowdmix.core.registry import Registry, window_batch_limit
from crowdmix.shuffler.config import INFLIGHT_RETRY_SECONDS
from crowdmix.shuffler.errors import ForwardError, ShufflerError
from crowdmix.shuffler.metrics import ShufflerMetrics
from crowdmix.shuffler.shuffle import RandomBytes, secure_permutation
from crowdmix.shuffler.store import BATCH_ID_BYTES, InFlightBatch, QueueKey, ShufflerStore
from crowdmix.shuffler.windows import WindowRule

__all__ = ["Releaser", "Sender"]

log = logging.getLogger("crowdmix.shuffler")

# Sends one batch to the aggregator or raises ForwardError; the gRPC one is
# shuffler.aggregator_client.AggregatorSender (this module imports no grpc).
Sender = Callable[[InFlightBatch], None]


class Releaser:
    """Turns pending queues into shuffled batches and forwards them (one thread, with up
    to ``forwards_in_flight`` batches of a queue being sent at once)."""

    def __init__(
        self,
        registry: Registry,
        store: ShufflerStore,
        send: Sender,
        *,
        clock: Callable[[], float] = time.time,
        windows: WindowRule | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        random_bytes: RandomBytes = os.urandom,
        metrics: ShufflerMetrics | None = None,
        on_pending: Callable[[int], None] | None = None,
        backoff: tuple[float, float] = (0.05, 5.0),
        parked_retry_seconds: float = 600.0,
        inflight_retry_seconds: float = INFLIGHT_RETRY_SECONDS,
        forwards_in_flight: int = 2,
    ) -> None:
        if forwards_in_flight < 1:
            raise ValueError(f"forwards_in_flight must be >= 1, got {forwards_in_flight}")
        if not 0 < inflight_retry_seconds < float("inf"):
            raise ValueError(
                f"inflight_retry_seconds must be a positive number, got {inflight_retry_seconds!r}"
            )
        timeout = getattr(send, "timeout", None)
        if isinstance(timeout, int | float) and inflight_retry_seconds <= timeout:
            raise ValueError(
                f"inflight_retry_seconds ({inflight_retry_seconds}) must exceed the forward "
                f"timeout ({timeout}): else a batch still being sent is sent again"
            )
        self._registry = registry
        self._store = store
        self._send = send
        self._clock = clock
        # the intake's accept rule: a window released whole goes once it is closed
        self._windows = windows or WindowRule(window_seconds=registry.window_seconds)
        self._monotonic = monotonic
        self._random_bytes = random_bytes
        self._metrics = metrics
        self._on_pending = on_pending
        self._backoff = backoff
        self._since: dict[tuple[str, QueueKey], float] = {}
        # batch id -> metric, for batches the aggregator refused outright (INVALID_ARGUMENT,
        # FAILED_PRECONDITION): they stay in flight and are offered again every
        # ``parked_retry_seconds`` (an operator may have fixed the aggregator's registry)
        # and at start-up, never in a tight loop; they are disposed with their window.
        self.parked: dict[bytes, str] = {}
        self._parked_retry = parked_retry_seconds
        self._parked_since = monotonic()
        # batch id -> (metric, when this process first saw it in flight), from the last sweep
        self._inflight_retry = inflight_retry_seconds
        self._seen_inflight: dict[bytes, tuple[str, float]] = {}
        self._last_sweep = monotonic()
        # A queue's batches are forwarded up to this many at a time: the next one is taken,
        # permuted and sent while the aggregator counts the one before (one at a time, each
        # side waits for the other). Every forward of a pass ends before the pass does.
        # Only while the aggregator takes batches: after a failed send (and at start-up)
        # one batch at a time, so an outage leaves one batch in flight, not several.
        self._forwards_in_flight = forwards_in_flight
        self._aggregator_answering = False

    # -- policy -------------------------------------------------------------

    def _expired(self, metric: str, window: int) -> bool:
        """True when the whole window lies further back than the disposal age."""
        age = self._registry[metric].shuffle.disposal_days * 86400.0
        window_end = (window + 1) * self._registry.window_seconds
        return window_end <= self._clock() - age

    # -- loop ---------------------------------------------------------------

    def recover(self, give_up: Callable[[], bool]) -> int:
        """Forward in-flight batches found in the store (left by a crash); returns how many."""
        done = 0
        for metric in self._registry.metrics:
            for batch_id in self._store.inflight_ids(metric):
                batch = self._store.load_inflight(metric, batch_id)
                if batch is not None:
                    log.info(
                        "re-forwarding in-flight batch of %s (%d reports)",
                        metric,
                        batch.chunk.count,
                    )
                    done += self.forward(batch, give_up)
        return done

    def sweep_inflight(self, give_up: Callable[[], bool], *, min_age: float) -> int:
        """Forward every in-flight batch (not parked) first seen at least ``min_age``
        seconds ago by an earlier sweep (``min_age=0``: all of them); returns how many
        were acknowledged. This process's own batches are never in flight between its
        passes (it forwards each one it takes before the next pass), so what a sweep
        finds was stranded (a lost reply of the move script) or is another process's."""
        now = self._monotonic()
        self._last_sweep = now
        current: dict[bytes, tuple[str, float]] = {}
        for metric in self._registry.metrics:
            for batch_id in self._store.inflight_ids(metric):
                if batch_id not in self.parked:
                    seen = self._seen_inflight.get(batch_id)
                    current[batch_id] = (metric, now if seen is None else seen[1])
        self._seen_inflight = current
        done = 0
        for batch_id, (metric, first_seen) in list(current.items()):
            if now - first_seen < min_age:
                continue
            batch = self._store.load_inflight(metric, batch_id)
            self._seen_inflight.pop(batch_id, None)
            if batch is None:  # acknowledged meanwhile
                continue
            log.info(
                "re-forwarding a batch of %s found in flight (%d reports)",
                metric,
                batch.chunk.count,
            )
            done += self.forward(batch, give_up)
            if give_up():
                break
        return done

    def run_once(self, give_up: Callable[[], bool], *, final: bool = False) -> int:
        """One pass over every pending queue; returns the batches forwarded."""
        forwarded = 0
        total_pending = 0
        now = self._monotonic()
        for name, metric in self._registry.metrics.items():
            policy = metric.shuffle
            pending = self._store.pending(name)
            metric_pending = 0
            for key, count in sorted(pending.items()):
                if self._expired(name, key.window):
                    n = self._store.dispose(name, key)
                    self._since.pop((name, key), None)
                    log.info("disposed %d reports of %s (window %d too old)", n, name, key.window)
                    if self._metrics is not None:
                        self._metrics.disposed_reports.labels(name).inc(n)
                    continue
                if policy.release == "window":
                    taken, done = self._release_window(name, key, count, give_up)
                    forwarded += done
                    metric_pending += count - taken
                    continue
                since = self._since.setdefault((name, key), now)
                sending: deque[Future[int]] = deque()
                try:
                    while count >= policy.min_batch and (
                        final
                        or count >= policy.max_batch
                        or now - since >= policy.max_delay_seconds
                    ):
                        while sending and (
                            len(sending) >= self._forwards_in_flight
                            or not self._aggregator_answering
                        ):
                            forwarded += sending.popleft().result()
                        batch = self._store.take(
                            name,
                            key,
                            min_batch=policy.min_batch,
                            max_batch=policy.max_batch,
                            batch_id=os.urandom(BATCH_ID_BYTES),
                        )
                        if batch is None:  # another process took them first
                            break
                        count -= batch.chunk.count
                        since = self._since[(name, key)] = now
                        sending.append(self._forward_soon(batch, give_up))
                        if give_up():
                            break
                finally:  # every batch taken is forwarded (or left in flight) in this pass
                    errors = []
                    for pending_forward in sending:
                        try:
                            forwarded += pending_forward.result()
                        except ShufflerError as exc:
                            errors.append(exc)
                    if errors:
                        raise errors[0]
                metric_pending += count
            for stale in [k for k in self._since if k[0] == name and k[1] not in pending]:
                del self._since[stale]
            if self._metrics is not None:
                self._metrics.pending_reports.labels(name).set(metric_pending)
            total_pending += metric_pending
        if self._on_pending is not None:
            self._on_pending(total_pending)
        return forwarded

    def _forward_soon(self, batch: InFlightBatch, give_up: Callable[[], bool]) -> Future[int]:
        """``forward`` on a thread of its own (at once with one in flight). A daemon thread,
        as the releaser's is (a pool's workers are not: a process ending without stopping
        the releaser would wait at exit for a forward retrying an unreachable aggregator);
        a batch is large, so a thread per batch costs nothing that counts."""
        done: Future[int] = Future()

        def run() -> None:
            try:
                done.set_result(self.forward(batch, give_up))
            except BaseException as exc:  # the releaser thread raises it from result()
                done.set_exception(exc)

        if self._forwards_in_flight == 1:  # one at a time: on the releaser's thread
            run()
        else:
            threading.Thread(target=run, name="shuffler-forward", daemon=True).start()
        return done

    def _window_due(self, metric: str, window: int) -> bool:
        """A window released whole is due ``release_grace_seconds`` after it closed (the
        intake refuses it from then on: ``WindowRule.closed_at``)."""
        grace = self._registry[metric].shuffle.release_grace_seconds
        return self._windows.closed_at(window) + grace <= self._clock()

    def _release_window(
        self, name: str, key: QueueKey, count: int, give_up: Callable[[], bool]
    ) -> tuple[int, int]:
        """Release a due window of a ``release = "window"`` metric whole: one batch of
        everything pending in it (at least ``min_batch``), never cut at ``max_batch``.
        Only a window larger than one aggregator batch carries (``window_batch_limit``)
        is split, into equal parts, with an error in the log. Returns the reports taken
        and the batches acknowledged."""
        policy = self._registry[name].shuffle
        if count < policy.min_batch or not self._window_due(name, key.window):
            return 0, 0  # not yet (the final pass at shut-down does not hurry it either)
        limit = window_batch_limit(self._registry[name].report_bytes)
        if count > policy.max_batch:
            log.warning(
                "window %d of %s holds %d reports, more than its max_batch %d: "
                "released in one batch all the same",
                key.window,
                name,
                count,
                policy.max_batch,
            )
        parts = -(-count // limit)
        if parts > 1:
            log.error(
                "window %d of %s holds %d reports, more than one aggregator batch carries "
                "(%d): released in %d equal batches, each a smaller crowd",
                key.window,
                name,
                count,
                limit,
                parts,
            )
        taken = done = 0
        while count - taken >= policy.min_batch:
            left = count - taken
            # one part: everything, including reports appended since ``pending`` was read
            size = limit if parts == 1 else -(-left // -(-left // limit))
            batch = self._store.take(
                name,
                key,
                min_batch=policy.min_batch,
                max_batch=size,
                batch_id=os.urandom(BATCH_ID_BYTES),
            )
            if batch is None:  # another process took them first
                break
            taken += batch.chunk.count
            done += self.forward(batch, give_up)
            if give_up() or parts == 1:
                break
        return min(taken, count), done

    def forward(self, batch: InFlightBatch, give_up: Callable[[], bool]) -> int:
        """Permute and send until acknowledged (→ 1) or ``give_up()`` (→ 0, batch stays)."""
        if self._expired(batch.metric, batch.key.window):
            self._store.ack(batch.metric, batch.batch_id)
            log.info("disposed an in-flight batch of %s (window too old)", batch.metric)
            if self._metrics is not None:
                self._metrics.disposed_reports.labels(batch.metric).inc(batch.chunk.count)
            return 0
        delay = self._backoff[0]
        while True:
            order = secure_permutation(batch.chunk.count, self._random_bytes)
            shuffled = InFlightBatch(
                batch_id=batch.batch_id,
                metric=batch.metric,
                key=batch.key,
                chunk=batch.chunk.select(order),
            )
            try:
                self._send(shuffled)
            except ForwardError as exc:
                self._aggregator_answering = False
                if self._metrics is not None:
                    self._metrics.forward_failures.inc()
                if not exc.retryable:
                    self._park(batch.batch_id, batch.metric)
                    log.error(
                        "aggregator refused a batch of %s (%d reports): %s; it stays in flight "
                        "and is offered again in %.0f s and at the next start-up",
                        batch.metric,
                        batch.chunk.count,
                        exc,
                        self._parked_retry,
                    )
                    return 0
                log.warning("aggregator did not take a batch of %s: %s", batch.metric, exc)
                if give_up():
                    return 0
                time.sleep(delay)
                delay = min(delay * 2, self._backoff[1])
                continue
            self._aggregator_answering = True
            self._store.ack(batch.metric, batch.batch_id)
            if self._metrics is not None:
                self._metrics.batches_forwarded.labels(batch.metric).inc()
                self._metrics.reports_forwarded.labels(batch.metric).inc(batch.chunk.count)
            log.info("forwarded a batch of %d %s reports", batch.chunk.count, batch.metric)
            return 1

    def _park(self, batch_id: bytes, metric: str) -> None:
        if not self.parked:
            self._parked_since = self._monotonic()
        self.parked[batch_id] = metric
        if self._metrics is not None:
            self._metrics.parked_batches.set(len(self.parked))

    def retry_parked(self, give_up: Callable[[], bool]) -> int:
        """Offer every parked batch once more; returns how many were acknowledged."""
        self._parked_since = self._monotonic()
        done = 0
        try:
            for batch_id, metric in list(self.parked.items()):
                # a store error here leaves this and the later batches parked
                batch = self._store.load_inflight(metric, batch_id)
                del self.parked[batch_id]  # forward() parks it again if refused again
                if batch is None:  # acknowledged meanwhile (by another process)
                    continue
                log.info("offering a refused batch of %s again", metric)
                try:
                    done += self.forward(batch, give_up)
                except BaseException:
                    self.parked.setdefault(batch_id, metric)  # still in flight: keep it
                    raise
        finally:
            if self._metrics is not None:
                self._metrics.parked_batches.set(len(self.parked))
        return done

    def run(self, stop: threading.Event, *, tick: float, grace: float) -> None:
        """Recover, then release until ``stop``; then a final pass bounded by ``grace``."""
        deadline: list[float] = []

        def give_up() -> bool:
            if not stop.is_set():
                return False
            if not deadline:
                deadline.append(self._monotonic() + grace)
            return self._monotonic() > deadline[0]

        try:
            self.recover(give_up)
        except ShufflerError as exc:  # the sweeps below find them again
            log.warning("start-up recovery failed: %s", exc)
        # a store outage fails every pass (20 a second): logged when it starts, once a
        # minute while it lasts, and when it ends
        passes = RepeatedFailure(log, "release pass")
        while not stop.is_set():
            try:
                self.run_once(give_up)
                if self.parked and (self._monotonic() - self._parked_since >= self._parked_retry):
                    self.retry_parked(give_up)
                if self._monotonic() - self._last_sweep >= self._inflight_retry / 2:
                    self.sweep_inflight(give_up, min_age=self._inflight_retry)
            except ShufflerError as exc:
                passes.failed(exc)
            else:
                passes.succeeded()
            stop.wait(tick)
        # the final pass: release what may be released, then every batch still in flight
        final_steps: tuple[Callable[[], int], ...] = (
            lambda: self.run_once(give_up, final=True),
            lambda: self.sweep_inflight(give_up, min_age=0.0),
        )
        for final_step in final_steps:
            if give_up():
                break
            try:
                final_step()
            except ShufflerError as exc:
                log.error("final release pass failed: %s", exc)
