"""The one builder of ``SubmitRequest``s, for every sender (``Reporter``, ``ShufflerClient``).

Each report travels with its collection window (``Report.window``; one window per
``ReportColumns``) and the request with the protocol version. Sealed (``key``
given): every report is sealed to ``key`` — a fresh HPKE encapsulation each, the
window bound into ``info`` (``crowdmix.core.sealed``) — so a retry is a new
ciphertext of the same report, same window and report id; a heavy-hitters report
(``round_bound``) carries its round's fingerprint in the clear beside its seal too, for
the shuffler to check against its round. Clear (``key`` None):
the bits, cohort, fingerprint and report id as they are (``sealing="off"``).
Requests of ``columnar_threshold`` reports or more go as columns (cheaper for the
shuffler to parse). Importing this module loads protobuf; sealing loads
``cryptography`` on first use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from crowdmix.client.report import Report
from crowdmix.core.sealed import PROTOCOL_VERSION, PublicKeyConfig
from crowdmix.protos import crowdmix_pb2 as pb

__all__ = ["COLUMNAR_THRESHOLD", "submit_request"]

#: From this many reports on, a request goes as columns.
COLUMNAR_THRESHOLD = 16


def submit_request(
    items: Sequence[tuple[Report, int]],
    *,
    key: PublicKeyConfig | None,
    report_bytes: Mapping[str, int] | None = None,
    columnar_threshold: int = COLUMNAR_THRESHOLD,
    round_bound: frozenset[str] = frozenset(),
) -> pb.SubmitRequest:
    """(report, window) pairs as one request, sealed to ``key`` or clear.

    ``report_bytes`` (metric -> its length) guards the fixed-length promise of a
    sealed metric: bits of another length raise ``ParamsError`` instead of making an
    odd-length ciphertext. ``round_bound``: the heavy-hitters metrics, whose sealed
    reports name their round's fingerprint in the clear."""
    if key is not None:
        return _sealed(items, key, report_bytes or {}, columnar_threshold, round_bound)
    if len(items) < columnar_threshold:
        return pb.SubmitRequest(
            protocol=PROTOCOL_VERSION,
            reports=[
                pb.Report(
                    metric=r.metric,
                    cohort=r.cohort,
                    bits=r.bits,
                    params_fingerprint=r.params_fingerprint,
                    report_id=r.report_id,
                    window=w,
                )
                for r, w in items
            ],
        )
    groups: dict[tuple[str, int, int, int], tuple[list[int], list[bytes], list[bytes]]] = {}
    for r, w in items:
        cohorts, bits, ids = groups.setdefault(
            (r.metric, r.params_fingerprint, len(r.bits), w), ([], [], [])
        )
        cohorts.append(r.cohort)
        bits.append(r.bits)
        ids.append(r.report_id)
    return pb.SubmitRequest(
        protocol=PROTOCOL_VERSION,
        columns=[
            pb.ReportColumns(
                metric=metric,
                params_fingerprint=fp,
                count=len(cohorts),
                report_bytes=nb,
                cohorts=cohorts,
                bits=b"".join(bits),
                report_ids=b"".join(ids),
                window=w,
            )
            for (metric, fp, nb, w), (cohorts, bits, ids) in groups.items()
        ],
    )


def _sealed(
    items: Sequence[tuple[Report, int]],
    key: PublicKeyConfig,
    report_bytes: Mapping[str, int],
    columnar_threshold: int,
    round_bound: frozenset[str],
) -> pb.SubmitRequest:
    from crowdmix.client.sealing import seal_report

    sealed = [
        (
            r.metric,
            w,
            r.params_fingerprint if r.metric in round_bound else 0,
            seal_report(
                key,
                metric=r.metric,
                window=w,
                bits=r.bits,
                cohort=r.cohort,
                fingerprint=r.params_fingerprint,
                report_id=r.report_id,
                report_bytes=report_bytes.get(r.metric),
            ).sealed,
        )
        for r, w in items
    ]
    if len(sealed) < columnar_threshold:
        return pb.SubmitRequest(
            protocol=PROTOCOL_VERSION,
            reports=[
                pb.Report(metric=m, key_id=key.key_id, sealed=v, window=w, params_fingerprint=fp)
                for m, w, fp, v in sealed
            ],
        )
    groups: dict[tuple[str, int, int, int], list[bytes]] = {}
    for m, w, fp, v in sealed:
        groups.setdefault((m, len(v), w, fp), []).append(v)
    return pb.SubmitRequest(
        protocol=PROTOCOL_VERSION,
        columns=[
            pb.ReportColumns(
                metric=m,
                count=len(values),
                key_ids=[key.key_id] * len(values),
                sealed=b"".join(values),
                sealed_bytes=n,
                window=w,
                params_fingerprint=fp,
            )
            for (m, n, w, fp), values in groups.items()
        ],
    )
