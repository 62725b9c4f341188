"""The privacy ledger: every release of a metric, and a budget it must stay within.

A report job asks the ledger before publishing: ``record`` validates the release
(well-formed, not already recorded, cumulative guarantee within the metric's budget) and
only then appends it, so a refused release leaves the ledger untouched. Storage sits
behind ``LedgerStore`` (memory, a JSON file or Redis; ``ledger_stores``), each with one
compare-and-append, so two report jobs racing on one metric cannot both spend the last of
a budget. The cumulative guarantee is ``history.compose_segments`` of every release's
segment, raised to at least each release's own cost and the previous total, so it never
goes down. Errors are ``AccountingError``: ``BudgetExceededError`` (nothing recorded),
``DuplicateReleaseError``, ``ConcurrentUpdateError`` (re-read and retry),
``UnboundedReleaseError`` (memoised PRRs sharing coins under different params),
``LedgerCorruptError`` (also an entry without a segment: one no released version
writes), ``LedgerMissingError`` (never read as "0 releases").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "TOTAL_ASSUMPTION",
    "AccountingError",
    "Budget",
    "BudgetExceededError",
    "ConcurrentUpdateError",
    "DuplicateReleaseError",
    "LedgerCorruptError",
    "LedgerMissingError",
    "LedgerStore",
    "PrivacyLedger",
    "Release",
    "UnboundedReleaseError",
]


# Printed with every ledger total: the memoised-PRR argument
# bounds a group of rounds at its smallest crowd, which is only right when the same
# clients report in every round (the linked view needs the rounds' intersection).
TOTAL_ASSUMPTION = (
    "the total assumes the same clients report in every round: a memoised PRR's rounds "
    "are bounded at the smallest crowd of any round, and a client that skips rounds "
    "hides only among the clients present in all of its rounds, which can be fewer"
)


class AccountingError(Exception):
    """Base of the ledger's errors."""


class BudgetExceededError(AccountingError):
    """Recording the release would exceed the metric's privacy budget."""


class DuplicateReleaseError(AccountingError):
    """A release with the same id is already in the ledger."""


class ConcurrentUpdateError(AccountingError):
    """The ledger changed between validation and append."""


class UnboundedReleaseError(AccountingError, ValueError):
    """Releases share PRR coins in a way no bound covers: the total cannot be bounded."""


class LedgerCorruptError(AccountingError):
    """A stored ledger entry cannot be parsed."""


class LedgerMissingError(AccountingError):
    """The ledger file does not exist: reading it as empty would understate the total."""


class LedgerStore(Protocol):
    """Where ledger entries live. ``append`` is a compare-and-append."""

    def load(self, metric: str) -> list[dict[str, Any]]:
        """All entries of ``metric`` in order (empty if none)."""
        ...

    def append(self, metric: str, entry: dict[str, Any], expected_length: int) -> None:
        """Append iff ``metric`` still has ``expected_length`` entries, else
        raise ConcurrentUpdateError."""
        ...


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
    #: what the release adds to the metric's total (``history.segment_to_dict``)
    segment: Mapping[str, Any]
    bound: str = "generic"
    batch_sizes: tuple[int, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    rounds: int = 1
    total_epsilon: float | None = None
    total_delta: float | None = None

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
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"rounds must be a positive integer, got {self.rounds!r}")
        if (self.total_epsilon is None) != (self.total_delta is None):
            raise ValueError("total_epsilon and total_delta go together")
        if self.total_epsilon is not None:
            _check_eps_delta("total_", self.total_epsilon, self.total_delta)
        from crowdmix.aggregator.accounting.history import segment_from_dict

        try:
            seg = segment_from_dict(self.segment)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"segment is not a valid segment: {exc!r}") from None
        if seg.rounds != self.rounds:
            raise ValueError(f"segment rounds {seg.rounds} != rounds {self.rounds}")

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
            "extra": dict(self.extra),
            "rounds": self.rounds,
            "segment": dict(self.segment),
            "total_epsilon": self.total_epsilon,
            "total_delta": self.total_delta,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Release:
        if isinstance(data, Mapping) and data.get("segment") is None:
            raise LedgerCorruptError(
                f"ledger entry {data.get('release_id')!r} cannot be read: it has no segment "
                "(written before releases carried one, its share of the total cannot be "
                "recomputed); record the metric in a new ledger"
            )
        try:
            return cls(
                release_id=data["release_id"],
                window=data["window"],
                n_reports=data["n_reports"],
                mechanism=data["mechanism"],
                epsilon=data["epsilon"],
                delta=data["delta"],
                fresh_randomness=data["fresh_randomness"],
                bound=data["bound"],
                batch_sizes=tuple(data["batch_sizes"]),
                extra=dict(data["extra"]),
                rounds=data["rounds"],
                segment=data["segment"],
                total_epsilon=data["total_epsilon"],
                total_delta=data["total_delta"],
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
    def composed(releases: list[Release]) -> tuple[float, float]:
        """(ε, δ) of ``releases`` by composition alone (no floor from recorded totals)."""
        from crowdmix.aggregator.accounting.history import (
            SharedCoinsError,
            compose_segments,
            segment_from_dict,
        )

        if not releases:
            return 0.0, 0.0
        try:
            total = compose_segments([segment_from_dict(r.segment) for r in releases])
        except SharedCoinsError as exc:
            raise UnboundedReleaseError(str(exc)) from None
        return total.epsilon, min(1.0, total.delta)

    @classmethod
    def cumulative(cls, releases: list[Release]) -> tuple[float, float]:
        """(ε, δ) of all ``releases`` together (see the module docstring): the
        composed figure, never below any one release nor the total recorded before.

        Raises UnboundedReleaseError when shared randomness leaves the total unbounded.
        """
        if not releases:
            return 0.0, 0.0
        eps, delta = cls.composed(releases)
        for r in releases:  # each release alone, and every total recorded so far
            eps, delta = max(eps, r.epsilon), max(delta, r.delta)
            if r.total_epsilon is not None and r.total_delta is not None:
                eps, delta = max(eps, r.total_epsilon), max(delta, r.total_delta)
        return eps, delta

    def running_totals(self, metric: str) -> list[tuple[Release, tuple[float, float]]]:
        """Each release of ``metric`` with the total after it."""
        releases = self.releases(metric)
        return [(r, self.cumulative(releases[: i + 1])) for i, r in enumerate(releases)]

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
        content = release.extra.get("content")
        same = [r for r in existing if content is not None and r.extra.get("content") == content]
        if same:  # the same data again (a re-run, another id): it costs no more privacy
            raise DuplicateReleaseError(
                f"release {release.release_id!r} of {metric!r} releases the same data as "
                f"{same[0].release_id!r}, already recorded"
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
        import dataclasses

        existing = self.releases(metric)
        eps, delta = self._validate(metric, release, existing)
        stamped = dataclasses.replace(release, total_epsilon=eps, total_delta=delta)
        self.store.append(metric, stamped.to_dict(), len(existing))
        return eps, delta
