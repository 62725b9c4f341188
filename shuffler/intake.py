"""The domain side of Submit: authenticate, check the windows, validate, admit.

``Intake.admit`` is what the gRPC servicer calls after turning protobufs into
``ColumnsIn`` / ``RowsIn``; it raises the ``RequestRejected`` family (mapped to status codes
in ``crowdmix.shuffler.servicer``) and returns what to hand to the group commit
(``crowdmix.shuffler.commit``) and how many reports that is.

The connection key given for rate limiting (the transport's peer string) is
kept in memory only while the connection is active, never stored or logged.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Sequence

from crowdmix.core.registry import Registry
from crowdmix.shuffler.columns import Pending
from crowdmix.shuffler.config_service import ConfigService, PublishedKeys, RoundFile
from crowdmix.shuffler.errors import ConfigError, Overloaded, Unauthenticated
from crowdmix.shuffler.validation import (
    ColumnsIn,
    RowsIn,
    SealedIn,
    check_rounds,
    refuse_unsealed_histograms,
    validate,
)
from crowdmix.shuffler.windows import WindowRule

__all__ = ["Intake", "RateLimiter"]


class RateLimiter:
    """Token bucket per connection: ``rate`` reports/s, bucket of ``rate`` (1 s of burst).

    A request is admitted while the bucket holds at least min(n, capacity) and
    then debited n, possibly below zero: one request larger than a second's
    allowance still gets through, and the average stays at ``rate``.
    """

    def __init__(self, rate: float, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}
        self._last_prune = monotonic()

    def admit(self, connection: str, n: int) -> bool:
        now = self._monotonic()
        with self._lock:
            tokens, last = self._buckets.get(connection, (self.rate, now))
            tokens = min(self.rate, tokens + (now - last) * self.rate)
            if tokens < min(n, self.rate):
                self._buckets[connection] = (tokens, now)
                return False
            self._buckets[connection] = (tokens - n, now)
            if now - self._last_prune > 60.0:
                # forget connections idle long enough to have a full bucket again
                self._buckets = {
                    c: (t, at) for c, (t, at) in self._buckets.items() if now - at < 60.0
                }
                self._last_prune = now
        return True


class Intake:
    """Authenticate → window rule → validate → rate limit → buffer bound (then the
    group commit). ``clock`` is the one the windows are judged and GetConfig answered by."""

    def __init__(
        self,
        registry: Registry,
        *,
        tokens: frozenset[str] | None = None,
        max_reports_per_request: int = 100_000,
        rate_limit_reports: float = 0.0,
        max_buffered_reports: int = 50_000_000,
        keys: PublishedKeys | None = None,
        config_cache_seconds: int = 3600,
        window_tolerance: int = 1,
        max_clock_skew_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
        rounds: RoundFile | None = None,
    ) -> None:
        if keys is None:
            refuse_unsealed_histograms(registry)
        windowed = sorted(n for n, m in registry.metrics.items() if m.windowed)
        if windowed and rounds is None:
            raise ConfigError(
                f"metric {windowed[0]!r} is a heavy-hitters metric: start the shuffler with "
                "rounds_file (the round file that crowdmix discover writes), or remove it"
            )
        self.rounds = rounds
        self.registry = registry
        self.windows = WindowRule(
            window_seconds=registry.window_seconds,
            tolerance=window_tolerance,
            max_skew_seconds=max_clock_skew_seconds,
        )
        self._clock = clock
        # the aggregator's public keys (None: a plaintext shuffler) and GetConfig's answers
        self.keys = keys
        self.config = ConfigService(
            registry,
            keys,
            cache_seconds=config_cache_seconds,
            window_tolerance=window_tolerance,
            clock=clock,
            rounds=rounds,
        )
        # Compare digests, so lookups do not time the token's bytes.
        self._token_digests = None if tokens is None else frozenset(_digest(t) for t in tokens)
        self._max_reports = max_reports_per_request
        self._limiter = RateLimiter(rate_limit_reports) if rate_limit_reports > 0 else None
        self._max_buffered = max_buffered_reports
        self._lock = threading.Lock()
        self._buffered = 0

    @property
    def auth_required(self) -> bool:
        return self._token_digests is not None

    @property
    def rate_limited(self) -> bool:
        """Whether ``admit`` needs a real connection key (the limiter is on)."""
        return self._limiter is not None

    def authenticate(self, token: str | None) -> None:
        if self._token_digests is None:
            return
        if token is None:
            raise Unauthenticated("no_token", "a bearer token is required")
        if _digest(token) not in self._token_digests:
            raise Unauthenticated("bad_token", "the bearer token is not valid")

    def set_buffered(self, reports: int) -> None:
        """The store's pending total, as last observed (several processes may add to it)."""
        with self._lock:
            self._buffered = reports

    def add_buffered(self, reports: int) -> None:
        with self._lock:
            self._buffered += reports

    def admit(
        self, parts: Sequence[ColumnsIn | RowsIn | SealedIn], *, connection: str
    ) -> tuple[dict[tuple[str, int, int], Pending], int]:
        """Check the windows, validate and apply the limits; returns what to commit
        (per metric, fingerprint and window) and its report count."""
        now = self._clock()
        for part in parts:
            metric = self.registry.metrics.get(part.metric)
            disposal = math.inf if metric is None else metric.shuffle.disposal_days * 86400.0
            self.windows.check(part.window, now, disposal)
        chunks = validate(self.registry, parts, max_reports=self._max_reports, keys=self.keys)
        if self.rounds is not None:
            check_rounds(self.registry, parts, self.rounds.round_of)
        n = sum(c.count for c in chunks.values())
        if self._limiter is not None and not self._limiter.admit(connection, n):
            raise Overloaded("rate_limited", "this connection is over its report rate")
        if self._buffered + n > self._max_buffered:
            raise Overloaded("buffer_full", "the shuffler's buffer is full; retry later")
        return chunks, n


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
