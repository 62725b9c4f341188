"""Counts on disk: the file the accumulator writes and ``crowdmix report --counts`` reads.

A ``.npz`` archive (numpy's zip of arrays, read with ``allow_pickle=False``)::

    format      "crowdmix-counts/1"
    metric      metric name
    encoding    "rappor" | "binary-rr" | "krr" | "oue" | "olh"
    kind        accumulator kind ("bits" | "index" | "olh")
    fingerprint params fingerprint (uint64) of the reports counted
    window      collection window (-1: unknown / all windows merged)
    buckets     OLH buckets g (0 for other kinds)
    duplicate_reports  report ids the aggregator saw twice in these windows (-1: not
                recorded)
    totals      int64[m]
    ones        int64[m, nbits]

The fingerprint ties counts to the exact params they were encoded under, so a
report job run with another metric config is refused instead of mis-decoding.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from crowdmix.aggregator.counting.basic import IndexCounts, OlhSupportCounts
from crowdmix.aggregator.counting.counts import CohortCounts, Counts, CountsError

if TYPE_CHECKING:
    from crowdmix.core.registry import MetricConfig

__all__ = ["FORMAT", "CountsFileError", "SavedCounts", "load_counts", "save_counts"]

FORMAT = "crowdmix-counts/1"


class CountsFileError(CountsError):
    """A counts file is missing, not ours, corrupt, or does not match the metric config."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedCounts:
    """What a counts file holds: the accumulator and the metadata that names it."""

    counts: Counts
    metric: str
    encoding: str
    fingerprint: int
    window: int | None = None
    #: report ids seen twice in these windows; None: not recorded (unknown, not 0)
    duplicate_reports: int | None = None

    def check_metric(self, metric: MetricConfig) -> None:
        """Raise CountsFileError unless these counts were made under ``metric``'s params."""
        if self.encoding != metric.encoding:
            raise CountsFileError(
                f"counts are for encoding {self.encoding!r} but metric {metric.name!r} "
                f"uses {metric.encoding!r}"
            )
        if self.fingerprint != metric.fingerprint:
            raise CountsFileError(
                f"params mismatch: counts were encoded with params fingerprint "
                f"{self.fingerprint:016x}, metric {metric.name!r} has {metric.fingerprint:016x}"
            )
        expected = (metric.num_cohorts, _nbits_of(metric))
        got = (self.counts.num_cohorts, self.counts.nbits)
        if got != expected:
            raise CountsFileError(f"counts have shape {got}, metric expects {expected}")


def _nbits_of(metric: MetricConfig) -> int:
    if metric.rappor is not None:
        return metric.rappor.k
    if metric.histogram is not None:
        return metric.histogram.domain_size
    assert metric.basic is not None  # MetricConfig holds exactly one encoding
    return 1 if metric.basic.mechanism == "binary-rr" else metric.basic.domain_size


def save_counts(
    path: str | os.PathLike[str],
    counts: Counts,
    *,
    metric: str,
    encoding: str,
    fingerprint: int,
    window: int | None = None,
    duplicate_reports: int | None = None,
) -> None:
    """Write counts atomically (a temporary file renamed into place).

    ``duplicate_reports`` (``CountStore.duplicate_reports``; None: not known) is kept so a
    shuffled-histogram statement made from the file can tell whether reports were linked."""
    if duplicate_reports is not None and duplicate_reports < 0:
        raise ValueError(f"duplicate_reports must be >= 0 or None, got {duplicate_reports}")
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        np.savez_compressed(
            fh,
            format=np.array(FORMAT),
            metric=np.array(metric),
            encoding=np.array(encoding),
            kind=np.array(counts.kind),
            fingerprint=np.array(fingerprint, dtype=np.uint64),
            window=np.array(-1 if window is None else window, dtype=np.int64),
            buckets=np.array(getattr(counts, "buckets", 0), dtype=np.int64),
            duplicate_reports=np.array(
                -1 if duplicate_reports is None else duplicate_reports, dtype=np.int64
            ),
            totals=counts.totals,
            ones=counts.ones,
        )
    os.replace(tmp, path)


def load_counts(path: str | os.PathLike[str]) -> SavedCounts:
    """Read a counts file; CountsFileError says what is wrong with it."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            fields = {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise CountsFileError(f"counts file {path} does not exist") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise CountsFileError(f"{path} is not a crowdmix counts file: {exc}") from None
    if str(fields.get("format", "")) != FORMAT:
        raise CountsFileError(f"{path} is not a {FORMAT} file")
    required = {"metric", "encoding", "kind", "fingerprint", "window", "totals", "ones"}
    missing = (required | {"duplicate_reports"}) - set(fields)
    if missing:
        raise CountsFileError(f"{path} lacks field(s) {sorted(missing)}")
    kind = str(fields["kind"])
    ones = fields["ones"]
    if ones.ndim != 2:
        raise CountsFileError(f"{path}: ones must be 2-dimensional, got shape {ones.shape}")
    m, nbits = ones.shape
    counts: Counts
    try:
        if kind == "bits":
            counts = CohortCounts(m, nbits)
        elif kind == "index":
            counts = IndexCounts(nbits)
        elif kind == "olh":
            counts = OlhSupportCounts(nbits, int(fields.get("buckets", 0)))
        else:
            raise CountsFileError(f"{path}: unknown counts kind {kind!r}")
        counts.totals = fields["totals"]
        counts.ones = ones
    except CountsFileError:
        raise
    except CountsError as exc:
        raise CountsFileError(f"{path}: {exc}") from None
    if np.any(counts.ones > counts.totals[:, None]):
        raise CountsFileError(f"{path}: a bit count exceeds its cohort's report total")
    window = int(fields["window"])
    try:
        duplicates = int(fields["duplicate_reports"])
    except (TypeError, ValueError):
        raise CountsFileError(f"{path}: duplicate_reports must be an integer") from None
    return SavedCounts(
        counts=counts,
        metric=str(fields["metric"]),
        encoding=str(fields["encoding"]),
        fingerprint=int(fields["fingerprint"]),
        window=None if window < 0 else window,
        duplicate_reports=None if duplicates < 0 else duplicates,
    )
