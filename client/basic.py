"""Encoders of the basic LDP mechanisms on the device (``crowdmix.core.basic``: their
params and payload layouts): ``BasicEncoder``, and ``DomainEncoder``, what every
encoder over a known domain of one metric shares (``crowdmix.client.histogram`` too).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from crowdmix.client.randomness import BitSource, bernoulli_bits, shared_secure_bits, uniform_below
from crowdmix.client.report import Report, new_report_id, pack_bits
from crowdmix.core.basic import OLH_PRIME, BasicParams, index_bytes, olh_hash
from crowdmix.core.errors import ParamsError

__all__ = ["BasicEncoder", "DomainEncoder", "checked_domain", "domain_index"]


def checked_domain(
    domain: tuple[str, ...] | list[str] | None, domain_size: int
) -> dict[str, int] | None:
    """A metric's value → index map (None without a value list: encode indexes);
    ParamsError unless it has exactly ``domain_size`` distinct values."""
    if domain is None:
        return None
    if len(domain) != domain_size:
        raise ParamsError(f"domain has {len(domain)} values but domain_size is {domain_size}")
    if len(set(domain)) != len(domain):
        raise ParamsError("domain values must be distinct")
    return {v: i for i, v in enumerate(domain)}


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

    __slots__ = ("_fingerprint", "_index", "_new_id", "_rand", "metric", "params")

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
        self._index = checked_domain(domain, params.domain_size)
        self._rand: BitSource = rand if rand is not None else shared_secure_bits()
        self._new_id: Callable[[int], bytes] = (
            random_bytes if random_bytes is not None else os.urandom
        )
        self._fingerprint = params.fingerprint()

    def index_of(self, value: str | int) -> int:
        return domain_index(value, self._index, self.params.domain_size)

    def _randbelow(self, n: int) -> int:
        return uniform_below(self._rand, n)

    def _flip(self, index: int, n: int, keep: float) -> int:
        """k-ary randomized response of ``index`` over [0, n) with keep probability ``keep``."""
        if bernoulli_bits(self._rand, keep, 1):
            return index
        other = self._randbelow(n - 1)
        return other + (other >= index)


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
            return self._flip(index, d, params.keep_probability).to_bytes(index_bytes(d), "little")
        if mech == "oue":
            bits = bernoulli_bits(self._rand, params.oue_q, d) & ~(1 << index)
            if self._bernoulli(0.5):
                bits |= 1 << index
            return pack_bits(bits, d)
        g = params.olh_buckets
        a = 1 + self._randbelow(OLH_PRIME - 1)
        b = self._randbelow(OLH_PRIME)
        y = self._flip(olh_hash(a, b, index, g), g, params.keep_probability)
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
