"""Shuffled histograms with fake reports: the protocol and its params (the encoder on
the device is ``crowdmix.client.histogram``).

A metric over a known domain {0, ..., d-1}. Every device sends, in one
collection window,

- one *real* report: its value x, or (optional local randomization) the
  output of k-ary randomized response with local ε_L: x w.p.
  e^ε_L/(e^ε_L+d-1), each other value w.p. 1/(e^ε_L+d-1);
- ``fake_slots`` = m *fake slots*, each independently filled w.p.
  ``fake_probability`` = q with a value drawn uniformly from the domain
  (so Binomial(m, q) fake reports, independent of x),

in a uniformly random order. A report's payload is the value's index in
``index_bytes(d)`` bytes, little-endian (the ``krr`` layout of
``crowdmix.client.basic``): real and fake reports are the same bytes, and once sealed
(HPKE, ``crowdmix.client.sealing``) the same ciphertext length, so neither the
shuffler nor the aggregator can tell them apart. Without sealing the
shuffler would see true values beside their senders: the shuffler and the
aggregator refuse such a metric without keys, and refuse clear reports of it
(``crowdmix.shuffler.validation``, ``crowdmix.aggregator.daemon.ingest``).

A device sends at most 1 + m reports per window, in one call (a hard cap by
construction; the shuffler refuses a call carrying more, see "Abuse and
thresholds" below), 1 + m·q on average.

This is the multi-message "fake users / dummy points" family of protocols:
Balcer and Cheu, "Separating local & shuffled differential privacy via
histograms" (ITC 2020, arXiv:1911.06879), which adds per-bucket Bernoulli
fakes; Cheu and Zhilyaev, "Differentially private histograms in the shuffle
model from fake users" (IEEE S&P 2022); Li et al., "DUMP: a dummy-point-based
framework for histogram estimation in shuffle model" (uniform dummies). The
Binomial-slots variant here is chosen because it gives a hard per-device cap
and an accounting that is *exact* (a proof, not an asymptotic theorem): see
``crowdmix.aggregator.accounting.histogram``, which computes δ(ε) of the analyst's view
from the exact distribution of the fakes.

Privacy, in short (details and proof in ``crowdmix.aggregator.accounting.histogram``):

- Analyst (aggregator) not colluding with the shuffler: the histogram of
  all reports is (ε, δ)-DP for replacing one device's value, with δ(ε)
  computed exactly from the fakes of *honest devices other than the target*
  (the target's own fakes and a colluding device's fakes give no cover).
- Shuffler and aggregator colluding: they see which reports came from the
  target, so only local randomization protects it: ε_L-LDP with k-RR on
  (fakes are independent of x, a post-processing), and no guarantee at
  all (ε = ∞) without it — the real value is among the target's reports.

Abuse and thresholds. Every LDP or shuffle scheme lets a device lie about
its own value; what matters is how much one device can move the counts.
Here a malicious device may send up to 1 + m reports with any values (it
need not randomize or draw its fakes uniformly), so it moves any one
bucket's count by at most 1 + m, and all buckets together by at most 1 + m
(an honest device's reports are no fewer: the difference is that their
law is known and the estimator subtracts it). The shuffler enforces it per
call: a call with more than 1 + m sealed reports of the metric is refused
(``INVALID_ARGUMENT`` ``too_many_messages``). It cannot enforce it per device:
it has no device identity (tokens are per app), so it cannot link calls, and a
device making several calls sends more; per-device limits (attestation,
account-level rate limits) are outside crowdmix, and each extra call counts
as one more (dishonest) device in the bounds below. With k colluding malicious devices the
shift is at most k(1 + m) per bucket, i.e. k(1 + m)/(p - r) after k-RR
debiasing; on the proportion scale, k(1 + m)/(n (p - r)). Malicious devices
also withdraw their own fakes from the cover: the accounting counts only
honest devices (``honest_fraction``). The expected crowd per bucket from
honest fakes is n·m·q/d; buckets whose estimate stays inside the noise
(the decoder's detection threshold) are reported as not significant.
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
