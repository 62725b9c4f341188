"""Decode one discovery round: counts of s·g + y → every kept prefix's children.

A report (s, y) supports child c = prefix‖e exactly when h_s(c) = y; with e = hi·g + lo
and g prime, each report supports exactly one lo per (prefix, hi), so all K·E children
cost K·⌈E/g⌉ operations per distinct (s, y) cell and nothing loops over reports in Python.
Estimator (optimised local hashing; Wang, Blocki, Li, Jha, USENIX Security 2017, §4.4),
p = e^ε/(e^ε+g−1), N reports, support S_c::

    n̂_c = (S_c − N/g) / (p − 1/g),
    Var[n̂_c] ≈ N·(1/g)(1 − 1/g)/(p − 1/g)² + n_c(1 − p − 1/g)/(p − 1/g).

Hashes come from S seeds, not a 2-universal family, so collisions bias children by the
heaviest values; the ``correct_heaviest`` largest children of a first pass are taken out
and the rest re-estimated (docs/design.md, "Aggregator: decode").
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.discovery.hashing import bucket_base, inverse_mod, seed_constants
from crowdmix.core.discovery import PrefixRound, prefix_key

__all__ = ["PrefixEstimates", "child_symbols", "decode_prefix_round", "valid_children"]

FloatArray = npt.NDArray[np.float64]
# Elements of one (pseudo-prefix × cell) tile: keeps temporaries near 64 MB.
_TILE = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixEstimates:
    """Estimated reports of every child prefix: ``count[k, e]`` for parent k, extension e.

    ``valid[k, e]`` is False for children no value can have (a symbol after END,
    a character in the last position): their entries are NaN."""

    round: PrefixRound
    parents: npt.NDArray[np.uint8]
    count: FloatArray
    std_error: FloatArray
    valid: npt.NDArray[np.bool_]
    num_reports: int

    def top(self, k: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
        """(parent, extension) of the ``k`` largest valid estimates, largest first."""
        flat = np.where(self.valid, self.count, -np.inf).ravel()
        k = min(k, int(self.valid.sum()))
        idx = np.argpartition(-flat, k - 1)[:k] if k else np.empty(0, np.intp)
        idx = idx[np.argsort(-flat[idx], kind="stable")]
        return np.divmod(idx, self.count.shape[1])


def _digits(r: PrefixRound) -> npt.NDArray[np.uint8]:
    """Symbols of every extension e (E × Δ), most significant first."""
    span, a = r.stop - r.start, r.symbols.size
    e = np.arange(r.extensions, dtype=np.int64)
    powers = a ** np.arange(span - 1, -1, -1, dtype=np.int64)
    return ((e[:, None] // powers[None, :]) % a).astype(np.uint8)


def valid_children(r: PrefixRound, closed: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Which (parent, extension) pairs a value can produce: after END only END, and
    in the last position (index max_length) only END or OTHER; a parent already
    ``closed`` (ending in END) has only the all-END child."""
    sm = r.symbols
    d = _digits(r)
    end = d == sm.end
    ok = ~np.any(np.cumsum(end, axis=1).astype(bool) & ~end, axis=1)
    last = sm.length - 1
    if r.start <= last < r.stop:
        col = d[:, last - r.start]
        ok &= (col == sm.end) | (col == sm.other)
    all_end = np.all(end, axis=1)
    valid: npt.NDArray[np.bool_] = np.where(closed[:, None], all_end[None, :], ok[None, :])
    return valid


def child_symbols(r: PrefixRound, parents: npt.NDArray[np.uint8], k: int, e: int) -> bytes:
    """The symbols of child (k, e): parent k's prefix followed by e's digits."""
    span, a = r.stop - r.start, r.symbols.size
    digits = [(e // a ** (span - 1 - j)) % a for j in range(span)]
    return bytes(parents[k]) + bytes(digits)


def _supports(
    r: PrefixRound,
    keys: npt.NDArray[np.uint64],
    key_parent: npt.NDArray[np.intp],
    key_hi: npt.NDArray[np.int64],
    seeds: npt.NDArray[np.uint64],
    y: npt.NDArray[np.uint64],
    weight: FloatArray | None,
    num_parents: int,
) -> FloatArray:
    """Σ weight (1 per cell when None) over cells (s, y) supporting each child, (K, E).

    Work is split into tiles of whole parents (``key_parent`` is sorted), each
    counted with its own small ``np.bincount``; tiles run on a thread pool (numpy
    releases the GIL), one per core."""
    from concurrent.futures import ThreadPoolExecutor

    g, ext = r.buckets, r.extensions
    out = np.zeros((num_parents, ext), dtype=np.float64)
    if seeds.size == 0 or keys.size == 0:
        return out
    a, b, m = seed_constants(seeds, g)
    minv = inverse_mod(m, g).astype(np.int64)[None, :]
    yy = y.astype(np.int64)[None, :]
    w = None if weight is None else weight[None, :]
    a, b = a[None, :], b[None, :]
    # tiles: consecutive keys, cut at parent boundaries, ~_TILE elements each
    per_tile = max(1, _TILE // seeds.size)
    bounds = [0]
    starts = np.flatnonzero(np.r_[True, key_parent[1:] != key_parent[:-1]])
    for s0 in starts[1:].tolist():
        if s0 - bounds[-1] >= per_tile:
            bounds.append(s0)
    bounds.append(keys.size)

    def tile(j0: int, j1: int) -> None:
        p0, p1 = int(key_parent[j0]), int(key_parent[j1 - 1]) + 1
        base = bucket_base(a, b, keys[j0:j1, None], g).view(np.int64)
        d = yy - base
        d += g & (d >> 63)  # (y − H) mod g without a division: H, y < g
        lo = d * minv % g
        hi = key_hi[j0:j1, None]
        limit = np.minimum(ext - hi * g, g)  # children past E do not exist
        flat = (key_parent[j0:j1, None] - p0) * ext + hi * g + lo
        size = (p1 - p0) * ext
        flat = np.where(lo < limit, flat, size)
        if w is None:
            got = np.bincount(flat.ravel(), minlength=size + 1)
        else:
            got = np.bincount(
                flat.ravel(), weights=np.broadcast_to(w, flat.shape).ravel(), minlength=size + 1
            )
        out[p0:p1] += got[:size].reshape(p1 - p0, ext)

    pairs = list(itertools.pairwise(bounds))
    if len(pairs) == 1:
        tile(*pairs[0])
    else:
        # tiles touching one parent must not run at once: a parent never spans two
        # tiles (cuts are at parent boundaries), so every tile writes its own rows
        with ThreadPoolExecutor(max_workers=_workers()) as pool:
            list(pool.map(lambda p: tile(*p), pairs))
    return out


def _workers() -> int:
    import os

    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2))


def _pseudo_prefixes(
    r: PrefixRound, parents: npt.NDArray[np.uint8], closed: npt.NDArray[np.bool_]
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.intp], npt.NDArray[np.int64]]:
    """(key, parent, hi) for every (parent, hi) block holding a valid child."""
    g, ext = r.buckets, r.extensions
    his = math.ceil(ext / g)
    all_end = 0
    for _ in range(r.stop - r.start):
        all_end = all_end * r.symbols.size + r.symbols.end
    keys, owner, high = [], [], []
    for k in range(parents.shape[0]):
        prefix = bytes(parents[k])
        blocks = [all_end // g] if closed[k] else range(his)
        for hi in blocks:
            keys.append(prefix_key(r.start, r.stop, hi, prefix))
            owner.append(k)
            high.append(hi)
    return (
        np.array(keys, dtype=np.uint64),
        np.array(owner, dtype=np.intp),
        np.array(high, dtype=np.int64),
    )


def decode_prefix_round(
    r: PrefixRound,
    parents: npt.NDArray[np.uint8],
    counts: npt.ArrayLike,
    *,
    correct_heaviest: int = 32,
) -> PrefixEstimates:
    """Estimates of every child of ``parents`` (K × start symbols) from the round's
    counts (one int per index s·g + y). ValueError on a shape mismatch."""
    c = np.asarray(counts)
    if c.shape != (r.cells,):
        raise ValueError(f"counts must have {r.cells} entries (seeds x buckets), got {c.shape}")
    if np.any(c < 0):
        raise ValueError("counts must be non-negative")
    parents = np.asarray(parents, dtype=np.uint8)
    if parents.ndim != 2 or parents.shape[1] != r.start:
        raise ValueError(f"parents must be a (K, {r.start}) array of symbols, got {parents.shape}")
    closed = (
        np.any(parents == r.symbols.end, axis=1)
        if r.start
        else np.zeros(parents.shape[0], dtype=bool)
    )
    valid = valid_children(r, closed)
    g = r.buckets
    n = int(c.sum())
    nz = np.flatnonzero(c)
    cells = np.repeat(nz, c[nz])  # one entry per report: counts are mostly 0 or 1
    seeds = (cells // g).astype(np.uint64)
    y = (cells % g).astype(np.uint64)
    keys, owner, high = _pseudo_prefixes(r, parents, closed)
    k_parents = parents.shape[0]
    support = _supports(r, keys, owner, high, seeds, y, None, k_parents)
    p = r.keep_probability
    q1 = 1.0 / g
    est = (support - n * q1) / (p - q1)
    heavy = min(correct_heaviest, int(valid.sum()))
    # the correction costs heavy·S cells on top of the n reports: worth it only when
    # the reports are many (the seed set's bias grows with N, the noise with sqrt(N))
    if heavy and n and heavy * r.seeds <= n:
        est = _without_heaviest(r, parents, support, est, valid, n, heavy, keys, owner, high)
    var = n * q1 * (1 - q1) / (p - q1) ** 2 + np.maximum(est, 0.0) * (1 - p - q1) / (p - q1)
    est = np.where(valid, est, np.nan)
    return PrefixEstimates(
        round=r,
        parents=parents,
        count=est,
        std_error=np.where(valid, np.sqrt(var), np.nan),
        valid=valid,
        num_reports=n,
    )


def _without_heaviest(
    r: PrefixRound,
    parents: npt.NDArray[np.uint8],
    support: FloatArray,
    est: FloatArray,
    valid: npt.NDArray[np.bool_],
    n: int,
    heavy: int,
    keys: npt.NDArray[np.uint64],
    owner: npt.NDArray[np.intp],
    high: npt.NDArray[np.int64],
) -> FloatArray:
    """Re-estimate with the heaviest children's expected peaks removed (module docstring)."""
    g, ext, s_count = r.buckets, r.extensions, r.seeds
    flat = np.where(valid, est, -np.inf).ravel()
    top = np.argpartition(-flat, heavy - 1)[:heavy]
    top = top[flat[top] > 0]
    if top.size == 0:
        return est
    hk, he = np.divmod(top, ext)
    hi, lo = np.divmod(he, g)
    # each heavy child's key: the row of (owner, high) matching its block
    lookup = {(int(o), int(h)): int(key) for key, o, h in zip(keys, owner, high, strict=True)}
    hkeys = np.array([lookup[(int(k), int(h))] for k, h in zip(hk, hi, strict=True)], np.uint64)
    p = r.keep_probability
    q_other = (1.0 - p) / (g - 1)
    s_all = np.arange(s_count, dtype=np.uint64)
    a, b, m = seed_constants(s_all, g)
    base = bucket_base(a[None, :], b[None, :], hkeys[:, None], g)
    cell_y = (base + m[None, :] * lo.astype(np.uint64)[:, None]) % np.uint64(g)
    # (a heavy child's own block is among the keys: it is a kept parent's child)
    peak = (p - q_other) * flat[top] / s_count
    seeds = np.broadcast_to(s_all[None, :], cell_y.shape).ravel()
    weights = np.broadcast_to(-peak[:, None], cell_y.shape).ravel()
    removed = _supports(r, keys, owner, high, seeds, cell_y.ravel(), weights, parents.shape[0])
    adjusted = support + removed
    mass = float(flat[top].sum())
    out = ((adjusted - n * q_other) / (p - q_other) - (n - mass) / g) / (1.0 - 1.0 / g)
    own = (adjusted.ravel()[top] + (p - q_other) * flat[top] - n * q_other) / (p - q_other)
    out.ravel()[top] = own - (n - mass) / g
    return out
