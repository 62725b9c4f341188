"""Bloom filter hashing: the one definition that encoders and decoders share.

``mmh3`` (the default): ``d = mmh3.hash128(value, seed=cohort)`` as an unsigned
128-bit integer; hash ``i`` sets bit ``((d >> 32*i) & 0xFFFFFFFF) % k``.

``rappor-md5``: google/rappor's Python client, bit for bit: MD5 of the 4-byte
big-endian cohort followed by the value; hash ``i`` sets bit ``digest[i] % k``.
"""

from __future__ import annotations

import hashlib

import mmh3

from crowdmix.core.params import Hashing, RapporParams

__all__ = ["bloom_bits", "bloom_int", "value_bytes"]


def value_bytes(value: str | bytes) -> bytes:
    """Values are hashed as bytes; ``str`` values as UTF-8."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"a reported value must be str or bytes, got {type(value).__name__}")


def bloom_int(value: str | bytes, cohort: int, params: RapporParams, hashing: Hashing) -> int:
    """The Bloom filter as an int: bit i of the result is Bloom bit i."""
    data = value_bytes(value)
    k = params.k
    bloom = 0
    if hashing == "mmh3":
        d = mmh3.hash128(data, seed=cohort, signed=False)
        for i in range(params.h):
            bloom |= 1 << (((d >> (32 * i)) & 0xFFFFFFFF) % k)
    elif hashing == "rappor-md5":
        digest = hashlib.md5(cohort.to_bytes(4, "big") + data, usedforsecurity=False).digest()
        for i in range(params.h):
            bloom |= 1 << (digest[i] % k)
    else:
        params.check_hashing(hashing)
    return bloom


def bloom_bits(
    value: str | bytes, cohort: int, params: RapporParams, hashing: Hashing = "mmh3"
) -> list[int]:
    """Set Bloom bit positions for ``value`` in ``cohort``, ascending."""
    params.check_hashing(hashing)
    if not 0 <= cohort < params.m:
        raise ValueError(f"cohort must be in [0, {params.m}), got {cohort}")
    b = bloom_int(value, cohort, params, hashing)
    return [i for i in range(params.k) if (b >> i) & 1]
