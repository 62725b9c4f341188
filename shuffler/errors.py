"""Exceptions of the shuffler daemon, one hierarchy, mapped to gRPC status codes
in exactly one place (``crowdmix.shuffler.servicer._STATUS``):

    ShufflerError
    ├── BindError, ConfigError (a ValueError)    start-up fails naming it (bind: exit 4)
    ├── RequestRejected                          refused as a whole:
    │   InvalidRequest INVALID_ARGUMENT, Unauthenticated UNAUTHENTICATED, StaleKey /
    │   WindowRefused / RoundMismatch FAILED_PRECONDITION, Overloaded RESOURCE_EXHAUSTED
    ├── StoreUnavailable                         UNAVAILABLE
    │   ├── StoreOutcomeUnknown ⊃ StoreNotReplicated   DEADLINE_EXCEEDED (sent, unconfirmed)
    │   └── PartialWrite                         the error of a slot the request touched
    └── ForwardError                             the aggregator did not acknowledge a batch

Every refusal carries a short machine-readable ``reason`` (a label of the
``rejected_requests_total`` metric) and a message; neither contains report contents.
"""

from __future__ import annotations

__all__ = [
    "BindError",
    "ConfigError",
    "ForwardError",
    "InvalidRequest",
    "Overloaded",
    "PartialWrite",
    "RequestRejected",
    "RoundMismatch",
    "ShufflerError",
    "StaleKey",
    "StoreNotReplicated",
    "StoreOutcomeUnknown",
    "StoreUnavailable",
    "Unauthenticated",
    "WindowRefused",
]


class ShufflerError(Exception):
    """Base class of every error the shuffler raises on purpose."""

    # the rejected_requests_total label of a request this error refused
    reason: str = "internal"


class ConfigError(ShufflerError, ValueError):
    """The daemon's settings or its metric registry are invalid; the message names the field."""


class BindError(ShufflerError):
    """The gRPC listen address could not be bound."""


class RequestRejected(ShufflerError):
    """A submit request is refused as a whole; nothing of it is stored."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class InvalidRequest(RequestRejected):
    """Malformed, or does not match the metric registry."""


class Unauthenticated(RequestRejected):
    """No bearer token, or one that is not in the tokens file."""


class StaleKey(RequestRejected):
    """A sealed report names a key id this shuffler does not accept (unknown, or past
    its end): the device's config is stale. The SDK refetches it once and reseals."""


class WindowRefused(RequestRejected):
    """A report names a collection window this shuffler does not take now
    (``crowdmix.shuffler.windows.WindowRule``): reason ``window_closed`` (too old: the
    device drops the report) or ``window_ahead`` (not begun: the device's clock is
    ahead; it fetches the server time again and retries later)."""


class RoundMismatch(RequestRejected):
    """A heavy-hitters report names another round than this shuffler serves for its
    window (``round_mismatch``): its device fetched its config from a shuffler holding
    another round file, or an older one. The SDK refetches the config once; a report
    whose window then serves another round is dropped (``round_changed``)."""


class Overloaded(RequestRejected):
    """Too large, over the connection's rate, or the buffer is full: try again later."""


class StoreUnavailable(ShufflerError):
    """The store could not be reached or refused a write: nothing was stored."""

    reason = "store_unavailable"


class StoreOutcomeUnknown(StoreUnavailable):
    """A write was sent but never confirmed (timeout, connection lost while waiting for
    the reply), so it may have been stored. Answered DEADLINE_EXCEEDED: the SDK retries
    it with the same report ids and window, and the aggregator counts a report id once
    in its window, so a retry of a write that did happen counts nothing twice."""

    reason = "store_outcome_unknown"


class StoreNotReplicated(StoreOutcomeUnknown):
    """With ``--min-replicas-ack N``: the write ran on the master but WAIT saw fewer than N
    replicas acknowledge it in time, so a failover could still lose it. Not acknowledged:
    DEADLINE_EXCEEDED, "it may have been stored" (it was, on the master); a retry may store
    the reports twice in the shuffler, and the aggregator counts a report id once per window."""

    reason = "store_not_replicated"


class PartialWrite(StoreUnavailable):
    """A group-commit flush on a Redis Cluster is one script per slot (atomic per metric):
    the writes of the metrics in ``failed`` did not succeed (``cause`` says how), the
    others did. The committer acknowledges the requests that touched none of ``failed``."""

    def __init__(self, failed: frozenset[str], cause: StoreUnavailable) -> None:
        super().__init__(str(cause))
        self.failed = failed
        self.cause = cause
        self.reason = cause.reason


class ForwardError(ShufflerError):
    """The aggregator did not acknowledge a batch.

    ``retryable`` is False when the aggregator refused the batch itself
    (INVALID_ARGUMENT, FAILED_PRECONDITION): re-sending cannot help, so the batch
    is parked in flight (kept, offered again every ``parked_retry_seconds`` and at
    the next start-up) instead of blocking every other release behind it.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable
