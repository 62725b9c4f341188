"""The RAPPOR encoder: Bloom filter -> permanent RR -> instantaneous RR.

The permanent randomized response (PRR, parameter f) is a deterministic function of
(client secret, metric, Bloom bits) through a keyed PRF, so it is memoised without
storing anything and repeated reports reveal no more than ε_∞ (crowdmix.core.privacy).
``mmh3`` mode: keyed BLAKE2b (personalisation ``crowdmix.prr.v1``) streams a uniform word
U and an exact Bernoulli(f) mask N; PRR = B ^ ((B ^ U) & N). ``rappor-md5`` mode:
google/rappor's HMAC-SHA256 coin rule, for bit-compatible reports. The instantaneous
randomized response (IRR, p and q) is fresh per report from a CSPRNG: Bernoulli(q) where
the PRR bit is 1, Bernoulli(p) where 0, both masks from one ``random_bits`` call. The hot
path ``encode`` computes exactly ``instantaneous_response(permanent_response(bloom(value)))``
(tests check bit for bit). The exact PRF byte layout: docs/design.md, "Client".
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from os import urandom as _urandom

import mmh3

from crowdmix.client.randomness import (
    MAX_FIXED_DIGITS,
    BitSource,
    bernoulli_bits,
    probability_digits,
    shared_secure_bits,
    word_sampler,
)
from crowdmix.client.report import Report, make_report
from crowdmix.core.hashing import bloom_int, value_bytes
from crowdmix.core.params import Hashing, RapporParams

__all__ = [
    "InstantaneousResponse",
    "PermanentResponse",
    "PrrRule",
    "RapporEncoder",
    "ShortSecretWarning",
    "cohort_for_secret",
    "new_secret",
]

_MIN_SECRET_BYTES = 16
_PERSON_PRR = b"crowdmix.prr.v1"
_PERSON_COHORT = b"crowdmix.cht.v1"
_BLOCK_BITS = 512  # one BLAKE2b-512 digest
_M32 = 0xFFFFFFFF


class ShortSecretWarning(UserWarning):
    """A ``rappor-md5`` secret shorter than the PRR needs: its privacy rests on the secret."""


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


class _PrfStream:
    """A deterministic BitSource: the keyed-BLAKE2b bit stream S of one PRR input."""

    __slots__ = ("_acc", "_base", "_block", "_have")

    def __init__(self, base: hashlib.blake2b) -> None:
        self._base = base  # state after M; block j appends j as u32 LE
        self._block = 0
        self._acc = 0
        self._have = 0

    def random_bits(self, nbits: int) -> int:
        while self._have < nbits:
            h = self._base.copy()
            h.update(self._block.to_bytes(4, "little"))
            self._block += 1
            self._acc |= int.from_bytes(h.digest(), "little") << self._have
            self._have += _BLOCK_BITS
        value = self._acc & ((1 << nbits) - 1)
        self._acc >>= nbits
        self._have -= nbits
        return value


def _fixed_words(prob: float) -> bool:
    return prob == 1.0 or len(probability_digits(prob)) <= MAX_FIXED_DIGITS


def _mmh3_bloom(k: int, h: int, cohort: int) -> Callable[[bytes], int]:
    """Bloom filter of value bytes, as DESIGN.md's mmh3 rule (specialised by h)."""
    hash128 = mmh3.hash128
    if h == 1:
        return lambda data: 1 << ((hash128(data, cohort, True, False) & _M32) % k)
    if h == 2:

        def bloom2(data: bytes) -> int:
            d = hash128(data, cohort, True, False)
            return (1 << ((d & _M32) % k)) | (1 << (((d >> 32) & _M32) % k))

        return bloom2
    shifts = tuple(32 * i for i in range(h))

    def bloom_n(data: bytes) -> int:
        d = hash128(data, cohort, True, False)
        b = 0
        for s in shifts:
            b |= 1 << (((d >> s) & _M32) % k)
        return b

    return bloom_n


class PrrRule:
    """The PRR of one (params, hashing), shared by all clients; ``keyed`` binds a client.

    Building the rule (Bernoulli formulas, block layout) costs a few µs; binding
    a client costs one keyed BLAKE2b set-up, so simulations of many clients
    build the rule once (crowdmix.client.batch).
    """

    __slots__ = ("_digits", "_hashing", "_noise_of", "_one_block", "_params")

    def __init__(self, params: RapporParams, hashing: Hashing) -> None:
        params.check_hashing(hashing)
        self._params = params
        self._hashing: Hashing = hashing
        f, k = params.f, params.k
        self._one_block = False
        self._noise_of: Callable[[int], int] | None = None
        if _fixed_words(f):
            words, noise_of = word_sampler(f, k, first_word=1)
            if (1 + words) * k <= _BLOCK_BITS:
                self._one_block, self._noise_of = True, noise_of
        self._digits = probability_digits(f) if f < 1.0 else ()

    @property
    def one_block_noise(self) -> Callable[[int], int] | None:
        """mmh3 mode, when U and N fit one BLAKE2b block S: S -> N (U is S's word 0)."""
        return self._noise_of if self._one_block and self._hashing == "mmh3" else None

    def keyed_prefix(self, secret: bytes, metric: str) -> hashlib.blake2b:
        """Keyed BLAKE2b state after len(metric) ‖ metric (mmh3 mode)."""
        if len(secret) < _MIN_SECRET_BYTES:
            raise ValueError(f"secret must be at least {_MIN_SECRET_BYTES} bytes to key the PRR")
        mb = metric.encode("utf-8")
        prefix = hashlib.blake2b(key=_prf_key(secret), person=_PERSON_PRR, digest_size=64)
        prefix.update(len(mb).to_bytes(4, "little") + mb)
        return prefix

    def keyed(
        self, secret: bytes, metric: str, prefix: hashlib.blake2b | None = None
    ) -> Callable[[int], int]:
        """bloom -> PRR of the client holding ``secret``, for ``metric``.

        ``prefix`` may pass ``keyed_prefix(secret, metric)`` if already computed.
        """
        params = self._params
        k, f = params.k, params.f
        if self._hashing == "rappor-md5":
            return lambda bloom: _google_prr(secret, bloom, f, k)
        if prefix is None:
            prefix = self.keyed_prefix(secret, metric)
        noise_of = self._noise_of
        if self._one_block and noise_of is not None:
            # M ‖ block 0 in one update: the Bloom bytes followed by four zero bytes.
            head = (k + 7) // 8 + 4

            def prr_one_block(bloom: int) -> int:
                h = prefix.copy()
                h.update(bloom.to_bytes(head, "little"))
                s = int.from_bytes(h.digest(), "little")
                return bloom ^ ((bloom ^ s) & noise_of(s))

            return prr_one_block
        digits = self._digits
        nbytes = (k + 7) // 8

        def prr_stream(bloom: int) -> int:
            h = prefix.copy()
            h.update(bloom.to_bytes(nbytes, "little"))
            stream = _PrfStream(h)
            uniform = stream.random_bits(k)
            noise = bernoulli_bits(stream, f, k, digits)
            return bloom ^ ((bloom ^ uniform) & noise)

        return prr_stream


@functools.lru_cache(maxsize=64)
def _rule_for(params: RapporParams, hashing: Hashing) -> PrrRule:
    return PrrRule(params, hashing)


class RapporEncoder:
    """Encodes values of one metric for one client.

    >>> enc = RapporEncoder(RapporParams(), secret=new_secret(), metric="home_page")
    >>> report = enc.encode("example.com")
    >>> report.metric, 0 <= report.cohort < RapporParams().m
    ('home_page', True)

    ``rand`` is the IRR's randomness; leave it unset outside tests (the default
    reads the OS CSPRNG). ``cohort`` defaults to a PRF of the secret.
    """

    __slots__ = (
        "_encode",
        "_fingerprint",
        "_hashing",
        "_irr",
        "_new_id",
        "_params",
        "_prr",
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
        random_bytes: Callable[[int], bytes] | None = None,
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
        if hashing == "rappor-md5" and len(secret_b) < _MIN_SECRET_BYTES:
            # google/rappor's own clients often use short secrets; reading their reports
            # must keep working, but the PRR is only as unpredictable as the secret.
            warnings.warn(
                f"rappor-md5 with a {len(secret_b)}-byte secret: the permanent randomized "
                "response rests on the secret's entropy (an attacker who can guess it can "
                f"undo the PRR); use at least {_MIN_SECRET_BYTES} random bytes",
                ShortSecretWarning,
                stacklevel=2,
            )
        if cohort is None:
            cohort = cohort_for_secret(secret_b, params.m)
        elif isinstance(cohort, bool) or not isinstance(cohort, int) or not 0 <= cohort < params.m:
            raise ValueError(f"cohort must be an integer in [0, {params.m}), got {cohort!r}")
        self._params = params
        self._hashing: Hashing = hashing
        self._secret = secret_b
        self.metric = metric
        self.cohort = cohort
        self._rand: BitSource = rand if rand is not None else shared_secure_bits()
        # report ids: os.urandom unless a test injects a source (``random_bytes(16)``)
        self._new_id: Callable[[int], bytes] = (
            random_bytes if random_bytes is not None else _urandom
        )
        self._fingerprint = params.fingerprint(hashing)
        rule = _rule_for(params, hashing)
        prefix = rule.keyed_prefix(secret_b, metric) if hashing == "mmh3" else None
        self._prr = rule.keyed(secret_b, metric, prefix)
        self._irr = self._irr_function()
        fused = self._build_fused(rule, prefix) if prefix is not None else None
        self._encode = fused if fused is not None else self._build_encode()

    @property
    def params(self) -> RapporParams:
        return self._params

    @property
    def hashing(self) -> Hashing:
        return self._hashing

    @property
    def fingerprint(self) -> int:
        return self._fingerprint

    def bloom(self, value: str | bytes) -> int:
        """The Bloom filter of ``value`` in this client's cohort, as an int."""
        return bloom_int(value, self.cohort, self._params, self._hashing)

    def permanent_response(self, bloom: int) -> PermanentResponse:
        """The memoised PRR of a Bloom filter (same inputs, same output, always)."""
        return PermanentResponse(self._prr(bloom))

    def instantaneous_response(self, prr: PermanentResponse) -> InstantaneousResponse:
        """Fresh IRR of a PRR: Bernoulli(q) on its 1 bits, Bernoulli(p) on its 0 bits."""
        return InstantaneousResponse(self._irr(prr.bits))

    def encode(self, value: str | bytes) -> Report:
        """One report of ``value``: ε_1-LDP on its own (crowdmix.core.privacy)."""
        return self._encode(value)

    # -- the three stages as closures over precomputed constants ---------------

    def _irr_function(self) -> Callable[[int], int]:
        params = self._params
        k, p, q = params.k, params.p, params.q
        draw = self._rand.random_bits
        if _fixed_words(p) and _fixed_words(q):
            wp, p_of = word_sampler(p, k, first_word=0)
            wq, q_of = word_sampler(q, k, first_word=wp)
            total = (wp + wq) * k

            def irr_fixed(prr: int) -> int:
                x = draw(total)
                pb = p_of(x)
                return pb ^ ((pb ^ q_of(x)) & prr)

            return irr_fixed
        rand = self._rand
        p_digits = probability_digits(p) if p < 1.0 else ()
        q_digits = probability_digits(q) if q < 1.0 else ()

        def irr_loop(prr: int) -> int:
            pb = bernoulli_bits(rand, p, k, p_digits)
            qb = bernoulli_bits(rand, q, k, q_digits)
            return pb ^ ((pb ^ qb) & prr)

        return irr_loop

    def _build_fused(
        self, rule: PrrRule, prefix: hashlib.blake2b
    ) -> Callable[[str | bytes], Report] | None:
        """encode() as one closure, for mmh3 with a one-block PRR and fixed IRR formulas
        (the usual case): the same operations as bloom -> _prr -> _irr, inlined."""
        params = self._params
        k, p, q = params.k, params.p, params.q
        noise_of = rule.one_block_noise
        if noise_of is None or not (_fixed_words(p) and _fixed_words(q)):
            return None
        head = (k + 7) // 8 + 4
        nbytes = params.report_bytes
        wp, p_of = word_sampler(p, k, first_word=0)
        wq, q_of = word_sampler(q, k, first_word=wp)
        total = (wp + wq) * k
        draw = self._rand.random_bits
        bloom_of = _mmh3_bloom(k, params.h, self.cohort)
        metric, cohort, fp = self.metric, self.cohort, self._fingerprint
        new_id = self._new_id
        from_bytes = int.from_bytes

        def encode_fused(value: str | bytes) -> Report:
            data = value.encode() if type(value) is str else value_bytes(value)
            bloom = bloom_of(data)
            h = prefix.copy()
            h.update(bloom.to_bytes(head, "little"))
            s = from_bytes(h.digest(), "little")
            prr = bloom ^ ((bloom ^ s) & noise_of(s))
            x = draw(total)
            pb = p_of(x)
            bits = pb ^ ((pb ^ q_of(x)) & prr)
            return make_report(metric, cohort, bits.to_bytes(nbytes, "little"), fp, new_id(16))

        return encode_fused

    def _build_encode(self) -> Callable[[str | bytes], Report]:
        params = self._params
        k = params.k
        nbytes = params.report_bytes
        metric, cohort, fp = self.metric, self.cohort, self._fingerprint
        prr_of, irr_of = self._prr, self._irr
        new_id = self._new_id
        if self._hashing == "mmh3":
            bloom_of = _mmh3_bloom(k, params.h, cohort)

            def encode_mmh3(value: str | bytes) -> Report:
                data = value.encode() if type(value) is str else value_bytes(value)
                bits = irr_of(prr_of(bloom_of(data)))
                return make_report(metric, cohort, bits.to_bytes(nbytes, "little"), fp, new_id(16))

            return encode_mmh3
        bloom = self.bloom

        def encode_generic(value: str | bytes) -> Report:
            bits = irr_of(prr_of(bloom(value)))
            return make_report(metric, cohort, bits.to_bytes(nbytes, "little"), fp, new_id(16))

        return encode_generic


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
