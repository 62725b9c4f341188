"""Heavy hitters without a candidate list: decode prefix and value rounds, plan the next.

``prefixes`` decodes a discovery round's counts into estimates of every kept
prefix's children; ``values`` decodes the estimation round (k-RR over candidates
and "none"); ``plan`` holds the round plan and the state between rounds;
``simulate`` makes a round's counts for benchmarks and tests. The device side is
``crowdmix.client.discovery``; the privacy accounting of the rounds is
``crowdmix.aggregator.accounting.discovery``.
"""

from __future__ import annotations

from crowdmix.aggregator.discovery.plan import (
    DiscoveredValues,
    DiscoveryPlan,
    DiscoveryState,
    advance,
    discovered,
)
from crowdmix.aggregator.discovery.prefixes import PrefixEstimates, decode_prefix_round
from crowdmix.aggregator.discovery.values import ValueEstimates, decode_value_round

__all__ = [
    "DiscoveredValues",
    "DiscoveryPlan",
    "DiscoveryState",
    "PrefixEstimates",
    "ValueEstimates",
    "advance",
    "decode_prefix_round",
    "decode_value_round",
    "discovered",
]
