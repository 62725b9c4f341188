"""Open a batch of sealed reports into numpy columns, one HPKE decapsulation each.

A report that does not open is dropped and counted by reason, never failing the batch.
Reasons, in the order checked: ``unknown_key`` (no key with its id, or another suite),
``expired_key`` (past its grace period), ``bad_length`` (not the metric's fixed length for
the suite), ``not_authentic`` (HPKE open failed: tampered, or sealed under another metric,
key id, window or protocol version, which ``info`` binds and AEAD cannot tell apart).
Reports that open with another params fingerprint are kept with ``fingerprints_ok``
false, so ingest counts them as a params mismatch. ``Opener(workers=N)`` spreads large
batches over N ``spawn``-ed processes (opening costs ~60 µs per report with X25519;
forking a process with gRPC threads is unsafe); the key set is shipped once per pool and
``Opener.update_keys`` restarts it after a rotation.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from cryptography.exceptions import InvalidTag

from crowdmix.aggregator.sealing.keys import KeySet
from crowdmix.core.hpke import hpke_suite
from crowdmix.core.sealed import (
    REPORT_ID_BYTES,
    SUITES,
    plaintext_length,
    report_info,
    sealed_length,
)

__all__ = ["DROP_REASONS", "OpenedBatch", "Opener", "open_batch"]

DROP_REASONS: Final = ("unknown_key", "expired_key", "bad_length", "not_authentic")
_OK: Final = 0
_STATUS = {reason: i + 1 for i, reason in enumerate(DROP_REASONS)}
# Below this many reports a pool's round trip costs more than it saves.
_MIN_CHUNK: Final = 256


@dataclass(frozen=True, slots=True, eq=False)
class OpenedBatch:
    """The reports that opened, as columns (row i of each is one report)."""

    bits: np.ndarray  # (n, report_bytes) uint8
    cohorts: np.ndarray  # (n,) uint32
    fingerprints_ok: np.ndarray  # (n,) bool: params fingerprint equals the metric's
    report_ids: np.ndarray  # (n, 16) uint8
    index: np.ndarray  # (n,) int64: position of each opened report in the input
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> count (non-zero only)

    @property
    def opened(self) -> int:
        return int(self.cohorts.shape[0])


class _OpenState:
    """Per-process: HPKE suites, private key objects and per-key expected lengths."""

    def __init__(self, keys: KeySet) -> None:
        self.keys = keys
        self.suites = {name: hpke_suite(s) for name, s in SUITES.items()}
        self.private = {k.key_id: k.hpke_private_key() for k in keys.keys if k.private_key}

    def open_chunk(
        self,
        metric: str,
        window: int,
        report_bytes: int,
        now: float,
        key_ids: Sequence[int],
        sealed: Sequence[bytes],
    ) -> tuple[bytes, bytes]:
        """(concatenated plaintexts of the opened reports, one status byte per report)."""
        plen = plaintext_length(report_bytes)
        status = bytearray(len(sealed))
        out = bytearray()
        # per key id seen: (decrypt, private key, info, expected length) or a status code
        plan: dict[int, Any] = {}
        for i, (kid, ct) in enumerate(zip(key_ids, sealed, strict=True)):
            entry = plan.get(kid)
            if entry is None:
                entry = plan[kid] = self._plan(metric, window, report_bytes, now, int(kid))
            if isinstance(entry, int):
                status[i] = entry
                continue
            decrypt, sk, info, length = entry
            if len(ct) != length:
                status[i] = _STATUS["bad_length"]
                continue
            try:
                pt = decrypt(ct, sk, info=info)
            except InvalidTag:
                status[i] = _STATUS["not_authentic"]
                continue
            if len(pt) != plen:  # impossible for a well-formed length; kept as a guard
                status[i] = _STATUS["bad_length"]
                continue
            out += pt
        return bytes(out), bytes(status)

    def _plan(self, metric: str, window: int, report_bytes: int, now: float, kid: int) -> Any:
        key = self.keys.get(kid)
        if key is None:
            return _STATUS["unknown_key"]
        if not key.opens_at(now) or kid not in self.private:
            return _STATUS["expired_key"]
        return (
            self.suites[key.suite].decrypt,
            self.private[kid],
            report_info(metric, kid, window),
            sealed_length(report_bytes, key.suite),
        )


def _columns(plaintexts: bytes, status: bytes, report_bytes: int, fingerprint: int) -> OpenedBatch:
    plen = plaintext_length(report_bytes)
    st = np.frombuffer(status, dtype=np.uint8)
    rows = np.frombuffer(plaintexts, dtype=np.uint8).reshape(-1, plen)
    fp = rows[:, report_bytes + 4 : report_bytes + 12].copy().view("<u8").reshape(-1)
    counts = np.bincount(st, minlength=len(DROP_REASONS) + 1)
    return OpenedBatch(
        bits=np.ascontiguousarray(rows[:, :report_bytes]),
        cohorts=rows[:, report_bytes : report_bytes + 4].copy().view("<u4").reshape(-1),
        fingerprints_ok=fp == np.uint64(fingerprint),
        report_ids=np.ascontiguousarray(rows[:, plen - REPORT_ID_BYTES :]),
        index=np.flatnonzero(st == _OK).astype(np.int64),
        dropped={r: int(counts[c]) for r, c in _STATUS.items() if counts[c]},
    )


def open_batch(
    keys: KeySet,
    *,
    metric: str,
    window: int,
    report_bytes: int,
    fingerprint: int,
    key_ids: Sequence[int] | np.ndarray,
    sealed: Sequence[bytes],
    now: float | None = None,
) -> OpenedBatch:
    """Open every report in this process (see ``Opener`` for a pool)."""
    return Opener(keys).open(
        metric=metric,
        window=window,
        report_bytes=report_bytes,
        fingerprint=fingerprint,
        key_ids=key_ids,
        sealed=sealed,
        now=now,
    )


# -- worker process side ---------------------------------------------------------
_worker_state: _OpenState | None = None


def _init_worker(keyset_json: str) -> None:
    global _worker_state
    _worker_state = _OpenState(KeySet.from_json(keyset_json, source="worker key set"))


def _worker_open(
    metric: str,
    window: int,
    report_bytes: int,
    now: float,
    key_ids: list[int],
    sealed: list[bytes],
) -> tuple[bytes, bytes]:
    if _worker_state is None:
        raise RuntimeError("opening worker started without its key set")
    return _worker_state.open_chunk(metric, window, report_bytes, now, key_ids, sealed)


class Opener:
    """Opens batches with ``keys``; ``workers=0`` in this process, else a process pool.

    Use as a context manager (or call ``close``) when ``workers > 0``.
    """

    def __init__(self, keys: KeySet, *, workers: int = 0) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be an integer >= 0, got {workers!r}")
        self.workers = workers
        self._pool: cf.ProcessPoolExecutor | None = None
        self.update_keys(keys)

    def update_keys(self, keys: KeySet) -> None:
        """Use another key set (after a rotation); restarts the pool if there is one."""
        self._local = _OpenState(keys)
        self.close()
        if self.workers:
            self._pool = cf.ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(keys.to_json(),),
            )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Opener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(
        self,
        *,
        metric: str,
        window: int,
        report_bytes: int,
        fingerprint: int,
        key_ids: Sequence[int] | np.ndarray,
        sealed: Sequence[bytes],
        now: float | None = None,
    ) -> OpenedBatch:
        """Open one batch of one metric and collection window; ``now`` (unix seconds)
        decides expiry."""
        if len(key_ids) != len(sealed):
            raise ValueError(f"{len(key_ids)} key ids for {len(sealed)} sealed reports")
        report_info(metric, 0, window)  # validates the metric name and window before any work
        plaintext_length(report_bytes)
        when = time.time() if now is None else float(now)
        ids = [int(k) for k in key_ids]
        n = len(ids)
        if self._pool is None or n < 2 * _MIN_CHUNK:
            pts, st = self._local.open_chunk(metric, window, report_bytes, when, ids, sealed)
            return _columns(pts, st, report_bytes, fingerprint)
        size = max(_MIN_CHUNK, -(-n // (4 * self.workers)))
        futures = [
            self._pool.submit(
                _worker_open,
                metric,
                window,
                report_bytes,
                when,
                ids[a : a + size],
                list(sealed[a : a + size]),
            )
            for a in range(0, n, size)
        ]
        parts = [f.result() for f in futures]
        return _columns(
            b"".join(p for p, _ in parts), b"".join(s for _, s in parts), report_bytes, fingerprint
        )
