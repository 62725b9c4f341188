"""Decode an estimation round: k-RR counts over C candidates and "none of these".

k-ary randomized response over d = C + 1 outputs (Wang, Blocki, Li, Jha, USENIX
Security 2017, §4.1), p = e^ε/(e^ε + C), q = 1/(e^ε + C), N reports:

    n̂_i = (c_i − N·q) / (p − q),
    Var[n̂_i] = N·q(1 − q)/(p − q)² + n_i(1 − p − q)/(p − q).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from crowdmix.core.discovery import ValueRound

__all__ = ["ValueEstimates", "decode_value_round"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class ValueEstimates:
    """Estimated reports of each candidate (``count[i]``) and of "none" (``none``)."""

    round: ValueRound
    count: FloatArray
    std_error: FloatArray
    none: float
    num_reports: int


def decode_value_round(r: ValueRound, counts: npt.ArrayLike) -> ValueEstimates:
    """Unbiased k-RR estimates; ValueError on a shape mismatch or a negative count."""
    c = np.asarray(counts)
    if c.shape != (r.cells,):
        raise ValueError(f"counts must have {r.cells} entries (candidates + none), got {c.shape}")
    if np.any(c < 0):
        raise ValueError("counts must be non-negative")
    n = int(c.sum())
    p = r.keep_probability
    q = (1.0 - p) / (r.cells - 1)
    est = (c.astype(np.float64) - n * q) / (p - q)
    var = n * q * (1 - q) / (p - q) ** 2 + np.maximum(est, 0.0) * (1 - p - q) / (p - q)
    return ValueEstimates(
        round=r,
        count=est[:-1],
        std_error=np.sqrt(var[:-1]),
        none=float(est[-1]),
        num_reports=n,
    )
