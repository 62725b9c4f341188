"""The outbox's promises, one transaction each (crowdmix.client.outbox)."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from crowdmix.client.outbox import ROW_OVERHEAD, SCHEMA_VERSION, Claim, Outbox, OutboxError
from crowdmix.client.report import Report

WS = 86400
FP = 0xFEDCBA9876543210  # above 2**63: stored as a signed SQLite integer and read back


def _report(metric: str = "m", nbytes: int = 4, cohort: int = 3) -> Report:
    return Report(metric=metric, cohort=cohort, bits=bytes(range(nbytes)), params_fingerprint=FP)


def test_claim_stores_the_report_and_the_claim_together(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    r = _report()
    assert box.claim("m", 10, WS, lambda: r) is Claim.MADE
    (row,) = box.pending()
    assert row.report == r and row.report.report_id == r.report_id
    assert row.report.params_fingerprint == FP and row.window == 10
    assert box.last_window("m") == (10, WS)
    assert stat.S_IMODE(os.stat(tmp_path / "o.db").st_mode) == 0o600


def test_one_report_per_metric_and_window_and_windows_only_move_forward(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    made = []

    def make() -> Report:
        made.append(1)
        return _report()

    assert box.claim("m", 10, WS, make) is Claim.MADE
    assert box.claim("m", 10, WS, make) is Claim.USED
    assert box.claim("m", 9, WS, make) is Claim.USED  # a clock that went back reopens nothing
    assert len(made) == 1  # nothing was encoded for the refusals
    # the next window's report while the last one still waits: each keeps its window
    assert box.claim("m", 11, WS, make) is Claim.MADE
    assert [row.window for row in box.pending()] == [10, 11]
    assert box.claim("other", 11, WS, lambda: _report("other")) is Claim.MADE


def test_a_new_window_length_compares_windows_by_the_time_they_cover(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    hour = 490_000  # an hour's index: as a day's it would lie in the year 3300
    assert box.claim("m", hour, 3600, _report) is Claim.MADE
    day = hour * 3600 // WS  # the day holding that hour
    assert box.claim("m", day, WS, _report) is Claim.USED  # the day overlaps the claimed hour
    assert box.claim("m", day + 1, WS, _report) is Claim.MADE  # the next day does not
    assert box.last_window("m") == (day + 1, WS)
    assert box.claim("m", (day + 2) * 24 - 1, 3600, _report) is Claim.USED  # inside day + 1
    assert box.claim("m", (day + 2) * 24, 3600, _report) is Claim.MADE
    assert [(r.window, r.window_seconds) for r in box.pending()] == [
        (hour, 3600), (day + 1, WS), ((day + 2) * 24, 3600)
    ]  # fmt: skip


def test_a_report_keeps_its_window_and_id_until_acknowledged(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    box.claim("m", 10, WS, _report)
    (row,) = box.pending()
    (again,) = Outbox(tmp_path / "o.db").pending()  # as a restarted process sees it
    assert (again.window, again.report.report_id) == (10, row.report.report_id)
    assert box.acknowledged([row.report.report_id]) == 1
    assert box.pending() == [] and box.last_window("m") == (10, WS)
    assert box.claim("m", 10, WS, _report) is Claim.USED
    assert box.counters() == {"delivered": 1}


def test_a_group_is_one_metric_and_one_window_oldest_first(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    box.claim("h", 10, WS, lambda: [_report("h"), _report("h"), _report("h")])  # real + fakes
    box.claim("m", 10, WS, _report)
    box.claim("h", 11, WS, lambda: [_report("h")])
    first = box.next_group()
    assert [(r.report.metric, r.window) for r in first] == [("h", 10)] * 3
    box.acknowledged([r.report.report_id for r in first])
    assert [(r.report.metric, r.window) for r in box.next_group()] == [("m", 10)]
    box.drop([r.report.report_id for r in box.next_group()], "window_closed")
    assert [(r.report.metric, r.window) for r in box.next_group()] == [("h", 11)]
    assert box.counters() == {"delivered": 3, "window_closed": 1}


def test_delivered_counts_the_rows_deleted_not_the_ids_given(tmp_path: Path) -> None:
    """Two processes of one app on one app dir both send a row and both hear the ack:
    the report was delivered once."""
    mine, theirs = Outbox(tmp_path / "o.db"), Outbox(tmp_path / "o.db")
    mine.claim("m", 10, WS, _report)
    (row,) = mine.pending()
    assert [r.report.report_id for r in theirs.pending()] == [row.report.report_id]
    assert theirs.acknowledged([row.report.report_id]) == 1
    assert mine.acknowledged([row.report.report_id, b"x" * 16]) == 0
    assert mine.counters() == {"delivered": 1}


def test_an_encoder_error_stores_nothing(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")

    def bad() -> Report:
        raise ValueError("value not in the domain")

    with pytest.raises(ValueError, match="domain"):
        box.claim("m", 10, WS, bad)
    assert box.pending() == [] and box.last_window("m") is None


def test_full_refuses_the_new_report_and_records_no_claim(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_reports=2)
    assert box.claim("a", 1, WS, lambda: _report("a")) is Claim.MADE
    assert box.claim("b", 1, WS, lambda: _report("b")) is Claim.MADE
    assert box.claim("c", 1, WS, lambda: _report("c")) is Claim.FULL
    assert box.last_window("c") is None and len(box) == 2
    assert box.counters() == {"outbox_full": 1}
    # bytes: two 100-byte reports fit in 2 * (100 + 1 + overhead), a third does not
    small = Outbox(tmp_path / "b.db", max_bytes=2 * (100 + 1 + ROW_OVERHEAD))
    assert small.claim("a", 1, WS, lambda: _report("a", 100)) is Claim.MADE
    assert small.claim("b", 1, WS, lambda: _report("b", 100)) is Claim.MADE
    assert small.claim("c", 1, WS, lambda: _report("c", 100)) is Claim.FULL


def test_drop_counts_by_reason(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    box.claim("m", 1, WS, _report)
    box.drop([box.pending()[0].report.report_id, b"x" * 16], "window_closed")
    assert len(box) == 0 and box.counters() == {"window_closed": 1}


def test_config_cache_survives_a_restart(tmp_path: Path) -> None:
    Outbox(tmp_path / "o.db").store_config(b"\x01answer", 123.5, -2.25)
    assert Outbox(tmp_path / "o.db").cached_config() == (b"\x01answer", 123.5, -2.25)


def test_an_outbox_of_another_schema_version_is_refused_by_name(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    box.close()
    db = sqlite3.connect(tmp_path / "o.db")
    assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    db.execute("PRAGMA user_version = 7")
    db.close()
    with pytest.raises(
        OutboxError, match=r"o\.db was written by schema version 7; .* reads schema version 2 only"
    ):
        Outbox(tmp_path / "o.db")
    # a file made before outboxes had a version: tables, no version
    db = sqlite3.connect(tmp_path / "old.db")
    db.execute("CREATE TABLE outbox (seq INTEGER PRIMARY KEY, report_id BLOB)")
    db.close()
    with pytest.raises(OutboxError, match=r"old\.db was written by an unreleased SDK"):
        Outbox(tmp_path / "old.db")


def test_bad_arguments_and_paths_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_reports"):
        Outbox(tmp_path / "o.db", max_reports=0)
    (tmp_path / "junk").write_bytes(b"not a database" * 100)
    with pytest.raises(OutboxError, match="junk"):
        Outbox(tmp_path / "junk")


def test_the_device_secret_is_made_once_private_and_never_short(tmp_path: Path) -> None:
    from crowdmix.client.errors import CrowdmixClientError
    from crowdmix.client.reporter import _device_secret

    path = tmp_path / "secret"
    first = _device_secret(path)
    assert len(first) == 32 and _device_secret(path) == first
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]  # no temporary file left
    path.write_bytes(b"short")
    with pytest.raises(CrowdmixClientError, match="not a device secret"):
        _device_secret(path)


def test_backoff_is_exponential_with_full_jitter_and_capped() -> None:
    import random

    from crowdmix.client.reporter import backoff_delay

    class Top(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b

    assert [backoff_delay(n, 1.0, 300.0, Top()) for n in range(1, 11)] == [
        2, 4, 8, 16, 32, 64, 128, 256, 300, 300,
    ]  # fmt: skip
    rng = random.Random(7)
    draws = [backoff_delay(3, 1.0, 300.0, rng) for _ in range(1000)]
    assert 0 < min(draws) < 0.5 and 7.5 < max(draws) <= 8.0  # spread over [0, 8]


def test_the_reporter_bounds_its_outbox_by_default() -> None:
    import inspect

    from crowdmix.client.reporter import Reporter

    params = inspect.signature(Reporter).parameters
    assert params["max_reports"].default == 1000 and params["max_bytes"].default == 1 << 20
    assert params["sealing"].default == "required"


def test_next_group_leaves_out_the_groups_it_is_told_to_skip(tmp_path: Path) -> None:
    """A group whose window has not begun on the server waits; the sender asks for the
    next group past it, so it holds back no other metric's report."""
    box = Outbox(tmp_path / "o.db")
    assert box.claim("early", 20002, WS, lambda: _report("early")) is Claim.MADE
    assert box.claim("today", 20000, WS, lambda: _report("today")) is Claim.MADE
    assert [r.report.metric for r in box.next_group()] == ["early"]
    assert [r.report.metric for r in box.next_group(skip=[("early", 20002)])] == ["today"]
    assert box.next_group(skip=[("early", 20002), ("today", 20000)]) == []


def test_withdrawing_a_report_named_ahead_moves_the_claim_back_never_below_a_settled_one(
    tmp_path: Path,
) -> None:
    box = Outbox(tmp_path / "o.db")
    assert box.claim("m", 10, WS, _report) is Claim.MADE
    (r10,) = box.pending()
    box.acknowledged([r10.report.report_id])  # window 10 may have reached a shuffler
    assert box.claim("m", 11, WS, _report) is Claim.MADE  # waits
    assert box.claim("m", 40, WS, _report) is Claim.MADE  # a clock set forward
    assert box.claim("m", 41, WS, _report) is Claim.MADE
    ahead = [r for r in box.pending() if r.window >= 40]
    assert box.withdraw([ahead[1].report.report_id]) == 1
    assert box.last_window("m") == (40, WS)
    assert box.withdraw([ahead[0].report.report_id]) == 1
    assert box.last_window("m") == (11, WS)  # still waiting: held
    assert box.claim("m", 11, WS, _report) is Claim.USED
    assert box.counters()["window_ahead"] == 2
    (r11,) = box.pending()
    box.drop([r11.report.report_id], "window_closed")
    assert box.claim("m", 12, WS, _report) is Claim.MADE
    (r12,) = box.pending()
    box.withdraw([r12.report.report_id])
    assert box.last_window("m") == (11, WS)  # settled: never claimed again
    assert box.claim("m", 11, WS, _report) is Claim.USED
    assert box.claim("m", 12, WS, _report) is Claim.MADE
    # a metric with nothing before its withdrawn report has no claim left
    assert box.claim("n", 40, WS, lambda: _report("n")) is Claim.MADE
    box.withdraw([r.report.report_id for r in box.pending() if r.report.metric == "n"])
    assert box.last_window("n") is None
