"""Protobuf ↔ domain conversion, at the edge only (the domain never sees protos).

The request's ``protocol`` must be ``PROTOCOL_VERSION`` (else INVALID_ARGUMENT
"protocol_unsupported"), and every clear report carries a 16-byte report id that
is not all zero (else "report_id").

Rows (``Report`` messages) are grouped by (metric, fingerprint, bit length,
window) into ``RowsIn``: grouping is the one per-report loop, unavoidable for
per-report protobuf objects, and is why bulk senders should send
``ReportColumns`` (``ColumnsIn``, checked with numpy).

Sealed reports (``Report.sealed``, ``ReportColumns.sealed``) become ``SealedIn``; one
that sets clear fields too is refused ("mixed_sealed"): nothing clear rides along with a
seal but a heavy-hitters report's round fingerprint (public), for the shuffler to check.
"""

from __future__ import annotations

import numpy as np

from crowdmix.core.sealed import PROTOCOL_VERSION
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.shuffler.columns import ID_BYTES, Chunk
from crowdmix.shuffler.config_service import is_sealed_queue
from crowdmix.shuffler.errors import InvalidRequest
from crowdmix.shuffler.store import InFlightBatch, QueueKey
from crowdmix.shuffler.validation import ColumnsIn, RowsIn, SealedIn

__all__ = ["batch_from_proto", "batch_to_proto", "request_to_columns"]


_ZERO_ID = bytes(ID_BYTES)


def _mixed(what: str) -> InvalidRequest:
    return InvalidRequest(
        "mixed_sealed",
        f"{what} sets sealed fields and clear ones (cohort, bits, report id): a sealed "
        "report carries them inside its seal only",
    )


def _sealed_rows(reports: list[pb.Report]) -> list[SealedIn]:
    groups: dict[tuple[str, int, int, int], tuple[list[int], list[bytes]]] = {}
    for r in reports:
        if r.cohort or r.bits or r.report_id or not r.sealed:
            raise _mixed("a report")
        key_ids, sealed = groups.setdefault(
            (r.metric, len(r.sealed), r.window, r.params_fingerprint), ([], [])
        )
        key_ids.append(r.key_id)
        sealed.append(r.sealed)
    return [
        SealedIn(metric=m, window=w, key_ids=k, sealed=b"".join(s), sealed_bytes=n, fingerprint=fp)
        for (m, n, w, fp), (k, s) in groups.items()
    ]


def _sealed_columns(c: pb.ReportColumns) -> SealedIn:
    if c.report_bytes or c.cohorts or c.bits or c.report_ids:
        raise _mixed("a column")
    if len(c.key_ids) != c.count:
        raise InvalidRequest(
            "malformed", f"count {c.count} disagrees with {len(c.key_ids)} key ids"
        )
    return SealedIn(
        metric=c.metric,
        window=c.window,
        key_ids=np.fromiter(c.key_ids, dtype=np.uint32, count=len(c.key_ids)),
        sealed=c.sealed,
        sealed_bytes=c.sealed_bytes,
        fingerprint=c.params_fingerprint,
    )


def request_to_columns(request: pb.SubmitRequest) -> list[ColumnsIn | RowsIn | SealedIn]:
    """The request's reports grouped for validation; another protocol than ours, or a
    clear report without a valid report id, makes the whole request INVALID_ARGUMENT."""
    if request.protocol != PROTOCOL_VERSION:
        raise InvalidRequest(
            "protocol_unsupported",
            f"protocol {request.protocol} is not supported: this shuffler speaks protocol "
            f"{PROTOCOL_VERSION} (update the SDK)",
        )
    parts: list[ColumnsIn | RowsIn | SealedIn] = []
    reports = list(request.reports)
    sealed_rows = [r for r in reports if r.sealed or r.key_id]
    if sealed_rows:
        parts.extend(_sealed_rows(sealed_rows))
        reports = [r for r in reports if not (r.sealed or r.key_id)]
    if reports:
        groups: dict[tuple[str, int, int, int], tuple[list[int], list[bytes], list[bytes]]] = {}
        for r in reports:
            cohorts, bits, ids = groups.setdefault(
                (r.metric, r.params_fingerprint, len(r.bits), r.window), ([], [], [])
            )
            cohorts.append(r.cohort)
            bits.append(r.bits)
            ids.append(r.report_id)
        for (metric, fp, nb, window), (cohorts, bits, ids) in groups.items():
            parts.append(
                RowsIn(
                    metric=metric,
                    window=window,
                    fingerprint=fp,
                    report_bytes=nb,
                    cohorts=cohorts,
                    bits=b"".join(bits),
                    ids=_row_ids(ids),
                )
            )
    for c in request.columns:
        if c.sealed or c.key_ids or c.sealed_bytes:
            parts.append(_sealed_columns(c))
            continue
        parts.append(
            ColumnsIn(
                metric=c.metric,
                window=c.window,
                fingerprint=c.params_fingerprint,
                count=c.count,
                report_bytes=c.report_bytes,
                cohorts=np.fromiter(c.cohorts, dtype=np.int64, count=len(c.cohorts)),
                bits=c.bits,
                ids=c.report_ids,
            )
        )
    return parts


def _row_ids(ids: list[bytes]) -> bytes:
    """The rows' ids as one column; each must be 16 bytes, not all zero."""
    for rid in ids:
        if len(rid) != ID_BYTES or rid == _ZERO_ID:
            raise InvalidRequest(
                "report_id",
                f"a report id must be {ID_BYTES} bytes, not all zero, got "
                f"{'zeros' if rid == _ZERO_ID else f'{len(rid)} bytes'}",
            )
    return b"".join(ids)


def batch_to_proto(batch: InFlightBatch) -> pb.Batch:
    chunk = batch.chunk
    if is_sealed_queue(batch.key.fingerprint):
        # opaque rows: the cohort column holds key ids, the bits column sealed values
        return pb.Batch(
            batch_id=batch.batch_id,
            window=batch.key.window,
            reports=pb.ReportColumns(
                metric=batch.metric,
                count=chunk.count,
                key_ids=chunk.cohorts.tolist(),
                sealed=chunk.bits,
                sealed_bytes=chunk.report_bytes,
            ),
        )
    return pb.Batch(
        batch_id=batch.batch_id,
        window=batch.key.window,
        reports=pb.ReportColumns(
            metric=batch.metric,
            params_fingerprint=batch.key.fingerprint,
            count=chunk.count,
            report_bytes=chunk.report_bytes,
            cohorts=chunk.cohorts.tolist(),
            bits=chunk.bits,
            report_ids=chunk.ids,
        ),
    )


def batch_from_proto(message: pb.Batch) -> InFlightBatch:
    """The inverse of ``batch_to_proto`` for clear batches (test receivers, round-trip
    tests); a sealed batch is the aggregator's to open (``crowdmix.aggregator.daemon.service``)."""
    cols = message.reports
    return InFlightBatch(
        batch_id=message.batch_id,
        metric=cols.metric,
        key=QueueKey(window=message.window, fingerprint=cols.params_fingerprint),
        chunk=Chunk(
            report_bytes=cols.report_bytes,
            cohorts=np.fromiter(cols.cohorts, dtype=np.uint32, count=len(cols.cohorts)),
            bits=cols.bits,
            ids=cols.report_ids,
        ),
    )
