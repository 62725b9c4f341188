"""Vectorised RAPPOR encoding for simulations and benchmarks (numpy; import explicitly).

``import crowdmix.client`` does not load this module (nor numpy): use
``from crowdmix.client.batch import BatchEncoder``; needs the ``sim`` extra.

    enc = BatchEncoder(params, metric="home_page")
    table = enc.bloom_table(candidates)                 # (C, m, ceil(k/8)) uint8
    batch = enc.encode_indices(table, value_idx, cohorts)   # one report per client
    columns = (batch.cohorts, batch.bits)               # ready for ReportColumns

Bloom bits and the IRR equal the per-report encoder's exactly; ``encode_clients`` keeps
the memoised PRR bit for bit (use it when a client reports more than once);
``encode_indices`` draws a fresh PRR per report (same law for a one-time report).
Randomness is a CSPRNG (AES-256-CTR keyed from ``os.urandom``); tests inject a seeded
``ByteSource``. Equivalences in detail: docs/design.md, "Client".
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

try:
    import numpy as np
    import numpy.typing as npt
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "client.batch needs numpy: install the simulation extra, pip install 'crowdmix[sim]'"
    ) from exc

from crowdmix.client.randomness import MAX_FIXED_DIGITS, probability_digits
from crowdmix.client.rappor import PrrRule, _secret_bytes, cohort_for_secret
from crowdmix.client.report import Report, make_report
from crowdmix.core.hashing import bloom_int
from crowdmix.core.params import Hashing, RapporParams

__all__ = [
    "AesCtrKeystream",
    "BatchEncoder",
    "ByteSource",
    "EncodedBatch",
    "UrandomBytes",
    "bernoulli_array",
    "default_byte_source",
]

U8 = npt.NDArray[np.uint8]
_CHUNK = 1 << 20
_ROWS_PER_CHUNK = 1 << 16


@runtime_checkable
class ByteSource(Protocol):
    """Uniform random bytes, as a writable uint8 array."""

    def random_array(self, n: int) -> U8: ...


class AesCtrKeystream:
    """AES-256-CTR keystream under a fresh ``os.urandom`` key: a fast CSPRNG (~3 GB/s)."""

    def __init__(self) -> None:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        self._cipher_parts = (Cipher, algorithms.AES, modes.CTR)
        self._zeros = bytes(_CHUNK)
        self._rekey()
        _KEYSTREAMS.add(self)

    def _rekey(self) -> None:
        cipher, aes, ctr = self._cipher_parts
        self._pid = os.getpid()
        self._encryptor = cipher(aes(os.urandom(32)), ctr(bytes(16))).encryptor()

    def random_array(self, n: int) -> U8:
        if os.getpid() != self._pid:  # a forked child must not replay the parent's stream
            self._rekey()
        # update_into wants 15 spare bytes after the output.
        buf = np.empty(n + 16, dtype=np.uint8)
        view = memoryview(buf)  # type: ignore[arg-type]
        for start in range(0, n, _CHUNK):
            size = min(_CHUNK, n - start)
            self._encryptor.update_into(self._zeros[:size], view[start : start + size + 15])
        return buf[:n]


# A forked child must never replay its parent's keystream: re-key at fork (the pid
# check in random_array stays as a second line of defence).
_KEYSTREAMS: weakref.WeakSet[AesCtrKeystream] = weakref.WeakSet()


def _rekey_after_fork() -> None:
    for stream in list(_KEYSTREAMS):
        stream._rekey()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_rekey_after_fork)


class UrandomBytes:
    """``os.urandom`` as a ByteSource (slower, ~400 MB/s, no extra dependency)."""

    def random_array(self, n: int) -> U8:
        return np.frombuffer(bytearray(os.urandom(n)), dtype=np.uint8)


def default_byte_source() -> ByteSource:
    """AES-CTR keyed from os.urandom if ``cryptography`` is installed, else os.urandom."""
    try:
        return AesCtrKeystream()
    except ImportError:
        return UrandomBytes()


def bernoulli_array(source: ByteSource, prob: float, shape: tuple[int, ...]) -> U8:
    """uint8 array whose every bit is an independent Bernoulli(``prob``), exactly.

    The digit rule of client.randomness with each bit of the array a lane: the
    fixed backwards formula for up to MAX_FIXED_DIGITS digits, else the
    forwards loop, which after a few rounds works only on the still-open bytes.
    """
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"probability must be in [0, 1], got {prob!r}")
    size = int(np.prod(shape))
    if prob == 1.0:
        return np.full(shape, 0xFF, dtype=np.uint8)
    digits = probability_digits(prob)
    if not digits:
        return np.zeros(shape, dtype=np.uint8)
    if len(digits) <= MAX_FIXED_DIGITS:
        # Words u_1..u_d; R = u_d, then R = u_j | R (b_j = 1) or u_j & R (b_j = 0).
        result = source.random_array(size)
        for digit in reversed(digits[:-1]):
            u = source.random_array(size)
            if digit:
                np.bitwise_or(result, u, out=result)
            else:
                np.bitwise_and(result, u, out=result)
        return result.reshape(shape)
    result = np.zeros(size, dtype=np.uint8)
    undecided = np.full(size, 0xFF, dtype=np.uint8)
    open_idx: npt.NDArray[np.intp] | None = None  # None: every byte still open
    for round_no, digit in enumerate(digits):
        if open_idx is None:
            u = source.random_array(size)
            if digit:
                result |= undecided & u
                undecided &= ~u
            else:
                undecided &= u
            if round_no >= 3:  # ~1/16 of the lanes left open: go sparse
                open_idx = np.flatnonzero(undecided)
        else:
            u = source.random_array(open_idx.size)
            und = undecided[open_idx]
            if digit:
                result[open_idx] |= und & u
                und &= ~u
            else:
                und &= u
            undecided[open_idx] = und
            open_idx = open_idx[und != 0]
        if open_idx is not None and open_idx.size == 0:
            break
    return result.reshape(shape)


@dataclass(frozen=True, slots=True, eq=False)  # arrays: no elementwise ==
class EncodedBatch:
    """Reports of one metric as columns: cohorts (uint32, n), bits (uint8, n × ceil(k/8))
    and report ids (uint8, n × 16: fresh from the byte source, as a device draws them;
    None: no ids)."""

    metric: str
    params_fingerprint: int
    cohorts: npt.NDArray[np.uint32]
    bits: U8
    report_ids: U8 | None = None

    def __len__(self) -> int:
        return int(self.cohorts.shape[0])

    @property
    def report_bytes(self) -> int:
        return int(self.bits.shape[1])

    def bits_bytes(self) -> bytes:
        """All reports' bits concatenated in order: ReportColumns.bits."""
        return np.ascontiguousarray(self.bits).tobytes()

    def report_ids_bytes(self) -> bytes:
        """All report ids concatenated in order (ReportColumns.report_ids); b"" without ids."""
        if self.report_ids is None:
            return b""
        return np.ascontiguousarray(self.report_ids).tobytes()

    def reports(self) -> list[Report]:
        """Per-report objects (for the per-report transport path)."""
        raw = self.bits_bytes()
        nb = self.report_bytes
        ids = self.report_ids_bytes() or bytes(16 * len(self))
        return [
            make_report(
                self.metric,
                int(c),
                raw[i * nb : (i + 1) * nb],
                self.params_fingerprint,
                ids[16 * i : 16 * i + 16],
            )
            for i, c in enumerate(self.cohorts.tolist())
        ]


class BatchEncoder:
    """Encodes many reports of one metric at once, numpy-vectorised (see the module doc)."""

    def __init__(
        self,
        params: RapporParams,
        *,
        metric: str,
        hashing: Hashing = "mmh3",
        source: ByteSource | None = None,
    ) -> None:
        if not isinstance(params, RapporParams):
            raise TypeError("params must be a RapporParams")
        params.check_hashing(hashing)
        if not isinstance(metric, str) or not metric:
            raise ValueError("metric must be a non-empty string")
        self.params = params
        self.metric = metric
        self.hashing: Hashing = hashing
        self.fingerprint = params.fingerprint(hashing)
        self._source = source if source is not None else default_byte_source()
        nb = params.report_bytes
        self._pad = np.full(nb, 0xFF, dtype=np.uint8)
        if params.k % 8:
            self._pad[-1] = (1 << (params.k % 8)) - 1

    @property
    def report_bytes(self) -> int:
        return self.params.report_bytes

    def _pack(self, value: int) -> bytes:
        return value.to_bytes(self.params.report_bytes, "little")

    # -- Bloom filters ------------------------------------------------------------

    def bloom_table(self, candidates: Sequence[str | bytes]) -> U8:
        """Bloom filters of every candidate in every cohort: (C, m, ceil(k/8)) uint8."""
        p, h = self.params, self.hashing
        raw = b"".join(self._pack(bloom_int(v, c, p, h)) for v in candidates for c in range(p.m))
        return np.frombuffer(raw, dtype=np.uint8).reshape(len(candidates), p.m, p.report_bytes)

    # -- PRR ----------------------------------------------------------------------

    def fresh_permanent_responses(self, blooms: U8) -> U8:
        """PRR with noise fresh from the keystream: for clients that report once."""
        b = self._check_bits(blooms)
        noise = bernoulli_array(self._source, self.params.f, b.shape)
        uniform = self._source.random_array(b.size).reshape(b.shape)
        # B where N = 0, U where N = 1: B ^ ((B ^ U) & N)
        np.bitwise_xor(uniform, b, out=uniform)
        np.bitwise_and(uniform, noise, out=uniform)
        np.bitwise_xor(uniform, b, out=uniform)
        uniform &= self._pad
        return uniform

    def permanent_responses(
        self,
        secrets: Sequence[bytes | str],
        values: Sequence[str | bytes],
        cohorts: npt.ArrayLike | None = None,
    ) -> tuple[npt.NDArray[np.uint32], U8]:
        """(cohorts, memoised PRRs) of client i = secrets[i] reporting values[i].

        Equal bit for bit to the per-report encoder's ``permanent_response``.
        Cohorts default to each secret's own (``cohort_for_secret``).
        """
        n = len(secrets)
        if len(values) != n:
            raise ValueError(f"{n} secrets but {len(values)} values")
        p = self.params
        if cohorts is None:
            coh = np.fromiter((cohort_for_secret(s, p.m) for s in secrets), np.uint32, n)
        else:
            coh = self._check_cohorts(cohorts, n)
        rule = PrrRule(p, self.hashing)
        blooms: dict[tuple[str | bytes, int], int] = {}
        bound: dict[bytes | str, Callable[[int], int]] = {}
        parts = []
        for s, v, c in zip(secrets, values, coh.tolist(), strict=True):
            prr_of = bound.get(s)
            if prr_of is None:
                prr_of = bound[s] = rule.keyed(_secret_bytes(s), self.metric)
            bloom = blooms.get((v, c))
            if bloom is None:
                bloom = blooms[(v, c)] = bloom_int(v, c, p, self.hashing)
            parts.append(self._pack(prr_of(bloom)))
        prr = np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(n, p.report_bytes)
        return coh, prr

    # -- IRR ----------------------------------------------------------------------

    def instantaneous_responses(self, prrs: U8) -> U8:
        """Fresh IRR of each PRR row: Bernoulli(q) on 1 bits, Bernoulli(p) on 0 bits."""
        prr = self._check_bits(prrs)
        pb = bernoulli_array(self._source, self.params.p, prr.shape)
        qb = bernoulli_array(self._source, self.params.q, prr.shape)
        # P ^ ((P ^ Q) & PRR), in place in qb
        np.bitwise_xor(qb, pb, out=qb)
        np.bitwise_and(qb, prr, out=qb)
        np.bitwise_xor(qb, pb, out=qb)
        qb &= self._pad
        return qb

    # -- whole reports ------------------------------------------------------------

    def encode_indices(
        self, table: U8, value_idx: npt.ArrayLike, cohorts: npt.ArrayLike
    ) -> EncodedBatch:
        """One report per client: client i holds candidate value_idx[i], in cohorts[i].

        ``table`` is ``bloom_table(candidates)``. PRR noise is fresh per report
        (see the module doc for when that is equivalent).
        """
        idx = np.asarray(value_idx, dtype=np.intp)
        coh = self._check_cohorts(cohorts, idx.shape[0])
        if table.ndim != 3 or table.shape[1:] != (self.params.m, self.report_bytes):
            raise ValueError(f"table must be bloom_table(...) output, got shape {table.shape}")
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= table.shape[0])):
            raise ValueError(f"value indexes must be in [0, {table.shape[0]})")
        flat = table.reshape(-1, self.report_bytes)
        rows = idx * self.params.m + coh
        bits = np.empty((idx.shape[0], self.report_bytes), dtype=np.uint8)
        # Cache-sized chunks: 1 MiB arrays stay in cache and need no fresh pages.
        for start in range(0, idx.shape[0], _ROWS_PER_CHUNK):
            end = start + _ROWS_PER_CHUNK
            blooms = np.take(flat, rows[start:end], axis=0)
            bits[start:end] = self.instantaneous_responses(self.fresh_permanent_responses(blooms))
        return EncodedBatch(self.metric, self.fingerprint, coh, bits, self._report_ids(len(coh)))

    def encode_clients(
        self,
        secrets: Sequence[bytes | str],
        values: Sequence[str | bytes],
        cohorts: npt.ArrayLike | None = None,
    ) -> EncodedBatch:
        """One report per (secret, value), PRR memoised exactly as on the device."""
        coh, prr = self.permanent_responses(secrets, values, cohorts)
        irr = self.instantaneous_responses(prr)
        return EncodedBatch(self.metric, self.fingerprint, coh, irr, self._report_ids(len(coh)))

    def _report_ids(self, n: int) -> U8:
        """n fresh report ids (n × 16 bytes) from the byte source (a CSPRNG by default)."""
        return self._source.random_array(16 * n).reshape(n, 16)

    # -- checks -------------------------------------------------------------------

    def _check_cohorts(self, cohorts: npt.ArrayLike, n: int) -> npt.NDArray[np.uint32]:
        coh = np.asarray(cohorts)
        if coh.ndim != 1 or coh.shape[0] != n:
            raise ValueError(f"need {n} cohorts, got shape {coh.shape}")
        if coh.size and (
            not np.issubdtype(coh.dtype, np.integer)
            or int(coh.min()) < 0
            or int(coh.max()) >= self.params.m
        ):
            raise ValueError(f"cohorts must be integers in [0, {self.params.m})")
        return coh.astype(np.uint32, copy=False)

    def _check_bits(self, bits: Any) -> U8:
        arr = np.asarray(bits)
        if arr.dtype != np.uint8 or arr.ndim != 2 or arr.shape[1] != self.report_bytes:
            raise ValueError(
                f"expected a uint8 array of shape (n, {self.report_bytes}), "
                f"got {arr.dtype} {arr.shape}"
            )
        return arr
