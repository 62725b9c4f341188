"""The aggregator service's errors, one hierarchy (the daemon maps them to gRPC
status codes in ``crowdmix.aggregator.daemon.service``; the command line to exit codes)::

    AggregatorError
    ├── BindError             the gRPC server cannot listen on the address (an OSError)
    ├── ConfigError           the daemon cannot run this registry (a shuffled histogram
    │                         without a key set to open sealed reports)
    ├── InvalidBatch          the batch breaks the registry or the wire contract
    │   └── WindowDisposed    the batch's window is past retention (its ids are deleted)
    └── StoreError
        ├── StoreUnavailable  the backend cannot be reached now (retry later)
        └── ParamsConflict    counts for this metric were stored under other params

The analysis side's errors sit beside their math: ``decode.errors``,
``counting.counts.CountsError``, ``accounting.ledger`` and ``sealing.keys``.
"""

from __future__ import annotations

__all__ = [
    "AggregatorError",
    "BindError",
    "ConfigError",
    "InvalidBatch",
    "ParamsConflict",
    "StoreError",
    "StoreUnavailable",
    "WindowDisposed",
]


class AggregatorError(Exception):
    """Base of the aggregator service's errors."""


class BindError(AggregatorError, OSError):
    """The gRPC server could not listen on the requested address."""


class ConfigError(AggregatorError, ValueError):
    """The daemon's registry or settings cannot run; the message names the field."""


class InvalidBatch(AggregatorError, ValueError):
    """A batch that must not be counted; the message is the reason sent back.

    ``reason`` is a short fixed label (for metrics): ``batch_id``, ``window``,
    ``unknown_metric``, ``fingerprint``, ``report_bytes``, ``empty``, ``too_large``,
    ``length``, ``cohort``, ``padding``, ``payload`` or ``histogram_unsealed``.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class WindowDisposed(InvalidBatch):
    """The batch's window is past retention: its ids were deleted, so it is not counted."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="window_disposed")


class StoreError(AggregatorError):
    """The count store could not apply or read counts."""


class StoreUnavailable(StoreError):
    """The backend is down or unreachable; nothing was applied, the caller may retry."""


class ParamsConflict(StoreError):
    """The metric already has counts stored under a different params fingerprint."""
