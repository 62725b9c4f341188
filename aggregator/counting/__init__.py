"""Counting: the mergeable per-cohort accumulators and the counts file.

``accumulator_for(metric)`` is the front door: it picks the accumulator of the
metric's encoding (``counts`` holds the bit-vector one, ``basic`` the others).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.counting.basic import IndexCounts, OlhSupportCounts
from crowdmix.aggregator.counting.counts import CohortCounts, Counts, CountsError, CountsShapeError
from crowdmix.core.registry import MetricConfig

__all__ = ["accumulator_for"]


def accumulator_for(
    metric: MetricConfig,
    *,
    totals: npt.ArrayLike | None = None,
    ones: npt.ArrayLike | None = None,
) -> Counts:
    """A fresh (or, given ``totals`` and ``ones``, a restored) accumulator for a metric.

    ============  ===========================  ======================================
    encoding      accumulator                  ``ones[c, i]`` counts reports …
    ============  ===========================  ======================================
    rappor        CohortCounts(m, k)           of cohort c with Bloom bit i set
    binary-rr     CohortCounts(1, 1)           answering 1
    oue           CohortCounts(1, d)           with bit i set
    krr           IndexCounts(d)               reporting index i
    shuffled-     IndexCounts(d)               (real or fake alike) carrying value i
    histogram
    olh           OlhSupportCounts(d, g)       whose (a, b, y) has H(i) = y
    heavy-        IndexCounts(cells, 4)        carrying index i (of its window's
    hitters                                    round; cells: the largest round's)
    ============  ===========================  ======================================

    Every accumulator takes ``add(cohorts, bits)`` with the columnar batch as
    numpy arrays (see :func:`columns_to_arrays`), ``merge``, ``copy`` and
    ``num_reports``.
    """
    acc: Counts
    if metric.rappor is not None:
        acc = CohortCounts(metric.rappor.m, metric.rappor.k)
    elif metric.heavy_hitters is not None:
        from crowdmix.aggregator.discovery.job import cells_bound

        hh = metric.heavy_hitters
        acc = IndexCounts(cells_bound(hh, metric.shuffle.min_batch), hh.report_bytes)
    elif metric.histogram is not None:
        # one np.bincount per batch (IndexCounts.add): no per-report Python work
        acc = IndexCounts(metric.histogram.domain_size)
    else:
        basic = metric.basic
        if basic is None:  # pragma: no cover - MetricConfig guarantees one of the two
            raise CountsError(f"metric {metric.name!r} has no encoding")
        d = basic.domain_size
        if basic.mechanism == "binary-rr":
            acc = CohortCounts(1, 1)
        elif basic.mechanism == "oue":
            acc = CohortCounts(1, d)
        elif basic.mechanism == "krr":
            acc = IndexCounts(d)
        else:
            acc = OlhSupportCounts(d, basic.olh_buckets)
    if (totals is None) != (ones is None):
        raise CountsShapeError("give both totals and ones, or neither")
    if totals is not None and ones is not None:
        acc.totals = np.asarray(totals)
        acc.ones = np.asarray(ones)
    return acc
