"""The device side of shuffled histograms with fake reports (``crowdmix.core.histogram``:
the protocol, its privacy and its params): ``HistogramEncoder`` makes a device's real
report and its Binomial(m, q) fakes.
"""

from __future__ import annotations

from crowdmix.client.basic import DomainEncoder
from crowdmix.client.randomness import bernoulli_bits
from crowdmix.client.report import Report, make_report, new_report_id
from crowdmix.core.histogram import HistogramParams

__all__ = ["HistogramEncoder"]


class HistogramEncoder(DomainEncoder[HistogramParams]):
    """Encodes one device's value into its real report and its fake reports.

    Randomness comes from ``rand`` (default: the shared CSPRNG-backed
    ``SecureBits``). Draw order, which the exact tests pin: the local k-RR
    coin (and the replacement value), then the m slot coins in one word, then
    each filled slot's value, then the Fisher–Yates shuffle of the reports.
    """

    __slots__ = ()

    def real_index(self, index: int) -> int:
        """The real report's value: ``index``, or its k-RR output with local ε_L."""
        params = self.params
        if params.local_epsilon is None:
            return index
        return self._flip(index, params.domain_size, params.keep_probability)

    def fake_indexes(self) -> list[int]:
        """Binomial(m, q) values, each uniform over the domain, independent of the value."""
        params = self.params
        m = params.fake_slots
        if m == 0:
            return []
        filled = bernoulli_bits(self._rand, params.fake_probability, m).bit_count()
        return [self._randbelow(params.domain_size) for _ in range(filled)]

    def indexes(self, value: str | int) -> list[int]:
        """All of one device's report values for ``value``, in uniformly random order."""
        out = [self.real_index(self.index_of(value)), *self.fake_indexes()]
        for i in range(len(out) - 1, 0, -1):  # Fisher–Yates
            j = self._randbelow(i + 1)
            out[i], out[j] = out[j], out[i]
        return out

    def encode(self, value: str | int) -> list[Report]:
        """One device's reports for one window (1 + Binomial(m, q) of them)."""
        width = self.params.report_bytes
        return [
            make_report(
                self.metric,
                0,
                i.to_bytes(width, "little"),
                self._fingerprint,
                new_report_id(self._new_id),
            )
            for i in self.indexes(value)
        ]
