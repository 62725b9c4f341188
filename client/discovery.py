"""Heavy hitters without a candidate list: the device's encoders for one round.

The round params, the symbol map and the prefix hash are in
``crowdmix.core.discovery`` (shared with the aggregator's decoders); each report
is one k-ary randomized response, ε-LDP for the device's value.
"""

from __future__ import annotations

from typing import Any

from crowdmix.client.basic import DomainEncoder
from crowdmix.client.randomness import bernoulli_bits
from crowdmix.client.report import Report, make_report, new_report_id
from crowdmix.core.discovery import PrefixRound, ValueRound, prefix_bucket, prefix_key

__all__ = ["PrefixEncoder", "ValueEncoder"]


def _flip(encoder: DomainEncoder[PrefixRound] | DomainEncoder[ValueRound], true: int) -> int:
    """k-ary randomized response of ``true`` over the round's [0, n) with its keep probability."""
    params = encoder.params
    n = params.buckets if isinstance(params, PrefixRound) else params.cells
    if bernoulli_bits(encoder._rand, params.keep_probability, 1):
        return true
    other = encoder._randbelow(n - 1)
    return other + (other >= true)


def _report(encoder: DomainEncoder[PrefixRound] | DomainEncoder[ValueRound], index: int) -> Report:
    return make_report(
        encoder.metric,
        0,
        index.to_bytes(encoder.params.report_bytes, "little"),
        encoder._fingerprint,
        new_report_id(encoder._new_id),
    )


class PrefixEncoder(DomainEncoder[PrefixRound]):
    """One device's report for a discovery round (``PrefixRound``).

    Draw order, which the exact tests pin: the seed, the keep coin, the other bucket."""

    __slots__ = ()

    def index(self, value: str) -> int:
        """The report's index s·g + y for ``value``."""
        r = self.params
        prefix, hi, lo = r.split(r.symbols.symbols(value))
        seed = self._randbelow(r.seeds)
        h = prefix_bucket(seed, prefix_key(r.start, r.stop, hi, prefix), lo, r.buckets)
        return seed * r.buckets + _flip(self, h)

    def encode(self, value: str) -> Report:  # type: ignore[override]
        return _report(self, self.index(value))


class ValueEncoder(DomainEncoder[ValueRound]):
    """One device's report for an estimation round (``ValueRound``)."""

    __slots__ = ("_positions",)

    def __init__(self, params: ValueRound, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self._positions = {params.symbols.symbols(v): i for i, v in enumerate(params.candidates)}

    def index(self, value: str) -> int:
        """The report's index: the candidate's position (C for none), randomized."""
        r = self.params
        return _flip(self, self._positions.get(r.symbols.symbols(value), r.cells - 1))

    def encode(self, value: str) -> Report:  # type: ignore[override]
        return _report(self, self.index(value))
