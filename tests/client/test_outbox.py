"""The outbox's promises, one transaction each (crowdmix.client.outbox)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from crowdmix.client.outbox import ROW_OVERHEAD, Claim, Outbox, OutboxError
from crowdmix.client.report import Report

FP = 0xFEDCBA9876543210  # above 2**63: stored as a signed SQLite integer and read back


def _report(metric: str = "m", nbytes: int = 4, cohort: int = 3) -> Report:
    return Report(metric=metric, cohort=cohort, bits=bytes(range(nbytes)), params_fingerprint=FP)


def test_claim_stores_the_report_and_the_claim_together(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    r = _report()
    assert box.claim("m", 10, lambda: r) is Claim.MADE
    (row,) = box.pending()
    assert row.report == r and row.report.report_id == r.report_id
    assert row.report.params_fingerprint == FP
    assert (row.window, row.attempts, row.first_attempt_window) == (10, 0, None)
    assert box.last_window("m") == 10
    assert stat.S_IMODE(os.stat(tmp_path / "o.db").st_mode) == 0o600


def test_one_report_per_window_and_one_waiting_per_metric(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    made = []

    def make() -> Report:
        made.append(1)
        return _report()

    assert box.claim("m", 10, make) is Claim.MADE
    assert box.claim("m", 10, make) is Claim.USED
    assert box.claim("m", 9, make) is Claim.USED  # a clock that went back reopens nothing
    assert box.claim("m", 11, make) is Claim.WAITING  # the window-10 report is not sent yet
    assert len(made) == 1  # nothing was encoded for the refusals
    assert box.claim("other", 11, lambda: _report("other")) is Claim.MADE


def test_delivery_marks_its_window_used(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    box.claim("m", 10, _report)
    (row,) = box.pending()
    box.begin_send([row.report.report_id], 12)
    box.acknowledged([row.report.report_id], 13)  # filed by the shuffler under 13
    assert box.pending() == [] and box.last_window("m") == 13
    assert box.claim("m", 13, _report) is Claim.USED
    assert box.claim("m", 14, _report) is Claim.MADE
    assert box.counters() == {"delivered": 1}


def test_attempts_are_recorded_before_sending(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    box.claim("m", 10, _report)
    rid = box.pending()[0].report.report_id
    box.begin_send([rid], 11)
    box.begin_send([rid], 12)
    (row,) = Outbox(tmp_path / "o.db").pending()  # as a restarted process sees it
    assert (row.attempts, row.first_attempt_window, row.report.report_id) == (2, 11, rid)


def test_an_encoder_error_stores_nothing(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")

    def bad() -> Report:
        raise ValueError("value not in the domain")

    with pytest.raises(ValueError, match="domain"):
        box.claim("m", 10, bad)
    assert box.pending() == [] and box.last_window("m") is None


def test_full_refuses_the_new_report_and_records_no_claim(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_reports=2)
    assert box.claim("a", 1, lambda: _report("a")) is Claim.MADE
    assert box.claim("b", 1, lambda: _report("b")) is Claim.MADE
    assert box.claim("c", 1, lambda: _report("c")) is Claim.FULL
    assert box.last_window("c") is None and len(box) == 2
    assert box.counters() == {"refused_full": 1}
    # bytes: two 100-byte reports fit in 2 * (100 + 1 + overhead), a third does not
    small = Outbox(tmp_path / "b.db", max_bytes=2 * (100 + 1 + ROW_OVERHEAD))
    assert small.claim("a", 1, lambda: _report("a", 100)) is Claim.MADE
    assert small.claim("b", 1, lambda: _report("b", 100)) is Claim.MADE
    assert small.claim("c", 1, lambda: _report("c", 100)) is Claim.FULL


def test_drop_counts_by_reason(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    box.claim("m", 1, _report)
    box.drop([box.pending()[0].report.report_id, b"x" * 16], "expired")
    assert len(box) == 0 and box.counters() == {"expired": 1}


def test_config_cache_survives_a_restart(tmp_path: Path) -> None:
    Outbox(tmp_path / "o.db").store_config(b"\x01answer", 123.5)
    assert Outbox(tmp_path / "o.db").cached_config() == (b"\x01answer", 123.5)


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


def test_a_new_window_length_renumbers_claims_and_rows_in_one_transaction(
    tmp_path: Path,
) -> None:
    box = Outbox(tmp_path / "o.db")
    box.store_config(b"a", 1.0, window_seconds=3600)
    hour = 490_000  # an hour's number; as a day it would lie in the year 3300
    assert box.claim("m", hour, _report) is Claim.MADE
    assert box.claim("n", hour, lambda: _report("n")) is Claim.MADE
    (_, tried) = box.pending()
    box.begin_send([tried.report.report_id], hour)
    box.store_config(b"b", 2.0, window_seconds=3600)  # same length: nothing moves
    assert box.last_window("m") == hour
    box.store_config(b"c", 3.0, window_seconds=86400)
    day = ((hour + 1) * 3600 - 1) // 86400  # the day holding the hour's last second
    assert box.last_window("m") == box.last_window("n") == day
    untried, tried = box.pending()
    assert (untried.window, untried.first_attempt_window) == (day, None)
    # tried under the old length: the aggregator cannot match its id across the change
    assert (tried.window, tried.first_attempt_window) == (day, -1)
    # an outbox that never recorded a length takes the cached answer's
    old = Outbox(tmp_path / "old.db")
    assert old.claim("m", 20_000, _report) is Claim.MADE
    old.store_config(b"x", 1.0, window_seconds=3600, previous_window_seconds=86400)
    assert old.last_window("m") == (20_001 * 86400 - 1) // 3600
