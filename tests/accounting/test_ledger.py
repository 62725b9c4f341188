"""The privacy ledger: one contract suite run against every store (memory, JSON
file, real Redis), plus the failure paths of each."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from crowdmix.aggregator.accounting.ledger import (
    Budget,
    BudgetExceededError,
    ConcurrentUpdateError,
    DuplicateReleaseError,
    LedgerCorruptError,
    PrivacyLedger,
    Release,
)
from crowdmix.aggregator.accounting.ledger_stores import (
    JsonFileLedgerStore,
    LedgerStore,
    MemoryLedgerStore,
    RedisLedgerStore,
)


def own_segment(eps: float, delta: float, partition: str) -> dict[str, object]:
    """A segment that costs exactly ``eps``: one report hiding among nobody, in a
    partition of its own, so releases of such segments add up (basic composition)."""
    return {
        "rounds": 1, "n_amplify": 1, "delta": delta, "epsilon0": eps, "beta": 0.0,
        "rappor": None, "basic": None, "hashing": "mmh3", "cohort_per_report": False,
        "crowd_failure": 0.0, "partition": partition, "group": 0,
    }  # fmt: skip


def release(rid: str, eps: float = 0.5, delta: float = 1e-7, **kw: object) -> Release:
    return Release(
        release_id=rid,
        window=kw.pop("window", 1),  # type: ignore[arg-type]
        n_reports=10_000,
        mechanism="rappor k=16 h=2 m=1 f=0.5 p=0.5 q=0.75",
        epsilon=eps,
        delta=delta,
        fresh_randomness=kw.pop("fresh_randomness", True),  # type: ignore[arg-type]
        segment=kw.pop("segment", own_segment(eps, delta, rid)),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture(params=["memory", "json", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LedgerStore]:
    if request.param == "memory":
        yield MemoryLedgerStore()
    elif request.param == "json":
        yield JsonFileLedgerStore(tmp_path / "ledger.json")
    else:
        import redis

        url = request.getfixturevalue("redis_url")
        client = redis.Redis.from_url(url)
        try:
            yield RedisLedgerStore(client)
        finally:
            client.close()


def test_records_releases_and_composes(store: LedgerStore) -> None:
    ledger = PrivacyLedger(store, {"pages": Budget(epsilon=2.0, delta=1e-6)})
    assert ledger.spent("pages") == (0.0, 0.0)
    eps, delta = ledger.record("pages", release("r1"))
    assert eps == 0.5 and delta == pytest.approx(1e-7)
    eps, delta = ledger.record("pages", release("r2", window=2, batch_sizes=(6000, 4000)))
    assert eps == 1.0 and delta == pytest.approx(2e-7)
    got = ledger.releases("pages")
    assert [r.release_id for r in got] == ["r1", "r2"]
    assert got[1].batch_sizes == (6000, 4000)
    assert got[1] == release(
        "r2", window=2, batch_sizes=(6000, 4000), total_epsilon=1.0, total_delta=2e-7
    )
    assert ledger.releases("other") == []


def test_over_budget_release_is_refused_and_nothing_is_recorded(store: LedgerStore) -> None:
    ledger = PrivacyLedger(store, Budget(epsilon=1.2, delta=1e-6))
    ledger.record("pages", release("r1"))
    ledger.record("pages", release("r2"))
    before = store.load("pages")
    with pytest.raises(BudgetExceededError, match=r"over the budget.*Nothing was recorded"):
        ledger.record("pages", release("r3"))
    assert store.load("pages") == before
    with pytest.raises(BudgetExceededError):
        ledger.check("pages", release("r3"))
    # δ counts too.
    with pytest.raises(BudgetExceededError):
        ledger.record("pages", release("r4", eps=0.01, delta=1e-5))
    assert store.load("pages") == before
    # A smaller release still fits.
    assert ledger.record("pages", release("r5", eps=0.2))[0] == pytest.approx(1.2)


def test_duplicate_release_is_refused(store: LedgerStore) -> None:
    ledger = PrivacyLedger(store)
    ledger.record("pages", release("r1"))
    with pytest.raises(DuplicateReleaseError, match="r1"):
        ledger.record("pages", release("r1"))
    assert len(store.load("pages")) == 1


def test_append_is_compare_and_append(store: LedgerStore) -> None:
    store.append("pages", release("r1").to_dict(), 0)
    with pytest.raises(ConcurrentUpdateError):
        store.append("pages", release("r2").to_dict(), 0)  # a stale writer
    assert [e["release_id"] for e in store.load("pages")] == ["r1"]


def test_an_entry_without_a_segment_is_refused_by_name(store: LedgerStore) -> None:
    ledger = PrivacyLedger(store)
    ledger.record("pages", release("r1"))
    old = {**release("old").to_dict(), "segment": None}  # no released version writes one
    store.append("pages", old, 1)
    for read in (lambda: ledger.spent("pages"), lambda: ledger.record("pages", release("r2"))):
        with pytest.raises(LedgerCorruptError, match="'old' cannot be read: it has no segment"):
            read()
    assert len(store.load("pages")) == 2


def test_release_validation() -> None:
    with pytest.raises(ValueError, match="release_id"):
        release("")
    with pytest.raises(ValueError, match="epsilon"):
        release("x", eps=-1.0)
    with pytest.raises(ValueError, match="delta"):
        release("x", delta=1.0)
    with pytest.raises(ValueError, match="batch_sizes"):
        release("x", batch_sizes=(0,))
    with pytest.raises(ValueError, match="fresh_randomness"):
        release("x", fresh_randomness=1)
    with pytest.raises(ValueError, match="budget"):
        Budget(epsilon=-1.0, delta=0.0)


def test_json_store_survives_reopen_and_reports_corruption(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.json"
    PrivacyLedger(JsonFileLedgerStore(path)).record("pages", release("r1"))
    reopened = PrivacyLedger(JsonFileLedgerStore(path))
    assert [r.release_id for r in reopened.releases("pages")] == ["r1"]
    assert not list(path.parent.glob("ledger.json.*[!k]"))  # no temp files left behind
    path.write_text("{not json")
    with pytest.raises(LedgerCorruptError, match="not valid JSON"):
        reopened.releases("pages")
    path.write_text(json.dumps({"pages": [{"release_id": "r1"}]}))
    with pytest.raises(LedgerCorruptError, match="cannot be read"):
        reopened.releases("pages")


def test_redis_store_reports_corruption(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        store = RedisLedgerStore(client)
        client.rpush("crowdmix:ledger:{pages}", b"\xff garbage")
        with pytest.raises(LedgerCorruptError):
            store.load("pages")
    finally:
        client.close()


def test_alike_statements_compose_to_the_homogeneous_figure() -> None:
    from crowdmix.aggregator.accounting import privacy_statement
    from crowdmix.core.params import RapporParams
    from crowdmix.core.registry import MetricConfig

    metric = MetricConfig(name="pages", rappor=RapporParams(k=16, h=2, m=1))
    ledger = PrivacyLedger(MemoryLedgerStore(), Budget(epsilon=1.0, delta=1e-5))
    total = 0.0
    for window in range(1, 4):
        stmt = privacy_statement(metric, 10_000, batch_sizes=[6000, 4000])
        entry = stmt.to_release(release_id=f"w{window}", window=window)
        assert entry.batch_sizes == (6000, 4000) and entry.rounds == 1
        total, _ = ledger.record("pages", entry)
    # Three releases sharing one memoised PRR: the total is the memoised-PRR figure
    # over 3 rounds (the statement for rounds=3), never the sum of per-release ε.
    three = privacy_statement(metric, 10_000, batch_sizes=[6000, 4000], rounds=3)
    assert three.longitudinal.argument.startswith("memoised-prr")
    assert total == three.longitudinal.epsilon
    assert not any(r.fresh_randomness for r in ledger.releases("pages"))


def test_record_release_counts_rounds_and_refuses_over_budget() -> None:
    from crowdmix.aggregator.accounting import privacy_statement, record_release
    from crowdmix.core.params import RapporParams
    from crowdmix.core.registry import MetricConfig

    metric = MetricConfig(name="pages", rappor=RapporParams(k=16, h=2, m=1))
    first = privacy_statement(metric, 10_000, rounds=1).central.epsilon
    second = privacy_statement(metric, 10_000, rounds=2).longitudinal.epsilon
    store = MemoryLedgerStore()
    ledger = PrivacyLedger(store, Budget(epsilon=(first + second) / 2 + 1e-9, delta=1e-5))
    stmt, total = record_release(ledger, metric, 10_000, release_id="w1", window=1)
    assert stmt.longitudinal.rounds == 1 and total[0] == pytest.approx(first)
    with pytest.raises(BudgetExceededError):
        record_release(ledger, metric, 10_000, release_id="w2", window=2)
    assert len(store.load("pages")) == 1


def test_record_release_retries_when_another_writer_wins() -> None:
    from crowdmix.aggregator.accounting import record_release
    from crowdmix.core.params import RapporParams
    from crowdmix.core.registry import MetricConfig

    class RacingStore(MemoryLedgerStore):
        """Another report job appends just before our first append."""

        raced = False

        def append(self, metric: str, entry: dict[str, object], expected_length: int) -> None:
            if not self.raced:
                self.raced = True
                other = release("other", eps=0.05, delta=1e-6)
                super().append(metric, other.to_dict(), expected_length)
            super().append(metric, entry, expected_length)

    metric = MetricConfig(name="pages", rappor=RapporParams(k=16, h=2, m=1))
    store = RacingStore()
    stmt, _ = record_release(PrivacyLedger(store), metric, 10_000, release_id="w1", window=1)
    assert stmt.longitudinal.rounds == 1  # the statement covers this release's own rounds
    assert [e["release_id"] for e in store.load("pages")] == ["other", "w1"]


def test_a_recorded_total_is_a_floor(store: LedgerStore) -> None:
    # The total stamped on an entry at append time is never undercut later.
    ledger = PrivacyLedger(store)
    assert ledger.record("pages", release("r1", eps=0.3)) == (0.3, 1e-7)
    stamped = ledger.releases("pages")[0]
    assert (stamped.total_epsilon, stamped.total_delta) == (0.3, 1e-7)
    entry = store.load("pages")[0]
    entry["total_epsilon"] = 0.9  # e.g. recorded by a more conservative version
    assert PrivacyLedger.cumulative([Release.from_dict(entry)]) == (0.9, 1e-7)
