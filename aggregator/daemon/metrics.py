"""Prometheus metrics of the aggregator daemon (its own CollectorRegistry:
``crowdmix.core.metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from crowdmix.core.metrics import LATENCY_BUCKETS

__all__ = ["IngestMetrics"]


class IngestMetrics:
    """Counters and histograms updated by the Ingest servicer and the folder."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.batches = Counter(
            "crowdmix_aggregator_batches",
            "Batches acknowledged, by outcome: applied, or duplicate_batch (its id was applied "
            "before, e.g. a retry after a lost reply: counted by its first attempt)",
            ["metric", "outcome"],
            registry=r,
        )
        self.reports = Counter(
            "crowdmix_aggregator_reports_counted",
            "Reports counted (duplicates excluded)",
            ["metric"],
            registry=r,
        )
        self.duplicate_reports = Counter(
            "crowdmix_aggregator_duplicate_reports",
            "Reports dropped because their report id was counted before in the window",
            ["metric"],
            registry=r,
        )
        self.sealed_dropped = Counter(
            "crowdmix_aggregator_sealed_dropped",
            "Sealed reports dropped, by reason (crowdmix.aggregator.sealing.ingest): did not open "
            "(unknown_key, expired_key, bad_length, not_authentic) or failed a per-report "
            "check after opening (fingerprint, cohort_range, padding_bits, payload)",
            ["metric", "reason"],
            registry=r,
        )
        self.disposed_ids = Counter(
            "crowdmix_aggregator_ids_disposed",
            "Batch ids and report ids deleted with windows past retention",
            registry=r,
        )
        self.rejected = Counter(
            "crowdmix_aggregator_batches_rejected",
            "Batches rejected, by reason",
            ["reason"],
            registry=r,
        )
        self.store_errors = Counter(
            "crowdmix_aggregator_store_errors",
            "Ingest calls that failed because the count store was unavailable",
            registry=r,
        )
        self.folded = Counter(
            "crowdmix_aggregator_deltas_folded",
            "Per-batch count deltas folded into window totals",
            registry=r,
        )
        self.latency = Histogram(
            "crowdmix_aggregator_ingest_seconds",
            "Ingest call latency (validate, count, store)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.apply_retries = Gauge(
            "crowdmix_aggregator_apply_retries",
            "Applies refused because another process appended report ids meanwhile "
            "(Redis; since start): a steady rise means processes contend for one window",
            registry=r,
        )
        self.index_rebuilds = Gauge(
            "crowdmix_aggregator_report_id_index_rebuilds",
            "Report-id indexes built from Redis (since start): first look at a window, late "
            "batches of uncached "
            "windows, or an id list that lost its tail (Redis restart or failover)",
            registry=r,
        )
        self.up = Gauge(
            "crowdmix_aggregator_serving", "1 while the server accepts batches", registry=r
        )
