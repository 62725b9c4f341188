"""Simulated rounds: the counts a group of devices would produce, without encoding
one report at a time (numpy ``Generator``; benchmarks and tests only, never devices).

Each device holds one of ``values`` (``holders[i]`` indexes it). A prefix round
draws each device's seed, computes its bucket exactly as the device does
(``crowdmix.client.discovery``) and applies k-RR; a value round applies k-RR over
the candidates and "none". The result is the aggregator's count vector.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.discovery.hashing import bucket_base, seed_constants
from crowdmix.core.discovery import PrefixRound, ValueRound, prefix_key

__all__ = ["simulate_prefix_counts", "simulate_value_counts"]

I64 = npt.NDArray[np.int64]


def _randomize(
    true: npt.NDArray[np.int64], n_out: int, keep: float, rng: np.random.Generator
) -> I64:
    """k-RR over [0, n_out): keep w.p. ``keep``, else a uniform other output."""
    other = rng.integers(0, n_out - 1, size=true.size)
    other += other >= true
    return np.where(rng.random(true.size) < keep, true, other)


def simulate_prefix_counts(
    r: PrefixRound,
    symbols: list[bytes],
    holders: npt.ArrayLike,
    rng: np.random.Generator,
) -> I64:
    """Counts over s·g + y of the devices holding ``symbols[holders[i]]``."""
    h_idx = np.asarray(holders, dtype=np.int64)
    used, inverse = np.unique(h_idx, return_inverse=True)
    keys = np.empty(used.size, dtype=np.uint64)
    los = np.empty(used.size, dtype=np.uint64)
    for j, v in enumerate(used.tolist()):
        prefix, hi, lo = r.split(symbols[v])
        keys[j] = prefix_key(r.start, r.stop, hi, prefix)
        los[j] = lo
    g = r.buckets
    seeds = rng.integers(0, r.seeds, size=h_idx.size).astype(np.uint64)
    a, b, m = seed_constants(seeds, g)
    h = (bucket_base(a, b, keys[inverse], g) + m * los[inverse]) % np.uint64(g)
    y = _randomize(h.astype(np.int64), g, r.keep_probability, rng)
    return np.bincount(seeds.astype(np.int64) * g + y, minlength=r.cells).astype(np.int64)


def simulate_value_counts(
    r: ValueRound,
    symbols: list[bytes],
    holders: npt.ArrayLike,
    rng: np.random.Generator,
) -> I64:
    """Counts over the candidates and "none" of the devices holding ``symbols[holders[i]]``."""
    h_idx = np.asarray(holders, dtype=np.int64)
    position = {r.symbols.symbols(v): i for i, v in enumerate(r.candidates)}
    none = r.cells - 1
    of_value = np.array([position.get(s, none) for s in symbols], dtype=np.int64)
    out = _randomize(of_value[h_idx], r.cells, r.keep_probability, rng)
    return np.bincount(out, minlength=r.cells).astype(np.int64)
