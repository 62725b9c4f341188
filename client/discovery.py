"""Heavy hitters without a candidate list: the device's encoders for one round.

The round params, the symbol map and the prefix hash are in
``crowdmix.core.discovery`` (shared with the aggregator's decoders); each report
is one k-ary randomized response, ε-LDP for the device's value. ``WindowEncoder``
is what ``Reporter`` uses for a heavy-hitters metric: the round served for the
report's window, written in the metric's fixed length under that round's fingerprint
(``ServedRound.fingerprint``: a shuffler or aggregator holding another round refuses it);
``device_round``: the one round of a discovery a device reports in.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence
from typing import Any

from crowdmix.client.basic import DomainEncoder
from crowdmix.client.randomness import BitSource
from crowdmix.client.report import Report, make_report, new_report_id
from crowdmix.core.discovery import (
    REPORT_BYTES,
    PrefixRound,
    ValueRound,
    prefix_bucket,
    prefix_key,
)

__all__ = ["PrefixEncoder", "ValueEncoder", "WindowEncoder", "device_round"]


def device_round(
    secret: bytes, metric: str, fingerprint: int, opened: int, weights: Sequence[float]
) -> int:
    """The round of the discovery opened in window ``opened`` this device reports in:
    round r with probability ``weights[r]``, drawn by HMAC-SHA256 under the device's
    secret (the same on every call, unrelated to the value and unknown to the server),
    so each device is in one round's group only and the groups are disjoint."""
    msg = f"crowdmix/discovery-group/v1|{metric}|{fingerprint:016x}|{opened}".encode()
    u = int.from_bytes(hmac.new(secret, msg, hashlib.sha256).digest()[:8], "little") / 2.0**64
    acc = 0.0
    for r, w in enumerate(weights):
        acc += w
        if u < acc:
            return r
    return len(weights) - 1


def _flip(encoder: DomainEncoder[PrefixRound] | DomainEncoder[ValueRound], true: int) -> int:
    """k-ary randomized response of ``true`` over the round's [0, n) with its keep probability."""
    params = encoder.params
    n = params.buckets if isinstance(params, PrefixRound) else params.cells
    return encoder._flip(true, n, params.keep_probability)


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


class WindowEncoder:
    """A heavy-hitters metric's reports in one window: the index of the round served
    for that window (``PrefixEncoder`` or ``ValueEncoder``), ``REPORT_BYTES`` bytes
    little-endian, under ``fingerprint``: the round's (``ServedRound.fingerprint``)."""

    __slots__ = ("_inner", "fingerprint", "metric", "window")

    def __init__(
        self,
        params: PrefixRound | ValueRound,
        *,
        metric: str,
        fingerprint: int,
        window: int,
        rand: BitSource | None = None,
        random_bytes: Callable[[int], bytes] | None = None,
    ) -> None:
        kind = PrefixEncoder if isinstance(params, PrefixRound) else ValueEncoder
        self._inner: PrefixEncoder | ValueEncoder = kind(
            params,  # type: ignore[arg-type]
            metric=metric,
            rand=rand,
            random_bytes=random_bytes,
        )
        self.metric = metric
        self.fingerprint = fingerprint
        self.window = window

    @property
    def params(self) -> PrefixRound | ValueRound:
        return self._inner.params

    def encode(self, value: str) -> Report:
        if not isinstance(value, str):
            raise ValueError(f"a heavy-hitters value is a str, got {type(value).__name__}")
        index = self._inner.index(value)
        return make_report(
            self.metric,
            0,
            index.to_bytes(REPORT_BYTES, "little"),
            self.fingerprint,
            new_report_id(self._inner._new_id),
        )
