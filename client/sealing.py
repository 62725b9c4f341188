"""Sealing on the device: HPKE (RFC 9180) encryption of a report to the aggregator.

The format (plaintext layout, ``info``, lengths, key configs) is ``crowdmix.core.sealed``,
the suites ``crowdmix.core.hpke``; this module adds the device's part: the encryption.

``cryptography`` (>= 47, the first version with ``hazmat.primitives.hpke``) is an
optional extra, imported through ``crowdmix.core.hpke`` (a missing package raises
``ModuleNotFoundError`` naming the extra to install); ``import client`` does not import
this module (like ``crowdmix.client.batch``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from crowdmix.core.errors import ParamsError
from crowdmix.core.hpke import hpke_suite, public_key
from crowdmix.core.sealed import (
    SUITES,
    PublicKeyConfig,
    SealedReport,
    pack_plaintext,
    report_info,
)

__all__ = ["public_key_object", "seal_many", "seal_report"]


def public_key_object(key: PublicKeyConfig) -> Any:
    """The ``cryptography`` public key of a published key (cached)."""
    return public_key(key.suite, key.public_key)


def seal_report(
    key: PublicKeyConfig,
    *,
    metric: str,
    window: int,
    bits: bytes,
    cohort: int,
    fingerprint: int,
    report_id: bytes,
    report_bytes: int | None = None,
) -> SealedReport:
    """Seal one report to ``key``. Each call draws a fresh ephemeral KEM key pair
    inside ``cryptography`` (OpenSSL's CSPRNG); nothing here chooses randomness.

    ``report_bytes`` (the metric's length) guards the fixed-length promise: bits
    of another length raise instead of making an odd-length ciphertext.
    """
    if report_bytes is not None and len(bits) != report_bytes:
        raise ParamsError(f"metric {metric!r}: bits must be {report_bytes} bytes, got {len(bits)}")
    plaintext = pack_plaintext(bits, cohort, fingerprint, report_id)
    sealed = _SUITE_OBJECTS[key.suite].encrypt(
        plaintext, public_key_object(key), info=report_info(metric, key.key_id, window)
    )
    return SealedReport(metric=metric, key_id=key.key_id, window=window, sealed=sealed)


def seal_many(
    key: PublicKeyConfig,
    metric: str,
    window: int,
    rows: Sequence[tuple[bytes, int, int, bytes]],
) -> list[bytes]:
    """Sealed values of many (bits, cohort, fingerprint, report id) rows of one
    collection window: one ``info`` for all; used by simulators and benchmarks."""
    info = report_info(metric, key.key_id, window)
    encrypt = _SUITE_OBJECTS[key.suite].encrypt
    pub = public_key_object(key)
    return [encrypt(pack_plaintext(b, c, f, r), pub, info=info) for b, c, f, r in rows]


_SUITE_OBJECTS: Final = {name: hpke_suite(s) for name, s in SUITES.items()}
