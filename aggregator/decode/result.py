"""The decoded table: one row per candidate value, on the proportion scale."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["DecodeResult"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeResult:
    """Estimated frequencies of the candidate values.

    ``proportion``, ``std_error``, ``ci_low`` and ``ci_high`` are fractions of
    all reports; ``estimate``/``count_*`` are the same in reports (× N).
    ``p_value`` is one-sided (H0: the value does not occur); ``significant``
    applies the multiple-testing ``correction`` at level ``alpha`` over all
    candidates. Rows that are not significant keep their (unreliable)
    estimates for inspection; ``allocated_mass`` sums only significant rows.
    """

    values: tuple[str, ...]
    proportion: FloatArray
    std_error: FloatArray
    ci_low: FloatArray
    ci_high: FloatArray
    p_value: FloatArray
    significant: npt.NDArray[np.bool_]
    num_reports: int
    num_cohorts: int
    detection_threshold: float
    method: str
    alpha: float = 0.05
    correction: str = "bonferroni"
    #: How ci_low/ci_high were made: "wald", or "selective" (detected rows
    #: selection-adjusted, the others Wald); see ``crowdmix.aggregator.decode.stats``.
    ci_method: str = "wald"
    #: The distribution answer (see ``crowdmix.aggregator.decode.rappor``): every
    #: candidate's share, non-negative, summing to <= 1, with an interval
    #: (distribution_low <= distribution <= distribution_high). None: the
    #: decoder gives only the estimates above.
    distribution: FloatArray | None = None
    distribution_low: FloatArray | None = None
    distribution_high: FloatArray | None = None
    warnings: tuple[str, ...] = ()
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.values)
        for name in ("proportion", "std_error", "ci_low", "ci_high", "p_value", "significant"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"{name} must have one entry per value ({n})")
        for name in ("distribution", "distribution_low", "distribution_high"):
            arr = getattr(self, name)
            if arr is not None and arr.shape != (n,):
                raise ValueError(f"{name} must have one entry per value ({n})")
        if self.ci_method not in ("wald", "selective"):
            raise ValueError(f"ci_method must be wald or selective, got {self.ci_method!r}")

    @property
    def estimate(self) -> FloatArray:
        """Estimated number of reports of each value."""
        return self.proportion * self.num_reports

    @property
    def detected(self) -> int:
        return int(self.significant.sum())

    @property
    def allocated_mass(self) -> float:
        """Sum of the significant values' proportions (1 if every report is explained)."""
        return float(self.proportion[self.significant].sum())

    @property
    def distribution_mass(self) -> float | None:
        """Sum of the distribution answer (None without one): the share of reports it places."""
        return None if self.distribution is None else float(self.distribution.sum())

    def order(self) -> npt.NDArray[np.intp]:
        """Row order for display: significant first, then by estimate, descending."""
        return np.lexsort((-self.proportion, ~self.significant))
