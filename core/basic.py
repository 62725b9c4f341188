"""Basic LDP mechanisms for small known domains (Wang, Blocki, Li, Jha, "Locally
Differentially Private Protocols for Frequency Estimation", USENIX Security 2017),
each ε-LDP for its parameter ε. Payloads are little-endian; every report has cohort 0:

- ``binary-rr``: keep the bit w.p. e^ε/(e^ε+1). Payload: 1 byte, bit 0 the answer.
- ``krr``: the true index w.p. e^ε/(e^ε+d-1), else one of the other d-1 uniformly.
  Payload: the index in ``index_bytes(d)`` bytes.
- ``oue``: one-hot, the true bit kept as 1 w.p. 1/2, every other set w.p. 1/(e^ε+1).
  Payload: d bits, bit i = bit i % 8 of byte i // 8.
- ``olh``: a fresh 2-universal H(x) = ((a·x + b) mod P) mod g, P = 2^31 − 1,
  g = round(e^ε)+1, perturbed by k-RR over g. Payload: a (4 bytes), b (4 bytes), y in
  ``index_bytes(g)`` bytes (1 <= a < P, 0 <= b < P).

Params and layouts are shared by the device's encoder (``crowdmix.client.basic``) and
the aggregator's decoder.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Literal, get_args

from crowdmix.core.errors import ParamsError

__all__ = [
    "MECHANISMS",
    "OLH_PRIME",
    "BasicParams",
    "Mechanism",
    "index_bytes",
    "olh_hash",
]

Mechanism = Literal["binary-rr", "krr", "oue", "olh"]
MECHANISMS: tuple[str, ...] = get_args(Mechanism)
OLH_PRIME = 2**31 - 1
MAX_DOMAIN = 1 << 24
MAX_EPSILON = 30.0
MAX_OLH_EPSILON = 20.0


def index_bytes(n: int) -> int:
    """Bytes for an index in [0, n): 1, 2 or 4."""
    if n <= 1 << 8:
        return 1
    if n <= 1 << 16:
        return 2
    return 4


def olh_hash(a: int, b: int, x: int, g: int) -> int:
    """OLH's 2-universal hash ((a·x + b) mod P) mod g, P = 2^31 - 1."""
    return ((a * x + b) % OLH_PRIME) % g


@dataclass(frozen=True, slots=True, kw_only=True)
class BasicParams:
    """A basic mechanism over the domain {0, ..., domain_size - 1}."""

    mechanism: Mechanism
    epsilon: float
    domain_size: int = 2

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ParamsError(
                f"mechanism must be one of {', '.join(MECHANISMS)}, got {self.mechanism!r}"
            )
        eps = self.epsilon
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps):
            raise ParamsError(f"epsilon must be a finite number, got {eps!r}")
        if not 0.0 < eps <= MAX_EPSILON:
            raise ParamsError(f"epsilon must be in (0, {MAX_EPSILON}], got {eps!r}")
        object.__setattr__(self, "epsilon", float(eps))
        d = self.domain_size
        if isinstance(d, bool) or not isinstance(d, int) or not 2 <= d <= MAX_DOMAIN:
            raise ParamsError(f"domain_size must be an integer in [2, {MAX_DOMAIN}], got {d!r}")
        if self.mechanism == "olh" and eps > MAX_OLH_EPSILON:
            # g = round(e^ε) + 1 buckets must fit the 4-byte y field (and a 31-bit hash).
            raise ParamsError(f"epsilon must be at most {MAX_OLH_EPSILON} for olh, got {eps!r}")
        if self.mechanism == "binary-rr" and d != 2:
            raise ParamsError(f"domain_size must be 2 for binary-rr, got {d}")

    # Probabilities of each mechanism (Wang et al. 2017, §4).
    @property
    def keep_probability(self) -> float:
        """binary-rr / krr: P(report the true value); olh: the same over g buckets."""
        e = math.exp(self.epsilon)
        n = self.olh_buckets if self.mechanism == "olh" else self.domain_size
        return e / (e + n - 1)

    @property
    def oue_q(self) -> float:
        """oue: P(bit set) for a bit that is not the true value's: 1/(e^ε+1)."""
        return 1.0 / (math.exp(self.epsilon) + 1.0)

    @property
    def olh_buckets(self) -> int:
        """olh: g = round(e^ε) + 1 (the variance-optimal integer near e^ε + 1)."""
        return max(2, round(math.exp(self.epsilon)) + 1)

    @property
    def report_bytes(self) -> int:
        if self.mechanism == "binary-rr":
            return 1
        if self.mechanism == "krr":
            return index_bytes(self.domain_size)
        if self.mechanism == "oue":
            return (self.domain_size + 7) // 8
        return 8 + index_bytes(self.olh_buckets)

    def fingerprint(self) -> int:
        """A stable 64-bit id of these params, carried by every report."""
        canon = f"basic/v1;mechanism={self.mechanism};epsilon={self.epsilon!r};d={self.domain_size}"
        return int.from_bytes(hashlib.blake2b(canon.encode(), digest_size=8).digest(), "little")
