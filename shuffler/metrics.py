"""Prometheus metrics of one shuffler instance (its own CollectorRegistry:
``crowdmix.core.metrics``).

Nothing here is labelled by anything identifying: labels are metric names from
the registry and rejection reasons.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from crowdmix.core.metrics import LATENCY_BUCKETS

__all__ = ["ShufflerMetrics"]


class ShufflerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.accepted_reports = Counter(
            "crowdmix_shuffler_accepted_reports", "Reports stored and acknowledged", registry=r
        )
        self.accepted_requests = Counter(
            "crowdmix_shuffler_accepted_requests", "Submit requests acknowledged", registry=r
        )
        self.rejected_requests = Counter(
            "crowdmix_shuffler_rejected_requests",
            "Submit requests refused, by reason",
            ["reason"],
            registry=r,
        )
        self.dropped_reports = Counter(
            "crowdmix_shuffler_dropped_reports",
            "Reports removed by the random drop policy",
            ["metric"],
            registry=r,
        )
        self.disposed_reports = Counter(
            "crowdmix_shuffler_disposed_reports",
            "Reports discarded for age, never forwarded",
            ["metric"],
            registry=r,
        )
        self.pending_reports = Gauge(
            "crowdmix_shuffler_pending_reports",
            "Reports waiting in the store, per metric",
            ["metric"],
            registry=r,
        )
        self.batches_forwarded = Counter(
            "crowdmix_shuffler_batches_forwarded",
            "Batches acknowledged by the aggregator",
            ["metric"],
            registry=r,
        )
        self.reports_forwarded = Counter(
            "crowdmix_shuffler_reports_forwarded",
            "Reports in batches acknowledged by the aggregator",
            ["metric"],
            registry=r,
        )
        self.forward_failures = Counter(
            "crowdmix_shuffler_forward_failures",
            "Attempts to forward a batch that the aggregator did not acknowledge",
            registry=r,
        )
        self.parked_batches = Gauge(
            "crowdmix_shuffler_parked_batches",
            "Batches the aggregator refused (INVALID_ARGUMENT/FAILED_PRECONDITION), kept in "
            "flight and offered again periodically",
            registry=r,
        )
        self.store_writes = Counter(
            "crowdmix_shuffler_store_writes", "Group-commit writes to the store", registry=r
        )
        self.request_latency = Histogram(
            "crowdmix_shuffler_request_latency_seconds",
            "Submit latency, from receipt to acknowledgement",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
