"""The randomness the shuffler's privacy rests on: batch permutation and random drop.

Both draw from ``random_bytes`` (default ``os.urandom``, the OS CSPRNG). It is a
parameter only so tests can inject a seeded source; production code never
passes one, and a test checks that the default is ``os.urandom``.

- ``secure_permutation(n)``: sort n independent uniform 64-bit keys. With
  distinct keys every order is equally likely, so the permutation is uniform;
  keys collide with probability at most n²/2^65 (< 3e-10 for n = 10^5), and
  only a collision lets the sort's tie-breaking (a function of positions) decide
  an order, so the total variation distance from uniform is at most that. (Same idea as "random sort
  keys", Knuth TAOCP vol. 2 §3.4.2, Algorithm P's alternative.)
- ``keep_mask(n, d)``: each report kept independently with probability
  1 - t/2^32, t = round(d·2^32), i.e. dropped with d to within 2^-33.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = ["RandomBytes", "keep_mask", "secure_permutation"]

RandomBytes = Callable[[int], bytes]


def secure_permutation(n: int, random_bytes: RandomBytes = os.urandom) -> npt.NDArray[np.intp]:
    """A uniformly random permutation of range(n) from a CSPRNG (argsort of random keys)."""
    if n <= 1:
        return np.arange(n, dtype=np.intp)
    keys = np.frombuffer(random_bytes(8 * n), dtype=np.uint64)
    # quicksort (introsort) is 5× faster than the stable sort on random 64-bit keys;
    # only tied keys (probability ≤ n²/2^65) could be ordered by position.
    return np.argsort(keys, kind="quicksort").astype(np.intp, copy=False)


def keep_mask(
    n: int, drop_probability: float, random_bytes: RandomBytes = os.urandom
) -> npt.NDArray[np.bool_]:
    """Which of n reports survive an independent drop with probability ``drop_probability``."""
    if drop_probability <= 0.0:
        return np.ones(n, dtype=np.bool_)
    threshold = round(drop_probability * 2.0**32)
    draws = np.frombuffer(random_bytes(4 * n), dtype=np.uint32)
    return np.asarray(draws >= threshold)
