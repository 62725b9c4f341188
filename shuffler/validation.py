"""Validate submitted reports against the metric registry, whole columns at a time.

A request is a list of ``ColumnsIn`` (columnar submits) and ``RowsIn`` (rows, grouped by
metric, fingerprint, length and window at the wire edge, ``crowdmix.shuffler.serde``).
``validate`` accepts all of it or raises ``InvalidRequest`` / ``Overloaded`` with a
reason (``empty``, ``unknown_metric``, ``fingerprint_mismatch``, ``malformed``,
``bit_length``, ``padding_bits``, ``cohort_range``, ``value_range``, ``too_many_reports``,
``stale_key``, ``too_many_messages``, ...); ``check_rounds`` holds a heavy-hitters report
to its window's round (``no_round``, ``round_mismatch``). Nothing mutates anything, so a
rejected request leaves the store untouched. Columns are checked with numpy reductions, rows with
C-level list/bytes operations (cheaper for the typical one-report request). Sealed
reports (``SealedIn``) are checked for what the shuffler can see: metric, key id, exact
length. A shuffled-histogram metric's reports must be sealed, at most 1 + m per call.
The table of reasons and statuses: docs/design.md, "Shuffler".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from crowdmix.core.discovery import HeavyHittersParams
from crowdmix.core.errors import ParamsError
from crowdmix.core.registry import MetricConfig, Registry
from crowdmix.core.rounds import ServedRound
from crowdmix.core.sealed import sealed_length
from crowdmix.shuffler.columns import ID_BYTES, Chunk, Pending, Rows, merge
from crowdmix.shuffler.config_service import SEALED_QUEUE, PublishedKeys
from crowdmix.shuffler.errors import (
    ConfigError,
    InvalidRequest,
    Overloaded,
    RoundMismatch,
    StaleKey,
)

__all__ = [
    "ColumnsIn",
    "RowsIn",
    "SealedIn",
    "check_message_cap",
    "refuse_unsealed_histograms",
    "validate",
]


@dataclass(frozen=True, slots=True)
class ColumnsIn:
    """Submitted reports of one metric as columns, not yet checked."""

    metric: str
    fingerprint: int
    count: int
    report_bytes: int
    cohorts: npt.NDArray[np.int64]
    bits: bytes
    ids: bytes  # count × 16 bytes of report ids
    window: int


@dataclass(frozen=True, slots=True)
class RowsIn:
    """Submitted rows of one (metric, fingerprint, bit length), not yet checked."""

    metric: str
    fingerprint: int
    report_bytes: int
    cohorts: list[int]
    bits: bytes
    ids: bytes  # count × 16 bytes of report ids
    window: int

    @property
    def count(self) -> int:
        return len(self.cohorts)


@dataclass(frozen=True, slots=True)
class SealedIn:
    """Sealed reports of one metric (rows grouped by length, or one column), not yet checked."""

    metric: str
    key_ids: list[int] | npt.NDArray[np.uint32]  # a list for rows, numpy for a column
    sealed: bytes  # count × sealed_bytes
    sealed_bytes: int
    window: int
    fingerprint: int = 0  # a heavy-hitters report's round, named beside its seal

    @property
    def count(self) -> int:
        return len(self.key_ids)


def _check_sealed(
    registry: Registry, part: SealedIn, keys: PublishedKeys | None
) -> tuple[MetricConfig, int]:
    """The metric and the queue fingerprint of a sealed part, or raise."""
    metric = registry.get(part.metric)
    if metric is None:
        raise InvalidRequest("unknown_metric", f"unknown metric {part.metric[:128]!r}")
    where = f"metric {metric.name!r}"
    if part.fingerprint and metric.heavy_hitters is None:
        raise InvalidRequest(
            "mixed_sealed",
            f"{where}: a sealed report names a params fingerprint in the clear (only a "
            "heavy-hitters report names its round's)",
        )
    if keys is None:
        raise InvalidRequest(
            "sealing_off",
            "this shuffler publishes no aggregator key and takes plaintext reports only",
        )
    if part.sealed_bytes < 1 or len(part.sealed) != part.count * part.sealed_bytes:
        raise InvalidRequest(
            "malformed",
            f"{where}: {len(part.sealed)} bytes of sealed values for {part.count} reports "
            f"of {part.sealed_bytes} bytes",
        )
    suites = set()
    distinct = (
        np.unique(part.key_ids).tolist()
        if isinstance(part.key_ids, np.ndarray)
        else set(part.key_ids)
    )
    for kid in distinct:
        key = keys.accepted(kid)
        if key is None:
            raise StaleKey(
                "stale_key",
                f"{where}: key {kid} is unknown here or has ended; refetch the config "
                "(GetConfig) and seal again",
            )
        suites.add(key.suite)
    if len(suites) != 1:
        raise InvalidRequest("malformed", f"{where}: one column mixes suites {sorted(suites)}")
    suite = suites.pop()
    expected = sealed_length(metric.report_bytes, suite)
    if part.sealed_bytes != expected:
        raise InvalidRequest(
            "sealed_length",
            f"{where}: a sealed report is {expected} bytes under {suite}, got {part.sealed_bytes}",
        )
    return metric, SEALED_QUEUE[suite]


def _refuse_clear_histogram(metric: MetricConfig) -> None:
    if metric.requires_sealing:
        raise InvalidRequest(
            "histogram_unsealed",
            f"metric {metric.name!r} is a shuffled histogram: its reports must be sealed "
            "(in the clear the shuffler would see each device's true value)",
        )


def refuse_unsealed_histograms(registry: Registry) -> None:
    """``ConfigError`` at start-up: a shuffler without published keys takes clear
    reports only, and a shuffled-histogram metric must never be taken in the clear."""
    names = sorted(n for n, m in registry.metrics.items() if m.requires_sealing)
    if names:
        raise ConfigError(
            f"metric {names[0]!r} is a shuffled histogram and needs sealed reports: start the "
            "shuffler with --public-keys (the aggregator's public key config), or remove it"
        )


@functools.lru_cache(maxsize=64)
def _round_cells(served: ServedRound, params: HeavyHittersParams) -> int:
    return served.params(params).cells


@functools.lru_cache(maxsize=64)
def _round_fingerprint(served: ServedRound, metric_fingerprint: int) -> int:
    return served.fingerprint(metric_fingerprint)


def check_rounds(
    registry: Registry,
    parts: Sequence[ColumnsIn | RowsIn | SealedIn],
    round_of: Callable[[MetricConfig, int], ServedRound | None] | None,
) -> None:
    """A heavy-hitters report names a window that serves a round (``round_of``) and
    that round's fingerprint (a report encoded against another shuffler's round of the
    window is refused ``round_mismatch``: never counted against this one), and a clear
    one carries an index of that round (below its S·g or C + 1 cells)."""
    for part in parts:
        metric = registry.get(part.metric)
        if metric is None or metric.heavy_hitters is None or part.count == 0:
            continue
        served = None if round_of is None else round_of(metric, part.window)
        if served is None:
            raise InvalidRequest(
                "no_round",
                f"metric {metric.name!r}: window {part.window} serves no discovery round "
                "(a device reports only in a window whose round GetConfig served)",
            )
        try:
            cells = _round_cells(served, metric.heavy_hitters)
        except ParamsError as exc:  # the round file's round does not fit the registry
            raise InvalidRequest(
                "no_round",
                f"metric {metric.name!r}: window {part.window}'s round does not fit the "
                f"metric's params ({exc}): the round file is not this registry's",
            ) from None
        expected = _round_fingerprint(served, metric.fingerprint)
        if part.fingerprint != expected:
            raise RoundMismatch(
                "round_mismatch",
                f"metric {metric.name!r}: the reports of window {part.window} name round "
                f"fingerprint {part.fingerprint:#018x}, but this shuffler serves round "
                f"{served.round} ({expected:#018x}) in it: fetch the config again",
            )
        if isinstance(part, SealedIn) or part.report_bytes != metric.report_bytes:
            continue  # sealed: the aggregator drops what no round holds; a bad length: below
        nb = metric.report_bytes
        bits = np.frombuffer(part.bits, dtype=np.uint8)
        if bits.size % nb:
            continue  # malformed: the header checks name it
        index = bits.reshape(-1, nb).astype(np.int64) @ (256 ** np.arange(nb, dtype=np.int64))
        if index.size and int(index.max()) >= cells:
            raise InvalidRequest(
                "value_range",
                f"metric {metric.name!r}: index out of range [0, {cells}) of round "
                f"{served.round} (window {part.window})",
            )


def check_message_cap(registry: Registry, counts: dict[str, int]) -> None:
    """Refuse a call carrying more reports of a shuffled-histogram metric than one
    device sends per window (1 + m)."""
    for name, count in counts.items():
        metric = registry.get(name)
        if metric is None or metric.histogram is None:
            continue
        cap = metric.histogram.max_messages
        if count > cap:
            raise InvalidRequest(
                "too_many_messages",
                f"metric {name!r}: {count} reports in one call; a device sends at most "
                f"{cap} (1 real + {metric.histogram.fake_slots} fake slots) per window, "
                "in one call",
            )


def _check_header(registry: Registry, part: ColumnsIn | RowsIn) -> MetricConfig:
    metric = registry.get(part.metric)
    if metric is None:
        raise InvalidRequest("unknown_metric", f"unknown metric {part.metric[:128]!r}")
    _refuse_clear_histogram(metric)
    where = f"metric {metric.name!r}"
    # a heavy-hitters report names its round's fingerprint: ``check_rounds`` holds it to it
    if metric.heavy_hitters is None and part.fingerprint != metric.fingerprint:
        raise InvalidRequest(
            "fingerprint_mismatch",
            f"{where}: reports were encoded with other params than the registry's "
            f"(fingerprint {part.fingerprint:#018x}, expected {metric.fingerprint:#018x})",
        )
    nb = metric.report_bytes
    if part.report_bytes != nb:
        raise InvalidRequest(
            "bit_length", f"{where}: each report must be {nb} bytes, got {part.report_bytes}"
        )
    return metric


def _check_rows(registry: Registry, part: RowsIn) -> MetricConfig:
    metric = _check_header(registry, part)
    where = f"metric {metric.name!r}"
    nb = metric.report_bytes
    if len(part.bits) != part.count * nb:
        raise InvalidRequest("malformed", f"{where}: bits do not match the report count")
    if max(part.cohorts) >= metric.num_cohorts:
        raise InvalidRequest(
            "cohort_range",
            f"{where}: cohort {max(part.cohorts)} out of range [0, {metric.num_cohorts})",
        )
    extra = 8 * nb - metric.payload_bits
    if extra:
        mask = (0xFF << (8 - extra)) & 0xFF
        if any(b & mask for b in part.bits[nb - 1 :: nb]):
            raise InvalidRequest(
                "padding_bits", f"{where}: bits past bit {metric.payload_bits} must be zero"
            )
    basic = metric.basic
    if basic is not None and basic.mechanism == "krr":
        for i in range(0, len(part.bits), nb):
            if int.from_bytes(part.bits[i : i + nb], "little") >= basic.domain_size:
                raise InvalidRequest(
                    "value_range", f"{where}: k-RR index out of range [0, {basic.domain_size})"
                )
    return metric


def _check_one(registry: Registry, part: ColumnsIn) -> MetricConfig:
    metric = _check_header(registry, part)
    where = f"metric {metric.name!r}"
    nb = metric.report_bytes
    if part.cohorts.shape != (part.count,) or len(part.bits) != part.count * nb:
        raise InvalidRequest(
            "malformed",
            f"{where}: count {part.count} disagrees with {part.cohorts.size} cohorts and "
            f"{len(part.bits)} bytes of bits",
        )
    if len(part.ids) != ID_BYTES * part.count:
        raise InvalidRequest(
            "malformed",
            f"{where}: report_ids has {len(part.ids)} bytes, expected "
            f"{ID_BYTES}*count = {ID_BYTES * part.count}",
        )
    words = np.frombuffer(part.ids, dtype="<u8")
    if np.count_nonzero(words) != words.size:  # a zero word (rare): is a whole id zero?
        pairs = words.reshape(part.count, 2)
        if not bool((pairs[:, 0] | pairs[:, 1]).all()):
            raise InvalidRequest("report_id", f"{where}: a report id is all zero")
    if part.count and int(part.cohorts.min()) < 0:
        raise InvalidRequest("cohort_range", f"{where}: negative cohort")
    if part.count and int(part.cohorts.max()) >= metric.num_cohorts:
        raise InvalidRequest(
            "cohort_range",
            f"{where}: cohort {int(part.cohorts.max())} out of range [0, {metric.num_cohorts})",
        )
    bits = np.frombuffer(part.bits, dtype=np.uint8).reshape(part.count, nb)
    extra = 8 * nb - metric.payload_bits
    if extra and part.count and int((bits[:, -1] >> (8 - extra)).max()) != 0:
        raise InvalidRequest(
            "padding_bits", f"{where}: bits past bit {metric.payload_bits} must be zero"
        )
    basic = metric.basic
    if basic is not None and basic.mechanism == "krr" and part.count:
        index = bits.astype(np.int64) @ (256 ** np.arange(nb, dtype=np.int64))
        if int(index.max()) >= basic.domain_size:
            raise InvalidRequest(
                "value_range", f"{where}: k-RR index out of range [0, {basic.domain_size})"
            )
    return metric


def validate(
    registry: Registry,
    parts: Sequence[ColumnsIn | RowsIn | SealedIn],
    *,
    max_reports: int,
    keys: PublishedKeys | None = None,
) -> dict[tuple[str, int, int], Pending]:
    """Check every part; return the reports grouped per (metric, fingerprint, window).

    ``keys`` (the published aggregator keys) turns sealing on: then only sealed
    parts are taken, else only clear ones. Raises ``InvalidRequest``, ``StaleKey``
    or ``Overloaded`` (reason in ``.reason``) for the whole request when any part is bad.
    """
    total = sum(p.count for p in parts)
    if total == 0:
        raise InvalidRequest("empty", "the request carries no report")
    if total > max_reports:
        raise Overloaded(
            "too_many_reports", f"{total} reports in one request; the limit is {max_reports}"
        )
    if keys is not None or any(isinstance(p, SealedIn) for p in parts):
        return _validate_sealed(registry, parts, keys)
    if len(parts) == 1 and isinstance(parts[0], RowsIn):  # the device-style fast path
        row = parts[0]
        metric = _check_rows(registry, row)
        return {
            (metric.name, _queue_fingerprint(metric, row), row.window): Rows(
                row.report_bytes, row.cohorts, row.bits, row.ids
            )
        }
    grouped: dict[tuple[str, int, int], list[Pending]] = {}
    for part in parts:
        pending: Pending
        if isinstance(part, SealedIn):  # unreachable: _validate_sealed took them
            raise InvalidRequest("sealing_off", "sealed reports need published keys")
        if isinstance(part, RowsIn):
            metric = _check_rows(registry, part)
            pending = Rows(part.report_bytes, part.cohorts, part.bits, part.ids)
        else:
            if part.count == 0 and not part.bits and part.cohorts.size == 0:
                continue
            metric = _check_one(registry, part)
            pending = Chunk(
                report_bytes=metric.report_bytes,
                cohorts=part.cohorts.astype(np.uint32),
                bits=part.bits,
                ids=part.ids,
            )
        grouped.setdefault((metric.name, _queue_fingerprint(metric, part), part.window), []).append(
            pending
        )
    return {key: group[0] if len(group) == 1 else merge(group) for key, group in grouped.items()}


def _queue_fingerprint(metric: MetricConfig, part: ColumnsIn | RowsIn) -> int:
    """The clear queue's fingerprint: the metric's, or a heavy-hitters report's round's
    (held to the window's round by ``check_rounds``), forwarded with the batch."""
    return part.fingerprint if metric.heavy_hitters is not None else metric.fingerprint


def _validate_sealed(
    registry: Registry,
    parts: Sequence[ColumnsIn | RowsIn | SealedIn],
    keys: PublishedKeys | None,
) -> dict[tuple[str, int, int], Pending]:
    grouped: dict[tuple[str, int, int], list[Pending]] = {}
    per_metric: dict[str, int] = {}
    for part in parts:
        if not isinstance(part, SealedIn):
            if part.count == 0:
                continue
            metric_of_part = registry.get(part.metric)
            if metric_of_part is not None:
                _refuse_clear_histogram(metric_of_part)
            raise InvalidRequest(
                "sealing_required",
                f"metric {part.metric[:128]!r}: this shuffler takes sealed reports only "
                "(seal them to a key from GetConfig)",
            )
        if part.count == 0:
            continue
        metric, qfp = _check_sealed(registry, part, keys)
        per_metric[metric.name] = per_metric.get(metric.name, 0) + part.count
        pending: Pending
        if isinstance(part.key_ids, np.ndarray):  # a column: no per-report Python object
            pending = Chunk(report_bytes=part.sealed_bytes, cohorts=part.key_ids, bits=part.sealed)
        else:
            pending = Rows(part.sealed_bytes, part.key_ids, part.sealed)
        grouped.setdefault((metric.name, qfp, part.window), []).append(pending)
    if not grouped:
        raise InvalidRequest("empty", "the request carries no report")
    check_message_cap(registry, per_metric)
    return {key: group[0] if len(group) == 1 else merge(group) for key, group in grouped.items()}
