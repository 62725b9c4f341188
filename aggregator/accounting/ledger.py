"""The privacy ledger: every release of a metric, and a budget it must stay within.

A report job asks the ledger before publishing: ``record`` validates the
release (well-formed, not already recorded, cumulative guarantee within the
metric's budget) and only then appends it, so a refused release leaves the
ledger untouched. Storage sits behind ``LedgerStore`` (memory, a JSON file, or
Redis; ``ledger_stores``); every backend offers one compare-and-append, so two report jobs
racing on one metric cannot both spend the last of a budget.

Cumulative guarantee of releases 1..k of a metric:

- every release used fresh randomness (``fresh_randomness=True``: basic
  mechanisms, RAPPOR with f = 0): basic composition (Σε_i, Σδ_i), or the newest
  release's ``longitudinal`` figure covering all k (PLD composition, from
  ``privacy_statement(..., rounds=k)``) when its ε is smaller;
- otherwise (a memoised PRR shared across releases) composition theorems do not
  apply, because the releases share randomness: the newest release must carry
  the longitudinal figure for all k releases (ε_k or ε_∞ amplified), and that
  figure is the total. A release without it is refused.

Errors (all ``AccountingError``)::

    AccountingError
    ├── BudgetExceededError     the release would exceed the budget; nothing recorded
    ├── DuplicateReleaseError   a release with this id is already recorded
    ├── ConcurrentUpdateError   another writer appended first; re-read and retry
    ├── UnboundedReleaseError   shares randomness (memoised PRR) but has no longitudinal figure
    └── LedgerCorruptError      stored data cannot be read back
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aggregator.accounting.ledger_stores import LedgerStore

__all__ = [
    "AccountingError",
    "Budget",
    "BudgetExceededError",
    "ConcurrentUpdateError",
    "DuplicateReleaseError",
    "LedgerCorruptError",
    "PrivacyLedger",
    "Release",
    "UnboundedReleaseError",
]


class AccountingError(Exception):
    """Base of the ledger's errors."""


class BudgetExceededError(AccountingError):
    """Recording the release would exceed the metric's privacy budget."""


class DuplicateReleaseError(AccountingError):
    """A release with the same id is already in the ledger."""


class ConcurrentUpdateError(AccountingError):
    """The ledger changed between validation and append."""


class UnboundedReleaseError(AccountingError, ValueError):
    """Shared randomness and no longitudinal figure: the total cannot be bounded."""


class LedgerCorruptError(AccountingError):
    """A stored ledger entry cannot be parsed."""


def _check_eps_delta(where: str, eps: Any, delta: Any) -> None:
    if isinstance(eps, bool) or not isinstance(eps, int | float) or math.isnan(eps) or eps < 0:
        raise ValueError(f"{where}epsilon must be a non-negative number, got {eps!r}")
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 <= delta < 1.0:
        raise ValueError(f"{where}delta must be in [0, 1), got {delta!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """The most a metric may ever spend: (ε, δ) over all its releases."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        _check_eps_delta("budget ", self.epsilon, self.delta)


@dataclass(frozen=True, slots=True, kw_only=True)
class Release:
    """One published result: which data, what mechanism, what it cost."""

    release_id: str
    window: int
    n_reports: int
    mechanism: str
    epsilon: float
    delta: float
    fresh_randomness: bool
    bound: str = "generic"
    batch_sizes: tuple[int, ...] = ()
    longitudinal_epsilon: float | None = None
    longitudinal_delta: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.release_id, str) or not 0 < len(self.release_id) <= 256:
            raise ValueError(f"release_id must be a non-empty string, got {self.release_id!r}")
        for name in ("window", "n_reports"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        if not isinstance(self.mechanism, str) or not self.mechanism:
            raise ValueError(f"mechanism must be a non-empty string, got {self.mechanism!r}")
        _check_eps_delta("", self.epsilon, self.delta)
        if not isinstance(self.fresh_randomness, bool):
            raise ValueError(f"fresh_randomness must be a bool, got {self.fresh_randomness!r}")
        object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes must be positive integers, got {self.batch_sizes!r}")
        if (self.longitudinal_epsilon is None) != (self.longitudinal_delta is None):
            raise ValueError("longitudinal_epsilon and longitudinal_delta go together")
        if self.longitudinal_epsilon is not None:
            _check_eps_delta("longitudinal_", self.longitudinal_epsilon, self.longitudinal_delta)

    def to_dict(self) -> dict[str, Any]:
        return {
            "release_id": self.release_id,
            "window": self.window,
            "n_reports": self.n_reports,
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "fresh_randomness": self.fresh_randomness,
            "bound": self.bound,
            "batch_sizes": list(self.batch_sizes),
            "longitudinal_epsilon": self.longitudinal_epsilon,
            "longitudinal_delta": self.longitudinal_delta,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Release:
        try:
            return cls(
                release_id=data["release_id"],
                window=data["window"],
                n_reports=data["n_reports"],
                mechanism=data["mechanism"],
                epsilon=data["epsilon"],
                delta=data["delta"],
                fresh_randomness=data["fresh_randomness"],
                bound=data.get("bound", "generic"),
                batch_sizes=tuple(data.get("batch_sizes", ())),
                longitudinal_epsilon=data.get("longitudinal_epsilon"),
                longitudinal_delta=data.get("longitudinal_delta"),
                extra=dict(data.get("extra", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LedgerCorruptError(f"ledger entry cannot be read: {exc}") from None


class PrivacyLedger:
    """Per-metric record of releases with a budget check before every append."""

    def __init__(
        self, store: LedgerStore, budgets: Mapping[str, Budget] | Budget | None = None
    ) -> None:
        self.store = store
        self._budgets = budgets

    def budget(self, metric: str) -> Budget | None:
        if self._budgets is None or isinstance(self._budgets, Budget):
            return self._budgets
        return self._budgets.get(metric)

    def releases(self, metric: str) -> list[Release]:
        return [Release.from_dict(e) for e in self.store.load(metric)]

    @staticmethod
    def cumulative(releases: list[Release]) -> tuple[float, float]:
        """(ε, δ) of all ``releases`` together (see the module docstring).

        Raises UnboundedReleaseError when shared randomness leaves the total unbounded (a
        non-fresh release history whose newest entry has no longitudinal figure).
        """
        if not releases:
            return 0.0, 0.0
        last = releases[-1]
        if not all(r.fresh_randomness for r in releases):
            if last.longitudinal_epsilon is None or last.longitudinal_delta is None:
                raise UnboundedReleaseError(
                    f"release {last.release_id!r} shares randomness (a memoised PRR) with "
                    "earlier releases, so per-release figures do not compose: it must carry "
                    "the longitudinal figure for all releases "
                    "(privacy_statement(..., rounds=k).to_release(...))"
                )
            # Each figure covers every round up to its release, but was computed with
            # that release's crowd; a later, larger crowd must not lower the total, so
            # the largest figure recorded stands (each pair is valid; (max ε, max δ)
            # is weaker than both).
            figures = [
                (r.longitudinal_epsilon, r.longitudinal_delta)
                for r in releases
                if r.longitudinal_epsilon is not None and r.longitudinal_delta is not None
            ]
            return max(e for e, _ in figures), max(d for _, d in figures)
        eps = math.fsum(r.epsilon for r in releases)
        delta = min(1.0, math.fsum(r.delta for r in releases))
        if last.longitudinal_epsilon is not None and last.longitudinal_epsilon < eps:
            assert last.longitudinal_delta is not None  # paired in Release.__post_init__
            return last.longitudinal_epsilon, last.longitudinal_delta
        return eps, delta

    def spent(self, metric: str) -> tuple[float, float]:
        return self.cumulative(self.releases(metric))

    def check(self, metric: str, release: Release) -> tuple[float, float]:
        """The cumulative (ε, δ) if ``release`` were recorded; raises if refused."""
        return self._validate(metric, release, self.releases(metric))

    def _validate(
        self, metric: str, release: Release, existing: list[Release]
    ) -> tuple[float, float]:
        if any(r.release_id == release.release_id for r in existing):
            raise DuplicateReleaseError(
                f"release {release.release_id!r} of {metric!r} is already recorded"
            )
        eps, delta = self.cumulative([*existing, release])
        budget = self.budget(metric)
        if budget is not None and (eps > budget.epsilon or delta > budget.delta):
            spent_eps, spent_delta = self.cumulative(existing)
            raise BudgetExceededError(
                f"release {release.release_id!r} of {metric!r} would bring the total to "
                f"(ε={eps:.6g}, δ={delta:.3g}), over the budget (ε={budget.epsilon:.6g}, "
                f"δ={budget.delta:.3g}); already spent (ε={spent_eps:.6g}, δ={spent_delta:.3g}). "
                "Nothing was recorded."
            )
        return eps, delta

    def record(self, metric: str, release: Release) -> tuple[float, float]:
        """Validate, then append; returns the new cumulative (ε, δ)."""
        existing = self.releases(metric)
        result = self._validate(metric, release, existing)
        self.store.append(metric, release.to_dict(), len(existing))
        return result
