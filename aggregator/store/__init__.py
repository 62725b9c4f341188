"""Where the aggregator keeps counts and applied batch and report ids: one
protocol (:mod:`~aggregator.store.base`), two backends (``memory``, ``redis``),
and here the factory and the report job's loaders."""

from __future__ import annotations

from collections.abc import Iterable

from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.counting.counts import Counts
from crowdmix.aggregator.errors import ParamsConflict
from crowdmix.aggregator.store.base import CountStore
from crowdmix.aggregator.store.codec import (
    describe_metric,
    metric_from_description,
    params_difference,
)
from crowdmix.aggregator.store.memory import MemoryCountStore
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.core.redis_url import is_cluster_url, is_redis_url, parse_cluster_url
from crowdmix.core.registry import MetricConfig

__all__ = ["load_batch_sizes", "load_counts", "open_store", "stored_metric"]


def open_store(url: str | None, *, min_replicas_ack: int = 0) -> CountStore:
    """A store for a URL: ``None``/``memory://`` → memory; ``redis://``, ``rediss://``,
    ``unix://`` → Redis; ``redis+cluster://host:port,...`` → a Redis Cluster.
    ``min_replicas_ack`` N > 0: an applied batch is acknowledged only once N replicas
    have it (Redis WAIT; a single node without replicas then refuses every batch)."""
    if url is None or url == "memory://":
        if min_replicas_ack:
            raise ValueError("min_replicas_ack needs a Redis store with replicas")
        return MemoryCountStore()
    if is_redis_url(url):
        if is_cluster_url(url):
            parse_cluster_url(url)  # a bad cluster URL is a ValueError naming it
        return RedisCountStore.from_url(url, min_replicas_ack=min_replicas_ack)
    raise ValueError(
        f"store URL must be memory://, redis://... or redis+cluster://host:port,..., got {url!r}"
    )


def stored_metric(store: CountStore, name: str) -> MetricConfig | None:
    """The metric config stored with ``name``'s counts (None when nothing is stored)."""
    description = store.description(name)
    return None if description is None else metric_from_description(name, description)


def load_batch_sizes(
    source: CountStore | str, metric: str, windows: Iterable[int] | None = None
) -> list[int]:
    """The size of every batch applied for ``metric`` over ``windows`` (all when None)."""
    store = open_store(source) if isinstance(source, str) else source
    try:
        histogram = store.batch_sizes(metric, windows)
    finally:
        if isinstance(source, str):
            store.close()
    return sorted(size for size, n in histogram.items() for _ in range(n))


def load_counts(
    source: CountStore | str,
    metric: str | MetricConfig,
    windows: Iterable[int] | None = None,
) -> Counts:
    """Merged counts of ``metric`` over ``windows`` (all when None) from a store or a store URL.

    For the report job. The counts come back as the metric's accumulator
    (``crowdmix.aggregator.counting.counts.accumulator_for``: CohortCounts for RAPPOR, OUE and
    binary RR, index or OLH support counts for k-RR and OLH), for the given
    :class:`~crowdmix.core.registry.MetricConfig` or, given a name, for the config
    stored with the counts (raising ParamsConflict when a given config's
    fingerprint is not the stored one). Raises LookupError when nothing is
    stored for that selection.
    """
    name = metric if isinstance(metric, str) else metric.name
    store = open_store(source) if isinstance(source, str) else source
    try:
        stored = store.load(name, windows)
        config = stored_metric(store, name) if stored is not None else None
    finally:
        if isinstance(source, str):
            store.close()
    if stored is None:
        which = "any window" if windows is None else f"window(s) {sorted(set(windows))}"
        raise LookupError(f"no counts stored for metric {name!r} in {which}")
    if not isinstance(metric, str):
        if config is not None and config.fingerprint != metric.fingerprint:
            raise ParamsConflict(
                f"metric {name!r}: the counts were stored under other params: "
                f"{params_difference(describe_metric(config), metric)}"
            )
        config = metric
    if config is None:
        return stored.to_cohort_counts()
    return accumulator_for(config, totals=stored.totals, ones=stored.ones)
