"""Shuffled histograms with fake reports: the protocol and its params (the encoder on
the device is ``crowdmix.client.histogram``).

A metric over a known domain {0, ..., d-1}. In one collection window every device sends,
in one call and a uniformly random order, one *real* report (its value x, or optionally
k-RR with local ε_L: x w.p. e^ε_L/(e^ε_L+d-1), each other value w.p. 1/(e^ε_L+d-1)) and
``fake_slots`` = m fake slots, each filled independently w.p. ``fake_probability`` = q
with a uniform value: at most 1 + m reports, 1 + m·q on average. A payload is the value's
index in ``index_bytes(d)`` bytes, little-endian; sealed, real and fake reports are
indistinguishable, so the shuffler and aggregator refuse such a metric unsealed.
Family: Balcer, Cheu (ITC 2020); Cheu, Zhilyaev (IEEE S&P 2022); Li et al. (DUMP).
Privacy: δ(ε) of the analyst's view is exact from the honest other devices' fakes
(``crowdmix.aggregator.accounting.histogram``); a colluding shuffler leaves ε_L-LDP, or
ε = ∞ without k-RR. One device moves any bucket by at most 1 + m per call. Rationale and
the abuse bound: docs/design.md, "Core".
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from crowdmix.core.basic import index_bytes
from crowdmix.core.errors import ParamsError

__all__ = [
    "ENCODING",
    "MAX_DOMAIN",
    "MAX_FAKE_SLOTS",
    "HistogramParams",
]

#: Registry name of this encoding.
ENCODING = "shuffled-histogram"
MAX_DOMAIN = 1 << 24
#: A hard ceiling on fake slots per device (messages cost bandwidth and store).
MAX_FAKE_SLOTS = 4096
MAX_LOCAL_EPSILON = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class HistogramParams:
    """One shuffled-histogram metric: domain size d, m fake slots filled w.p. q,
    optional local k-RR with ``local_epsilon`` (None: the real value is sent)."""

    domain_size: int
    fake_slots: int
    fake_probability: float
    local_epsilon: float | None = None

    def __post_init__(self) -> None:
        d = self.domain_size
        if isinstance(d, bool) or not isinstance(d, int) or not 2 <= d <= MAX_DOMAIN:
            raise ParamsError(f"domain_size must be an integer in [2, {MAX_DOMAIN}], got {d!r}")
        m = self.fake_slots
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m <= MAX_FAKE_SLOTS:
            raise ParamsError(f"fake_slots must be an integer in [0, {MAX_FAKE_SLOTS}], got {m!r}")
        q = self.fake_probability
        if isinstance(q, bool) or not isinstance(q, int | float) or not 0.0 <= q <= 1.0:
            raise ParamsError(f"fake_probability must be in [0, 1], got {q!r}")
        object.__setattr__(self, "fake_probability", float(q))
        eps = self.local_epsilon
        if eps is not None:
            if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps):
                raise ParamsError(f"local_epsilon must be a finite number or None, got {eps!r}")
            if not 0.0 < eps <= MAX_LOCAL_EPSILON:
                raise ParamsError(f"local_epsilon must be in (0, {MAX_LOCAL_EPSILON}], got {eps!r}")
            object.__setattr__(self, "local_epsilon", float(eps))

    @property
    def max_messages(self) -> int:
        """Reports one device sends at most per window: 1 + m."""
        return 1 + self.fake_slots

    @property
    def expected_messages(self) -> float:
        """Reports one device sends on average: 1 + m·q."""
        return 1.0 + self.fake_slots * self.fake_probability

    @property
    def keep_probability(self) -> float:
        """p: P(real report = true value): e^ε_L/(e^ε_L+d-1), or 1 without k-RR."""
        if self.local_epsilon is None:
            return 1.0
        return 1.0 / (1.0 + (self.domain_size - 1) * math.exp(-self.local_epsilon))

    @property
    def other_probability(self) -> float:
        """r: P(real report = a given other value): 1/(e^ε_L+d-1), or 0 without k-RR."""
        if self.local_epsilon is None:
            return 0.0
        return 1.0 / (math.exp(self.local_epsilon) + self.domain_size - 1)

    @property
    def report_bytes(self) -> int:
        return index_bytes(self.domain_size)

    def fingerprint(self) -> int:
        """A stable 64-bit id of these params, carried by every report."""
        canon = (
            f"{ENCODING}/v1;d={self.domain_size};m={self.fake_slots};"
            f"q={self.fake_probability!r};local_epsilon={self.local_epsilon!r}"
        )
        return int.from_bytes(hashlib.blake2b(canon.encode(), digest_size=8).digest(), "little")
