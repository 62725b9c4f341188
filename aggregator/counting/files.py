"""Counts on disk: the file the accumulator writes and ``crowdmix report --counts`` reads.

A ``.npz`` archive (read with ``allow_pickle=False``) with ``format``
("crowdmix-counts/1"), ``metric``, ``encoding``, ``kind`` ("bits" | "index" | "olh"),
``fingerprint`` (uint64), ``window`` (-1: unknown or merged), ``buckets`` (OLH g, else 0),
``duplicate_reports`` (-1: not recorded), ``windows`` and ``batch_sizes`` (int64[],
absent: not recorded), ``smallest_crowd`` (-1: not recorded), ``sealed`` (1 all sealed,
0 some clear, -1 not recorded), ``params`` (the registry entry as JSON, so a mismatch
names the field), ``totals`` (int64[m]) and ``ones`` (int64[m, nbits]).

The fingerprint ties counts to the exact params they were encoded under, so a report job
run with another metric config is refused instead of mis-decoding. What the privacy
statement needs beyond the counts travels with them, so a report from the file states
what one from the live store states. A field absent from the file is unknown, never assumed.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    #: the windows merged, the batches counted, the measured crowd, sealing, the params
    #: (each None: not recorded)
    windows: tuple[int, ...] | None = None
    batch_sizes: tuple[int, ...] | None = None
    smallest_crowd: int | None = None
    sealed: bool | None = None
    params: str | None = None

    def check_metric(self, metric: MetricConfig) -> None:
        """Raise CountsFileError unless these counts were made under ``metric``'s params."""
        if self.encoding != metric.encoding:
            raise CountsFileError(
                f"counts are for encoding {self.encoding!r} but metric {metric.name!r} "
                f"uses {metric.encoding!r}"
            )
        if self.fingerprint != metric.fingerprint:
            if self.params is not None:
                from crowdmix.aggregator.store.codec import params_difference

                differ = params_difference(self.params, metric, ours="the counts")
                raise CountsFileError(
                    f"params mismatch: metric {metric.name!r} differs from the params the "
                    f"counts were encoded with: {differ}"
                )
            raise CountsFileError(
                f"params mismatch: counts were encoded with params fingerprint "
                f"{self.fingerprint:016x}, metric {metric.name!r} has {metric.fingerprint:016x}"
                " (the file records no params to name the field: re-export it)"
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
    if metric.heavy_hitters is not None:
        from crowdmix.aggregator.discovery.job import cells_bound

        return cells_bound(metric.heavy_hitters, metric.shuffle.min_batch)
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
    windows: Sequence[int] | None = None,
    batch_sizes: Sequence[int] | None = None,
    smallest_crowd: int | None = None,
    sealed: bool | None = None,
    params: str | None = None,
) -> None:
    """Write counts atomically (a temporary file renamed into place).

    ``duplicate_reports`` (``CountStore.duplicate_reports``; None: not known) is kept so a
    shuffled-histogram statement made from the file can tell whether reports were linked;
    ``windows``, ``batch_sizes``, ``smallest_crowd`` and ``sealed`` (the store's records;
    None: not known) so its privacy statement is the live store's; ``params``
    (``describe_metric``) so a mismatch names the field."""
    if duplicate_reports is not None and duplicate_reports < 0:
        raise ValueError(f"duplicate_reports must be >= 0 or None, got {duplicate_reports}")
    if smallest_crowd is not None and smallest_crowd < 0:
        raise ValueError(f"smallest_crowd must be >= 0 or None, got {smallest_crowd}")
    optional: dict[str, Any] = {}
    if windows is not None:
        optional["windows"] = np.array(sorted(windows), dtype=np.int64)
    if batch_sizes is not None:
        optional["batch_sizes"] = np.array(sorted(batch_sizes), dtype=np.int64)
    if params is not None:
        optional["params"] = np.array(params)
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
            smallest_crowd=np.array(
                -1 if smallest_crowd is None else smallest_crowd, dtype=np.int64
            ),
            sealed=np.array(-1 if sealed is None else int(sealed), dtype=np.int64),
            totals=counts.totals,
            ones=counts.ones,
            **optional,
        )
    os.replace(tmp, path)


def load_counts(path: str | os.PathLike[str]) -> SavedCounts:
    """Read a counts file; CountsFileError says what is wrong with it."""
    path = Path(path)
    not_ours = CountsFileError(
        f"{path} is not a crowdmix counts file (.npz, written by crowdmix counts export); "
        "google/rappor's counts.csv goes to --rappor-counts"
    )
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):  # a bare .npy array
            raise not_ours
        with data:
            fields = {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise CountsFileError(f"counts file {path} does not exist") from None
    except OSError as exc:
        raise CountsFileError(f"cannot read counts file {path}: {exc.strerror or exc}") from None
    except (ValueError, zipfile.BadZipFile, EOFError):
        # numpy's own message suggests allow_pickle for any file it cannot parse (a CSV,
        # say): advice that is wrong here, so it is not repeated
        raise not_ours from None
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
        crowd = int(fields.get("smallest_crowd", -1))
        sealed = int(fields.get("sealed", -1))
        windows = _int_tuple(fields.get("windows"))
        sizes = _int_tuple(fields.get("batch_sizes"))
    except (TypeError, ValueError):
        raise CountsFileError(
            f"{path}: duplicate_reports, smallest_crowd, sealed, windows and batch_sizes "
            "must be integers"
        ) from None
    if sizes is not None and (any(b < 1 for b in sizes) or sum(sizes) != counts.num_reports):
        raise CountsFileError(f"{path}: batch_sizes do not add up to the reports counted")
    return SavedCounts(
        counts=counts,
        metric=str(fields["metric"]),
        encoding=str(fields["encoding"]),
        fingerprint=int(fields["fingerprint"]),
        window=None if window < 0 else window,
        duplicate_reports=None if duplicates < 0 else duplicates,
        windows=windows,
        batch_sizes=sizes,
        smallest_crowd=None if crowd < 0 else crowd,
        sealed=None if sealed < 0 else bool(sealed),
        params=str(fields["params"]) if "params" in fields else None,
    )


def _int_tuple(array: Any) -> tuple[int, ...] | None:
    if array is None:
        return None
    return tuple(int(x) for x in np.asarray(array).reshape(-1))
