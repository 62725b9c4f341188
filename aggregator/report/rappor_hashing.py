"""Bloom bits as google/rappor's clients set them, to build a map from candidate values.

Both hash d = MD5(cohort as 4 bytes big-endian ‖ value as UTF-8) and set h bits:

- ``rappor-md5``, the Python client (``client/python/rappor.py`` ``get_bloom_bits``)
  and the C++ client up to k = 256: hash i sets bit d[i] mod k (h ≤ 16, k ≤ 256).
- ``rappor-java``, the Java (Android) client (``Encoder.encodeString``): two digest
  bytes per hash, the first one high, ``(digest[i*2] & 0xFF) * 256 + (digest[i*2+1]
  & 0xFF)``: hash i sets bit (256·d[2i] + d[2i+1]) mod k (h ≤ 8, k ≤ 4096, its
  ``MAX_BITS``). Its own tests' vectors (``EncoderTest.testEncoderEncodeString_identity``)
  hold: "Whizbang" in cohort 0 with k = 12, h = 2 sets bits 2 and 7.

A report decodes correctly only against a map made with its client's hashing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np
import scipy.sparse as sp

from crowdmix.core.params import RapporParams

__all__ = [
    "CLIENT_HASHINGS",
    "ClientHashing",
    "check_client_hashing",
    "client_bloom_bits",
    "client_design",
]

ClientHashing = Literal["rappor-md5", "rappor-java"]
CLIENT_HASHINGS: tuple[str, ...] = get_args(ClientHashing)
#: (largest h, largest k) each client allows.
_LIMITS = {"rappor-md5": (16, 256), "rappor-java": (8, 4096)}


def check_client_hashing(params: RapporParams, hashing: str) -> None:
    """Raise ValueError unless a map for ``params`` can be built with ``hashing``."""
    if hashing not in _LIMITS:
        raise ValueError(f"hashing must be one of {', '.join(CLIENT_HASHINGS)}, got {hashing!r}")
    max_h, max_k = _LIMITS[hashing]
    if params.h > max_h or params.k > max_k:
        raise ValueError(
            f"{hashing} hashing allows h <= {max_h} and k <= {max_k}, got h={params.h}, "
            f"k={params.k}"
        )


def client_bloom_bits(
    value: str | bytes, cohort: int, params: RapporParams, hashing: ClientHashing
) -> list[int]:
    """The h bit positions the client sets for ``value`` in ``cohort`` (repeats kept)."""
    check_client_hashing(params, hashing)
    if not 0 <= cohort < params.m:
        raise ValueError(f"cohort must be in [0, {params.m}), got {cohort}")
    data = value.encode("utf-8") if isinstance(value, str) else value
    d = hashlib.md5(cohort.to_bytes(4, "big") + data, usedforsecurity=False).digest()
    if hashing == "rappor-md5":
        return [d[i] % params.k for i in range(params.h)]
    return [(d[2 * i] * 256 + d[2 * i + 1]) % params.k for i in range(params.h)]


def client_design(
    candidates: Sequence[str], params: RapporParams, hashing: ClientHashing
) -> sp.csc_matrix:
    """The (m·k × C) 0/1 design matrix: row cohort·k + bit is 1 where the client sets it."""
    check_client_hashing(params, hashing)
    rows: list[int] = []
    cols: list[int] = []
    for col, value in enumerate(candidates):
        for cohort in range(params.m):
            bits = set(client_bloom_bits(value, cohort, params, hashing))
            rows.extend(cohort * params.k + b for b in bits)
            cols.extend([col] * len(bits))
    return sp.csc_matrix(
        (np.ones(len(rows)), (np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64))),
        shape=(params.m * params.k, len(candidates)),
    )
