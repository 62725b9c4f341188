"""The device's privacy ceiling: served params less private than the app allows make no report.

The server chooses each metric's params; the app bounds them, so a server cannot
switch the local randomization off:

- ``max_epsilon`` bounds one report's ε (RAPPOR's ε_1, a basic mechanism's ε, a
  shuffled histogram's ε_L; see ``crowdmix.core.privacy``);
- ``max_epsilon_inf`` bounds RAPPOR's ε_∞ (any number of reports of one value);
- a shuffled histogram without local randomization (ε_L = ∞: the value hidden only
  by the seal and the shuffle) needs ``allow_unrandomized_histograms``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crowdmix.core.registry import MetricConfig

__all__ = ["MAX_EPSILON", "MAX_EPSILON_INF", "Ceiling"]

#: The default ceiling on one report's ε.
MAX_EPSILON = 10.0
#: The default ceiling on RAPPOR's ε_∞.
MAX_EPSILON_INF = 20.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Ceiling:
    """The app's privacy ceiling (``math.inf``: none)."""

    max_epsilon: float = MAX_EPSILON
    max_epsilon_inf: float = MAX_EPSILON_INF
    allow_unrandomized_histograms: bool = False

    def __post_init__(self) -> None:
        for knob in ("max_epsilon", "max_epsilon_inf"):
            v = getattr(self, knob)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ValueError(f"{knob} must be a positive number (inf: no ceiling), got {v!r}")

    def refusal(self, metric: str, mc: MetricConfig) -> str | None:
        """Why the served config of ``metric`` is above this ceiling (naming the figure
        and the knob), or None when it is within."""
        figures: list[tuple[str, float, str, float]] = []
        if mc.rappor is not None:
            from crowdmix.core.privacy import epsilon_inf, epsilon_one

            figures.append(("ε_1", epsilon_one(mc.rappor), "max_epsilon", self.max_epsilon))
            figures.append(("ε_∞", epsilon_inf(mc.rappor), "max_epsilon_inf", self.max_epsilon_inf))
        elif mc.basic is not None:
            figures.append(("ε", mc.basic.epsilon, "max_epsilon", self.max_epsilon))
        elif mc.histogram is not None:
            eps = mc.histogram.local_epsilon
            if eps is not None:
                figures.append(("ε_L", eps, "max_epsilon", self.max_epsilon))
            elif not self.allow_unrandomized_histograms:
                return (
                    f"metric {metric!r}: the served histogram sends the value without local "
                    "randomization (ε_L = inf); this device allows that only with "
                    "allow_unrandomized_histograms=True"
                )
        for name, value, knob, ceiling in figures:
            if not value <= ceiling:  # inf and nan too
                return (
                    f"metric {metric!r}: the served params give {name} = {value:.6g}, above "
                    f"this device's ceiling {knob} = {ceiling:g}"
                )
        return None
