"""``ReportBudget``: one report per metric per collection window, across restarts."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from crowdmix.client import CrowdmixClientError, ParamsError, ReportBudget

DAY = 86400


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_one_claim_per_metric_per_window(tmp_path: Path) -> None:
    clock = Clock(100 * DAY + 5)
    budget = ReportBudget(tmp_path / "b.json", DAY, clock=clock)
    assert budget.window() == 100
    assert budget.available("a")
    assert budget.claim("a")
    assert not budget.available("a")
    assert not budget.claim("a")
    assert budget.claim("b")  # metrics are independent
    clock.t = 101 * DAY - 1
    assert not budget.claim("a")  # same window to its last second
    clock.t = 101 * DAY
    assert budget.claim("a")
    assert not budget.claim("a")


def test_the_claim_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    clock = Clock(7 * DAY)
    assert ReportBudget(path, DAY, clock=clock).claim("a")
    again = ReportBudget(path, DAY, clock=clock)  # the app restarted the same day
    assert not again.claim("a")
    assert again.claim("b")
    assert json.loads(path.read_text()) == {"a": 7, "b": 7}
    clock.t = 8 * DAY
    assert ReportBudget(path, DAY, clock=clock).claim("a")


def test_a_clock_set_back_does_not_reopen_a_used_window(tmp_path: Path) -> None:
    clock = Clock(10 * DAY)
    budget = ReportBudget(tmp_path / "b.json", DAY, clock=clock)
    assert budget.claim("a")
    clock.t = 9 * DAY
    assert not budget.claim("a")


def test_in_memory_budget_needs_no_file() -> None:
    budget = ReportBudget(None, DAY, clock=Clock(0.0))
    assert budget.claim("a") and not budget.claim("a")


def test_concurrent_claims_grant_exactly_one(tmp_path: Path) -> None:
    budget = ReportBudget(tmp_path / "b.json", DAY)
    results: list[bool] = []
    lock = threading.Lock()

    def claim() -> None:
        ok = budget.claim("a")
        with lock:
            results.append(ok)

    threads = [threading.Thread(target=claim) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1 and len(results) == 16


@pytest.mark.parametrize(
    "content", ["not json", "[1, 2]", '{"a": "7"}', '{"a": true}', '{"a": 1.5}']
)
def test_an_unreadable_state_file_is_refused_not_reset(tmp_path: Path, content: str) -> None:
    path = tmp_path / "b.json"
    path.write_text(content)
    with pytest.raises(CrowdmixClientError, match=str(path)):
        ReportBudget(path, DAY)
    assert path.read_text() == content  # left for the app to look at


def test_a_state_that_cannot_be_written_claims_nothing(tmp_path: Path) -> None:
    missing_dir = tmp_path / "no-such-dir" / "b.json"
    budget = ReportBudget(missing_dir, DAY, clock=Clock(DAY))
    with pytest.raises(CrowdmixClientError, match="cannot record the report budget"):
        budget.claim("a")
    assert budget.available("a")  # rolled back: the claim did not happen
    (tmp_path / "no-such-dir").mkdir()
    assert budget.claim("a")
    assert not budget.claim("a")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_window_seconds_is_validated(bad: object) -> None:
    with pytest.raises(ParamsError, match="window_seconds"):
        ReportBudget(None, bad)  # type: ignore[arg-type]
