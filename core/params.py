"""RAPPOR parameters: a frozen, validated value object with a stable fingerprint.

Notation follows Erlingsson, Pihur, Korolova, "RAPPOR", CCS 2014:

- ``k`` Bloom filter bits, ``h`` hash functions, ``m`` cohorts;
- ``f`` permanent randomized response: each bit is replaced by a fair coin with
  probability ``f`` (so it reads 1 with probability f/2 and 0 with f/2);
- ``p`` = P(report bit 1 | PRR bit 0), ``q`` = P(report bit 1 | PRR bit 1), the
  instantaneous randomized response.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Literal, get_args

from crowdmix.core.errors import ParamsError

__all__ = ["HASHINGS", "Hashing", "RapporParams"]

Hashing = Literal["mmh3", "rappor-md5"]
HASHINGS: tuple[str, ...] = get_args(Hashing)

MAX_K = 65536
MAX_COHORTS = 2**32
# mmh3 gives a 128-bit digest: four 32-bit hashes.
MAX_H_MMH3 = 4
# google/rappor's client takes one MD5 byte per hash (so k <= 256) and packs
# the Bloom filter into a 4-byte integer for its HMAC-SHA256 PRR (so k <= 32).
MAX_H_MD5 = 16
MAX_K_MD5 = 32


def _check_probability(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParamsError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ParamsError(f"{name} must be a probability in [0, 1], got {value!r}")


def _check_int(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParamsError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ParamsError(f"{name} must be between {low} and {high}, got {value}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RapporParams:
    """RAPPOR encoding parameters (defaults: google/rappor's demo settings)."""

    k: int = 16
    h: int = 2
    m: int = 64
    f: float = 0.5
    p: float = 0.5
    q: float = 0.75

    def __post_init__(self) -> None:
        _check_int("k", self.k, 1, MAX_K)
        _check_int("h", self.h, 1, MAX_H_MD5)
        _check_int("m", self.m, 1, MAX_COHORTS)
        for name in ("f", "p", "q"):
            _check_probability(name, getattr(self, name))
        # Coerce ints (f=0) to float so equal params compare and hash equal.
        for name in ("f", "p", "q"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.h > self.k:
            raise ParamsError(f"h must not exceed k, got h={self.h}, k={self.k}")
        if self.f >= 1.0:
            raise ParamsError(f"f must be below 1 (f=1 erases every bit), got f={self.f}")
        if not self.p < self.q:
            raise ParamsError(
                f"p must be below q (otherwise reports carry no signal), got p={self.p}, q={self.q}"
            )

    @property
    def report_bytes(self) -> int:
        """Bytes of one packed report: ceil(k/8)."""
        return (self.k + 7) // 8

    def check_hashing(self, hashing: str) -> None:
        """Raise ParamsError unless these params can be used with ``hashing``."""
        if hashing not in HASHINGS:
            raise ParamsError(f"hashing must be one of {', '.join(HASHINGS)}, got {hashing!r}")
        if hashing == "mmh3" and self.h > MAX_H_MMH3:
            raise ParamsError(f"h must be at most {MAX_H_MMH3} with mmh3 hashing, got {self.h}")
        if hashing == "rappor-md5" and self.k > MAX_K_MD5:
            raise ParamsError(
                f"k must be at most {MAX_K_MD5} with rappor-md5 hashing "
                f"(google/rappor's PRR packs the Bloom filter in 4 bytes), got {self.k}"
            )

    def fingerprint(self, hashing: Hashing = "mmh3") -> int:
        """A stable 64-bit id of (params, hashing) carried by every report.

        Reports encoded under other params are rejected by the shuffler rather
        than mis-decoded. Floats enter by ``repr``, which round-trips exactly.
        """
        self.check_hashing(hashing)
        canon = (
            f"rappor/v1;k={self.k};h={self.h};m={self.m};"
            f"f={self.f!r};p={self.p!r};q={self.q!r};hashing={hashing}"
        )
        digest = hashlib.blake2b(canon.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")
