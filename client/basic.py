"""Basic LDP mechanisms for small known domains (Wang, Blocki, Li, Jha,
"Locally Differentially Private Protocols for Frequency Estimation", USENIX
Security 2017), each ε-LDP for its parameter ε:

- ``binary-rr``: binary randomized response; keep the bit w.p. e^ε/(e^ε+1).
- ``krr``: k-ary randomized response (direct encoding); report the true index
  w.p. p = e^ε/(e^ε+d-1), otherwise one of the other d-1 uniformly.
- ``oue``: optimised unary encoding; one-hot vector, the true bit kept as 1 w.p.
  1/2, every other bit set w.p. 1/(e^ε+1).
- ``olh``: optimised local hashing; a fresh 2-universal hash H into g = round(e^ε)+1
  buckets, H(x) perturbed by k-RR over the g buckets.

Payload layouts (what the aggregator decodes; little-endian throughout):

- binary-rr: 1 byte, bit 0 is the answer.
- krr: the reported index in ``index_bytes(d)`` bytes.
- oue: d bits, bit i = bit i % 8 of byte i // 8.
- olh: a (4 bytes), b (4 bytes), then y in ``index_bytes(g)`` bytes, with
  H(x) = ((a·x + b) mod P) mod g, P = 2^31 - 1, 1 <= a < P, 0 <= b < P.

Every report of a basic mechanism has cohort 0.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar, get_args

from crowdmix.client.errors import ParamsError
from crowdmix.client.randomness import BitSource, bernoulli_bits, shared_secure_bits, uniform_below
from crowdmix.client.report import Report, new_report_id, pack_bits

__all__ = [
    "MECHANISMS",
    "OLH_PRIME",
    "BasicEncoder",
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


def checked_domain(
    domain: tuple[str, ...] | list[str] | None, domain_size: int
) -> tuple[tuple[str, ...] | None, dict[str, int] | None]:
    """A metric's value list (or None: encode indexes) and its value → index map;
    ParamsError unless it has exactly ``domain_size`` distinct values."""
    if domain is None:
        return None, None
    if len(domain) != domain_size:
        raise ParamsError(f"domain has {len(domain)} values but domain_size is {domain_size}")
    if len(set(domain)) != len(domain):
        raise ParamsError("domain values must be distinct")
    return tuple(domain), {v: i for i, v in enumerate(domain)}


def domain_index(value: str | int, index: dict[str, int] | None, domain_size: int) -> int:
    """The domain index of ``value``: an int is taken as the index itself (checked), a
    string is looked up in the metric's domain; ValueError naming the problem."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < domain_size:
            raise ValueError(f"index must be in [0, {domain_size}), got {value}")
        return value
    if index is None:
        raise ValueError("this encoder has no domain: pass an index")
    try:
        return index[str(value)]
    except KeyError:
        raise ValueError(f"value {value!r} is not in the metric's domain") from None


class _DomainParams(Protocol):
    @property
    def domain_size(self) -> int: ...

    def fingerprint(self) -> int: ...


P = TypeVar("P", bound=_DomainParams)


class DomainEncoder(Generic[P]):
    """What every encoder over a known domain of one metric holds: its params, the
    domain look-up, the bit source (default: the shared CSPRNG-backed ``SecureBits``)
    and the report-id source (``os.urandom`` unless a test injects one: every report
    gets a fresh id, since an id shared by a device's reports would link them)."""

    __slots__ = ("_domain", "_fingerprint", "_index", "_new_id", "_rand", "metric", "params")

    def __init__(
        self,
        params: P,
        *,
        metric: str,
        domain: tuple[str, ...] | list[str] | None = None,
        rand: BitSource | None = None,
        random_bytes: Callable[[int], bytes] | None = None,
    ) -> None:
        if not isinstance(metric, str) or not metric:
            raise ValueError("metric must be a non-empty string")
        self.params = params
        self.metric = metric
        self._domain, self._index = checked_domain(domain, params.domain_size)
        self._rand: BitSource = rand if rand is not None else shared_secure_bits()
        self._new_id: Callable[[int], bytes] = (
            random_bytes if random_bytes is not None else os.urandom
        )
        self._fingerprint = params.fingerprint()

    def index_of(self, value: str | int) -> int:
        return domain_index(value, self._index, self.params.domain_size)

    def _randbelow(self, n: int) -> int:
        return uniform_below(self._rand, n)


class BasicEncoder(DomainEncoder[BasicParams]):
    """Encodes domain indexes (or values, given ``domain``) for one metric."""

    __slots__ = ()

    def _bernoulli(self, prob: float) -> bool:
        return bool(bernoulli_bits(self._rand, prob, 1))

    def randomize(self, index: int) -> bytes:
        """The mechanism's output for a domain index, as payload bytes."""
        params = self.params
        mech = params.mechanism
        d = params.domain_size
        if mech == "binary-rr":
            keep = self._bernoulli(params.keep_probability)
            return bytes([index if keep else 1 - index])
        if mech == "krr":
            out = index
            if not self._bernoulli(params.keep_probability):
                out = self._randbelow(d - 1)
                out += out >= index
            return out.to_bytes(index_bytes(d), "little")
        if mech == "oue":
            bits = bernoulli_bits(self._rand, params.oue_q, d) & ~(1 << index)
            if self._bernoulli(0.5):
                bits |= 1 << index
            return pack_bits(bits, d)
        g = params.olh_buckets
        a = 1 + self._randbelow(OLH_PRIME - 1)
        b = self._randbelow(OLH_PRIME)
        y = olh_hash(a, b, index, g)
        if not self._bernoulli(params.keep_probability):
            other = self._randbelow(g - 1)
            y = other + (other >= y)
        return (
            a.to_bytes(4, "little") + b.to_bytes(4, "little") + y.to_bytes(index_bytes(g), "little")
        )

    def encode(self, value: str | int) -> Report:
        return Report(
            metric=self.metric,
            cohort=0,
            bits=self.randomize(self.index_of(value)),
            params_fingerprint=self._fingerprint,
            report_id=new_report_id(self._new_id),
        )
