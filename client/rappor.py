"""The RAPPOR encoder: Bloom filter -> permanent RR -> instantaneous RR.

- Permanent randomized response (PRR, parameter f) is a deterministic function
  of (client secret, metric, Bloom bits) through a keyed PRF, so it is
  memoised without storing anything: a client that reports the same value
  again sends the same PRR, and averaging its reports reveals no more than
  ε_∞ (client.privacy).
  * ``mmh3`` mode: keyed BLAKE2b (key = secret) streams the PRF's bits; one
    uniform word, then a Bernoulli(f) noise mask sampled exactly
    (client.randomness). PRR = (B & ~noise) | (uniform & noise).
  * ``rappor-md5`` mode: google/rappor's HMAC-SHA256(secret, 4-byte big-endian
    Bloom) with its byte-wise coin rule (bit i: digest byte i, low bit =
    uniform, high 7 bits < f*128 = noise), for bit-compatible reports.
- Instantaneous randomized response (IRR, p and q) is fresh for every report,
  from a CSPRNG by default: report bit = Bernoulli(q) where PRR is 1,
  Bernoulli(p) where it is 0.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from client.hashing import bloom_int
from client.params import Hashing, RapporParams
from client.randomness import BitSource, SecureBits, bernoulli_bits, probability_digits
from client.report import Report, pack_bits

__all__ = [
    "InstantaneousResponse",
    "PermanentResponse",
    "RapporEncoder",
    "cohort_for_secret",
    "new_secret",
]

_MIN_SECRET_BYTES = 16
_PERSON_PRR = b"crowdmix.prr.v1"
_PERSON_COHORT = b"crowdmix.cht.v1"


def new_secret() -> bytes:
    """A fresh 32-byte client secret from the OS CSPRNG. Store it; reuse it."""
    import os

    return os.urandom(32)


def _secret_bytes(secret: bytes | str) -> bytes:
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if not isinstance(secret, bytes) or not secret:
        raise ValueError("secret must be non-empty bytes or str")
    return secret


def _prf_key(secret: bytes) -> bytes:
    # BLAKE2b keys are at most 64 bytes; longer secrets are hashed down.
    return secret if len(secret) <= 64 else hashlib.blake2b(secret).digest()


def cohort_for_secret(secret: bytes | str, m: int) -> int:
    """The client's cohort in [0, m): a PRF of its secret, never re-drawn per report."""
    key = _prf_key(_secret_bytes(secret))
    d = hashlib.blake2b(b"cohort", key=key, person=_PERSON_COHORT, digest_size=16).digest()
    return int.from_bytes(d, "little") % m  # bias <= m / 2**128


@dataclass(frozen=True, slots=True)
class PermanentResponse:
    """The memoised PRR of one Bloom filter, as an int (bit i = bit i)."""

    bits: int


@dataclass(frozen=True, slots=True)
class InstantaneousResponse:
    """One report's bits after IRR, as an int (bit i = bit i)."""

    bits: int


class _PrfBits:
    """A deterministic BitSource: the keyed-BLAKE2b stream for one PRR input."""

    __slots__ = ("_base", "_block", "_buf", "_pos")

    def __init__(self, base: hashlib.blake2b) -> None:
        self._base = base
        self._block = 0
        self._buf = b""
        self._pos = 0

    def random_bits(self, nbits: int) -> int:
        nbytes = (nbits + 7) >> 3
        while self._pos + nbytes > len(self._buf):
            h = self._base.copy()
            h.update(self._block.to_bytes(4, "little"))
            self._block += 1
            self._buf = self._buf[self._pos :] + h.digest()
            self._pos = 0
        value = int.from_bytes(self._buf[self._pos : self._pos + nbytes], "little")
        self._pos += nbytes
        extra = nbytes * 8 - nbits
        return value >> extra if extra else value


class RapporEncoder:
    """Encodes values of one metric for one client.

    >>> enc = RapporEncoder(RapporParams(), secret=new_secret(), metric="home_page")
    >>> report = enc.encode("example.com")  # doctest: +SKIP

    ``rand`` is the IRR's randomness; leave it unset outside tests (the default
    reads the OS CSPRNG). ``cohort`` defaults to a PRF of the secret.
    """

    __slots__ = (
        "_fingerprint",
        "_hashing",
        "_irr_p",
        "_irr_q",
        "_key",
        "_metric_prefix",
        "_params",
        "_prr_digits",
        "_rand",
        "_secret",
        "cohort",
        "metric",
    )

    def __init__(
        self,
        params: RapporParams,
        *,
        secret: bytes | str,
        metric: str,
        hashing: Hashing = "mmh3",
        rand: BitSource | None = None,
        cohort: int | None = None,
    ) -> None:
        if not isinstance(params, RapporParams):
            raise TypeError("params must be a RapporParams")
        params.check_hashing(hashing)
        if not isinstance(metric, str) or not metric:
            raise ValueError("metric must be a non-empty string")
        secret_b = _secret_bytes(secret)
        if hashing == "mmh3" and len(secret_b) < _MIN_SECRET_BYTES:
            raise ValueError(
                f"secret must be at least {_MIN_SECRET_BYTES} bytes to key the PRR "
                "(use client.new_secret() once per client and store it)"
            )
        if cohort is None:
            cohort = cohort_for_secret(secret_b, params.m)
        elif isinstance(cohort, bool) or not isinstance(cohort, int) or not 0 <= cohort < params.m:
            raise ValueError(f"cohort must be an integer in [0, {params.m}), got {cohort!r}")
        self._params = params
        self._hashing: Hashing = hashing
        self._secret = secret_b
        self._key = _prf_key(secret_b)
        self.metric = metric
        self.cohort = cohort
        self._rand: BitSource = rand if rand is not None else SecureBits()
        self._fingerprint = params.fingerprint(hashing)
        mb = metric.encode("utf-8")
        self._metric_prefix = hashlib.blake2b(key=self._key, person=_PERSON_PRR, digest_size=64)
        self._metric_prefix.update(len(mb).to_bytes(4, "little") + mb)
        self._prr_digits = probability_digits(params.f)
        self._irr_p = probability_digits(params.p) if params.p < 1.0 else None
        self._irr_q = probability_digits(params.q) if params.q < 1.0 else None

    @property
    def params(self) -> RapporParams:
        return self._params

    @property
    def hashing(self) -> Hashing:
        return self._hashing

    def bloom(self, value: str | bytes) -> int:
        """The Bloom filter of ``value`` in this client's cohort, as an int."""
        return bloom_int(value, self.cohort, self._params, self._hashing)

    def permanent_response(self, bloom: int) -> PermanentResponse:
        """The memoised PRR of a Bloom filter (same inputs, same output, always)."""
        k = self._params.k
        if self._hashing == "rappor-md5":
            return PermanentResponse(_google_prr(self._secret, bloom, self._params.f, k))
        h = self._metric_prefix.copy()
        h.update(pack_bits(bloom, k))
        stream = _PrfBits(h)
        uniform = stream.random_bits(k)
        noise = bernoulli_bits(stream, self._params.f, k, self._prr_digits)
        return PermanentResponse((bloom & ~noise) | (uniform & noise))

    def instantaneous_response(self, prr: PermanentResponse) -> InstantaneousResponse:
        """Fresh IRR of a PRR: Bernoulli(q) on its 1 bits, Bernoulli(p) on its 0 bits."""
        k = self._params.k
        rand = self._rand
        p_bits = bernoulli_bits(rand, self._params.p, k, self._irr_p)
        q_bits = bernoulli_bits(rand, self._params.q, k, self._irr_q)
        return InstantaneousResponse((p_bits & ~prr.bits) | (q_bits & prr.bits))

    def encode(self, value: str | bytes) -> Report:
        """One report of ``value``: ε_1-LDP on its own (client.privacy)."""
        prr = self.permanent_response(self.bloom(value))
        irr = self.instantaneous_response(prr)
        return Report(
            metric=self.metric,
            cohort=self.cohort,
            bits=pack_bits(irr.bits, self._params.k),
            params_fingerprint=self._fingerprint,
        )


def _google_prr(secret: bytes, bloom: int, f: float, k: int) -> int:
    """google/rappor client's PRR: HMAC-SHA256 over the 4-byte big-endian Bloom."""
    digest = hmac.new(secret, bloom.to_bytes(4, "big"), hashlib.sha256).digest()
    threshold128 = f * 128
    uniform = 0
    f_mask = 0
    for i in range(k):
        byte = digest[i]
        uniform |= (byte & 0x01) << i
        if (byte >> 1) < threshold128:
            f_mask |= 1 << i
    return (bloom & ~f_mask) | (uniform & f_mask)
