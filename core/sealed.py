"""Sealed reports, the format: what device, shuffler and aggregator agree on byte for byte.

RFC 9180 HPKE to the aggregator's public key; no cryptography here (sealing:
``crowdmix.client.sealing``, opening: ``crowdmix.aggregator.sealing.opening``). Plaintext::

    bits (report_bytes) ‖ cohort (u32 LE) ‖ params fingerprint (u64 LE) ‖ report id (16 B)

HPKE ``info`` (RFC 9180 §5.1, §8.1) binds the context, so a report replayed under
another metric, key id or window does not open::

    b"crowdmix/sealed-report" ‖ 0x00 ‖ protocol version (u8) ‖ key id (u32 LE)
      ‖ window (u32 LE) ‖ len(metric) (u16 LE) ‖ metric (UTF-8)

Sealed value: ``enc ‖ ct ‖ tag`` as ``Suite.encrypt`` returns it (enc 32 B for X25519,
1120 B for ML-KEM-768+X25519; tag 16 B). Only the metric and key id travel outside.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from crowdmix.core.errors import CrowdmixError, ParamsError

__all__ = [
    "DEFAULT_SUITE",
    "MAX_KEY_ID",
    "MAX_WINDOW",
    "MLKEM768_X25519_SUITE",
    "PROTOCOL_VERSION",
    "REPORT_ID_BYTES",
    "SUITES",
    "X25519_SUITE",
    "PublicKeyConfig",
    "PublicKeySet",
    "SealedReport",
    "SealingError",
    "SealingSuite",
    "check_report_id",
    "check_window",
    "choose_key",
    "new_report_id",
    "pack_plaintext",
    "plaintext_length",
    "report_info",
    "sealed_length",
    "sealed_length_for",
    "suite_named",
    "unpack_plaintext",
]

PROTOCOL_VERSION: Final = 2
REPORT_ID_BYTES: Final = 16
_INFO_LABEL: Final = b"crowdmix/sealed-report\x00"
_TAG_BYTES: Final = 16  # AES-128-GCM
_TAIL: Final = struct.Struct("<IQ")  # cohort, params fingerprint
MAX_KEY_ID: Final = 0xFFFFFFFF
MAX_WINDOW: Final = 0xFFFFFFFF


class SealingError(CrowdmixError):
    """A report cannot be sealed (no usable key, bad public key, bad field)."""


@dataclass(frozen=True, slots=True)
class SealingSuite:
    """An HPKE suite by the name used in key files and configs."""

    name: str
    enc_bytes: int  # length of the encapsulated key in front of the ciphertext
    public_key_bytes: int
    post_quantum: bool


# DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 / AES-128-GCM: DAP's mandatory suite.
X25519_SUITE: Final = SealingSuite("x25519-hkdf-sha256-aes128gcm", 32, 32, False)
# The hybrid of draft-ietf-hpke-pq: ML-KEM-768 (FIPS 203) and X25519 together, so a
# ciphertext stays sealed if either one holds. Public key = ML-KEM-768 ‖ X25519 here.
MLKEM768_X25519_SUITE: Final = SealingSuite(
    "mlkem768x25519-hkdf-sha256-aes128gcm", 1088 + 32, 1184 + 32, True
)
SUITES: Final[Mapping[str, SealingSuite]] = {
    s.name: s for s in (X25519_SUITE, MLKEM768_X25519_SUITE)
}
DEFAULT_SUITE: Final = X25519_SUITE.name


def suite_named(name: str) -> SealingSuite:
    try:
        return SUITES[name]
    except KeyError:
        raise ParamsError(f"unknown suite {name!r}; one of {', '.join(SUITES)}") from None


def plaintext_length(report_bytes: int) -> int:
    """Bytes sealed per report of a metric whose reports carry ``report_bytes`` bits bytes."""
    if isinstance(report_bytes, bool) or not isinstance(report_bytes, int) or report_bytes < 1:
        raise ParamsError(f"report_bytes must be a positive integer, got {report_bytes!r}")
    return report_bytes + _TAIL.size + REPORT_ID_BYTES


def sealed_length(report_bytes: int, suite: str = DEFAULT_SUITE) -> int:
    """Exact length of every sealed value of a metric under ``suite``: enc ‖ ct ‖ tag."""
    return suite_named(suite).enc_bytes + plaintext_length(report_bytes) + _TAG_BYTES


def sealed_length_for(metric: Any, suite: str = DEFAULT_SUITE) -> int:
    """``sealed_length`` of a ``crowdmix.core.registry.MetricConfig`` (anything with
    ``report_bytes``)."""
    return sealed_length(int(metric.report_bytes), suite)


def report_info(metric: str, key_id: int, window: int) -> bytes:
    """The HPKE ``info`` binding protocol version, key id, collection window and metric."""
    name = metric.encode()
    if not name or len(name) > 0xFFFF:
        raise ParamsError(f"metric name must be 1..65535 UTF-8 bytes, got {metric!r}")
    if isinstance(key_id, bool) or not isinstance(key_id, int) or not 0 <= key_id <= MAX_KEY_ID:
        raise ParamsError(f"key id must be an integer in [0, 2^32), got {key_id!r}")
    check_window(window)
    return _INFO_LABEL + struct.pack("<BIIH", PROTOCOL_VERSION, key_id, window, len(name)) + name


def check_window(window: int) -> int:
    """``window`` if it is a collection window index (an integer in [0, 2^32)), else
    ``ParamsError`` naming it."""
    if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= MAX_WINDOW:
        raise ParamsError(f"window must be an integer in [0, 2^32), got {window!r}")
    return window


def new_report_id() -> bytes:
    """16 fresh bytes from the OS CSPRNG."""
    return os.urandom(REPORT_ID_BYTES)


def check_report_id(report_id: bytes) -> bytes:
    """``report_id`` if it is 16 bytes and not all zero, else ``ParamsError``."""
    if len(report_id) != REPORT_ID_BYTES:
        raise ParamsError(f"report id must be {REPORT_ID_BYTES} bytes, got {len(report_id)}")
    if not any(report_id):
        raise ParamsError("report id must not be all zero (draw it with new_report_id)")
    return report_id


def pack_plaintext(bits: bytes, cohort: int, fingerprint: int, report_id: bytes) -> bytes:
    if not 0 <= cohort <= 0xFFFFFFFF:
        raise ParamsError(f"cohort must fit in 32 bits, got {cohort!r}")
    if not 0 <= fingerprint < 1 << 64:
        raise ParamsError(f"params fingerprint must fit in 64 bits, got {fingerprint!r}")
    check_report_id(report_id)
    return bytes(bits) + _TAIL.pack(cohort, fingerprint) + bytes(report_id)


def unpack_plaintext(plaintext: bytes, report_bytes: int) -> tuple[bytes, int, int, bytes]:
    """(bits, cohort, fingerprint, report id) of one plaintext of the metric's length."""
    if len(plaintext) != plaintext_length(report_bytes):
        raise ParamsError(
            f"plaintext is {len(plaintext)} bytes, expected {plaintext_length(report_bytes)}"
        )
    cohort, fingerprint = _TAIL.unpack_from(plaintext, report_bytes)
    return plaintext[:report_bytes], cohort, fingerprint, plaintext[report_bytes + _TAIL.size :]


@dataclass(frozen=True, slots=True, kw_only=True)
class SealedReport:
    """What leaves the device when sealing is on: metric, key id and window in the clear.

    Byte layout of ``to_bytes`` (for files and a single ``bytes`` field; the
    columnar wire form keeps key ids and sealed values in separate columns)::

        len(metric) (u16 LE) ‖ metric (UTF-8) ‖ key id (u32 LE) ‖ window (u32 LE) ‖ sealed (rest)
    """

    metric: str
    key_id: int
    window: int
    sealed: bytes  # enc ‖ ciphertext ‖ tag

    def __post_init__(self) -> None:
        report_info(self.metric, self.key_id, self.window)  # validates all three
        if not isinstance(self.sealed, bytes) or not self.sealed:
            raise ParamsError("sealed must be non-empty bytes")

    def to_bytes(self) -> bytes:
        name = self.metric.encode()
        head = struct.pack("<H", len(name)) + name
        return head + struct.pack("<II", self.key_id, self.window) + self.sealed

    @classmethod
    def from_bytes(cls, data: bytes) -> SealedReport:
        if len(data) < 2:
            raise ParamsError("sealed report is truncated")
        (n,) = struct.unpack_from("<H", data)
        if len(data) < 2 + n + 8 + 1:
            raise ParamsError("sealed report is truncated")
        try:
            metric = data[2 : 2 + n].decode()
        except UnicodeDecodeError:
            raise ParamsError("sealed report's metric name is not UTF-8") from None
        key_id, window = struct.unpack_from("<II", data, 2 + n)
        return cls(metric=metric, key_id=key_id, window=window, sealed=bytes(data[2 + n + 8 :]))


@dataclass(frozen=True, slots=True, kw_only=True)
class PublicKeyConfig:
    """One of the aggregator's public keys, as published (never a private key).

    A key is usable for sealing from ``not_before`` until ``not_after`` (unix
    seconds; ``None`` = open-ended). The aggregator still opens reports sealed
    to it for a grace period after ``not_after``.
    """

    key_id: int
    suite: str
    public_key: bytes
    not_before: int
    not_after: int | None = None

    def __post_init__(self) -> None:
        report_info("m", self.key_id, 0)
        s = suite_named(self.suite)
        if len(self.public_key) != s.public_key_bytes:
            raise ParamsError(
                f"key {self.key_id}: a {self.suite} public key is {s.public_key_bytes} bytes, "
                f"got {len(self.public_key)}"
            )
        if self.not_after is not None and self.not_after <= self.not_before:
            raise ParamsError(f"key {self.key_id}: not_after must be after not_before")

    def usable_at(self, now: float) -> bool:
        return self.not_before <= now and (self.not_after is None or now < self.not_after)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.key_id,
            "suite": self.suite,
            "public_key": base64.b64encode(self.public_key).decode(),
            "not_before": self.not_before,
            "not_after": self.not_after,
        }

    @classmethod
    def from_json(cls, obj: Any) -> PublicKeyConfig:
        if not isinstance(obj, dict):
            raise ParamsError("a public key entry must be an object")
        try:
            public_key = base64.b64decode(obj["public_key"], validate=True)
            return cls(
                key_id=obj["id"],
                suite=obj["suite"],
                public_key=public_key,
                not_before=int(obj["not_before"]),
                not_after=None if obj.get("not_after") is None else int(obj["not_after"]),
            )
        except KeyError as exc:
            raise ParamsError(f"a public key entry lacks {exc.args[0]!r}") from None
        except (ValueError, TypeError) as exc:
            if isinstance(exc, ParamsError):
                raise
            raise ParamsError(f"a public key entry is malformed: {exc}") from None


@dataclass(frozen=True, slots=True)
class PublicKeySet:
    """The published key config: what a shuffler serves and a device caches.

    JSON: ``{"format": "crowdmix-public-keys", "protocol": 2, "version": "<hash>",
    "keys": [{"id", "suite", "public_key" (base64), "not_before", "not_after"}]}``.
    ``version`` changes whenever the key list does (a cache can compare it).
    """

    keys: tuple[PublicKeyConfig, ...]

    @property
    def version(self) -> str:
        canon = json.dumps([k.to_json() for k in self.keys], sort_keys=True).encode()
        return hashlib.sha256(canon).hexdigest()[:16]

    def to_json(self) -> str:
        doc = {
            "format": "crowdmix-public-keys",
            "protocol": PROTOCOL_VERSION,
            "version": self.version,
            "keys": [k.to_json() for k in self.keys],
        }
        return json.dumps(doc, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> PublicKeySet:
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ParamsError(f"public key config is not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != "crowdmix-public-keys":
            raise ParamsError("not a crowdmix public key config (format field)")
        if doc.get("protocol") != PROTOCOL_VERSION:
            raise ParamsError(f"unsupported protocol version {doc.get('protocol')!r}")
        keys = doc.get("keys")
        if not isinstance(keys, list):
            raise ParamsError("public key config: keys must be a list")
        return cls(tuple(PublicKeyConfig.from_json(k) for k in keys))


def choose_key(keys: Iterable[PublicKeyConfig], now: float) -> PublicKeyConfig:
    """The key a device seals to: of those usable now, the newest (latest not_before)."""
    usable = [k for k in keys if k.usable_at(now)]
    if not usable:
        raise SealingError("no aggregator key is usable now; refetch the key config")
    return max(usable, key=lambda k: (k.not_before, k.key_id))
