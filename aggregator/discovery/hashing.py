"""The device's prefix hash (``crowdmix.client.discovery``) over numpy arrays.

Same arithmetic as the pure-Python reference, on uint64 lanes (multiplication
wraps mod 2^64 as the reference's ``& MASK`` does); the tests compare the two on
random inputs. ``inverse_mod`` gives m_s^{-1} mod g (g prime, Fermat: m^(g−2)).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from crowdmix.core.discovery import SEED_SALTS

__all__ = ["bucket_base", "inverse_mod", "mix64", "seed_constants"]

U64 = npt.NDArray[np.uint64]
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)


def mix64(z: U64) -> U64:
    """SplitMix64's finaliser, element-wise."""
    z = z ^ (z >> np.uint64(30))
    z = z * _C1
    z = z ^ (z >> np.uint64(27))
    z = z * _C2
    return z ^ (z >> np.uint64(31))


def seed_constants(seeds: npt.ArrayLike, buckets: int) -> tuple[U64, U64, U64]:
    """(a_s, b_s, m_s) for each seed (``crowdmix.client.discovery.seed_constants``)."""
    s = np.asarray(seeds, dtype=np.uint64)
    with np.errstate(over="ignore"):
        a = mix64(s ^ np.uint64(SEED_SALTS[0])) | np.uint64(1)
        b = mix64(s ^ np.uint64(SEED_SALTS[1]))
        m = np.uint64(1) + mix64(s ^ np.uint64(SEED_SALTS[2])) % np.uint64(buckets - 1)
    return a, b, m


def bucket_base(a: U64, b: U64, keys: U64, buckets: int) -> U64:
    """H_s(key) = ⌊((a_s·key + b_s) mod 2^64 >> 32)·g / 2^32⌋, broadcasting."""
    with np.errstate(over="ignore"):
        return ((a * keys + b) >> np.uint64(32)) * np.uint64(buckets) >> np.uint64(32)


def inverse_mod(m: U64, prime: int) -> U64:
    """m^{-1} mod ``prime`` for m in [1, prime), prime < 2^32 (square and multiply)."""
    p = np.uint64(prime)
    result = np.ones_like(m)
    base = m % p
    e = prime - 2
    while e:
        if e & 1:
            result = result * base % p
        base = base * base % p
        e >>= 1
    return result
