"""Privacy accounting: local guarantees, amplification by shuffling, composition,
a ledger per metric, a planner, and the privacy statement of a release.

Pure math (no state, numpy/scipy imported lazily): ``local``, ``pairs``,
``amplification``, ``composition``, ``pld``, ``guarantees``, ``planner``.
Output: ``statement``. State: ``ledger`` (+ ``ledger_stores``). CLI: ``cli``.
The report job's entry points: ``privacy_statement(metric, n_reports, *, delta=1e-6,
...) -> PrivacyStatement`` and ``record_release(ledger, metric, n_reports, *, release_id,
window, ...) -> (PrivacyStatement, cumulative (ε, δ))`` (statement and ledger entry in one
step). ``history.compose_segments`` composes releases that differ in params, crowd and
rounds; the ledger's total is that, never below a release or an earlier total.
Errors: ``ValueError`` for bad parameters (``PlanError``: the planner cannot meet the
target) and ``AccountingError``, the ledger's (``BudgetExceededError``,
``DuplicateReleaseError``, ``ConcurrentUpdateError``, ``UnboundedReleaseError``,
``LedgerCorruptError``, ``LedgerMissingError``).
"""

from __future__ import annotations

from crowdmix.aggregator.accounting.amplification import (
    BOUNDS,
    AmplificationResult,
    amplify,
    fmt21_closed_form,
    shuffled_rr_lower_bound,
)
from crowdmix.aggregator.accounting.composition import (
    METHODS,
    compose,
    compose_advanced,
    compose_basic,
    compose_optimal,
)
from crowdmix.aggregator.accounting.ledger import (
    AccountingError,
    Budget,
    BudgetExceededError,
    ConcurrentUpdateError,
    DuplicateReleaseError,
    LedgerCorruptError,
    LedgerMissingError,
    PrivacyLedger,
    Release,
    UnboundedReleaseError,
)
from crowdmix.aggregator.accounting.ledger_stores import (
    JsonFileLedgerStore,
    LedgerStore,
    MemoryLedgerStore,
    RedisLedgerStore,
)
from crowdmix.aggregator.accounting.local import epsilon_k, total_variation
from crowdmix.aggregator.accounting.planner import Plan, PlanError, plan
from crowdmix.aggregator.accounting.statement import (
    CentralGuarantee,
    LongitudinalGuarantee,
    PrivacyStatement,
    privacy_statement,
    record_release,
)

__all__ = [
    "BOUNDS",
    "METHODS",
    "AccountingError",
    "AmplificationResult",
    "Budget",
    "BudgetExceededError",
    "CentralGuarantee",
    "ConcurrentUpdateError",
    "DuplicateReleaseError",
    "JsonFileLedgerStore",
    "LedgerCorruptError",
    "LedgerMissingError",
    "LedgerStore",
    "LongitudinalGuarantee",
    "MemoryLedgerStore",
    "Plan",
    "PlanError",
    "PrivacyLedger",
    "PrivacyStatement",
    "RedisLedgerStore",
    "Release",
    "UnboundedReleaseError",
    "amplify",
    "compose",
    "compose_advanced",
    "compose_basic",
    "compose_optimal",
    "epsilon_k",
    "fmt21_closed_form",
    "plan",
    "privacy_statement",
    "record_release",
    "shuffled_rr_lower_bound",
    "total_variation",
]
