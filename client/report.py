"""The encoded report as the SDK hands it to a transport (not a protobuf)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["REPORT_ID_BYTES", "Report", "make_report", "new_report_id", "pack_bits", "unpack_bits"]

#: A report id is 16 bytes from the CSPRNG (see ``Report.report_id``).
REPORT_ID_BYTES = 16


def new_report_id(random_bytes: Callable[[int], bytes] = os.urandom) -> bytes:
    """A fresh report id: 16 bytes from ``random_bytes`` (the OS CSPRNG by default)."""
    rid = random_bytes(REPORT_ID_BYTES)
    if len(rid) != REPORT_ID_BYTES:
        raise ValueError(f"a report id is {REPORT_ID_BYTES} bytes, the source gave {len(rid)}")
    return rid


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """One report: what leaves the device. Bit i is bit i % 8 of byte i // 8.

    ``report_id`` is 16 fresh CSPRNG bytes, drawn when the report is encoded
    (``new_report_id``) and kept through every retry of the transport: the
    aggregator counts an id at most once in the window the report names, so a retry
    after an unknown outcome cannot count the report twice. It is independent of the
    value, the client secret and every other report, so it links nothing. It is not
    part of equality: two reports with the same content are equal whatever their ids.
    """

    metric: str
    cohort: int
    bits: bytes
    params_fingerprint: int
    report_id: bytes = field(default_factory=new_report_id, compare=False)


# A frozen dataclass's __init__ sets each field through object.__setattr__
# (0.8 µs, a quarter of an encode); the encoders' hot path fills the slots
# directly. Same object, same equality and hash; callers use Report(...).
_new = object.__new__
_set_metric = vars(Report)["metric"].__set__
_set_cohort = vars(Report)["cohort"].__set__
_set_bits = vars(Report)["bits"].__set__
_set_fingerprint = vars(Report)["params_fingerprint"].__set__
_set_report_id = vars(Report)["report_id"].__set__


def make_report(
    metric: str, cohort: int, bits: bytes, params_fingerprint: int, report_id: bytes
) -> Report:
    """``Report(metric=..., ...)`` for already-validated fields, without the frozen-init cost."""
    r: Report = _new(Report)
    _set_metric(r, metric)
    _set_cohort(r, cohort)
    _set_bits(r, bits)
    _set_fingerprint(r, params_fingerprint)
    _set_report_id(r, report_id)
    return r


def pack_bits(value: int, nbits: int) -> bytes:
    """Bits of an int (bit i = Bloom bit i) as ceil(nbits/8) little-endian bytes."""
    return value.to_bytes((nbits + 7) // 8, "little")


def unpack_bits(data: bytes, nbits: int) -> list[int]:
    value = int.from_bytes(data, "little")
    return [i for i in range(nbits) if (value >> i) & 1]
