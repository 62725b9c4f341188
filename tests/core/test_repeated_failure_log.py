"""A failure that repeats is logged when it starts, at most once per interval while it
lasts (with how many were not logged), and once when it ends."""

from __future__ import annotations

import logging

import pytest

from crowdmix.core.log_limit import RepeatedFailure


def test_an_outage_is_three_lines_however_many_attempts_fail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    episode = RepeatedFailure(logging.getLogger("t"), "store", every=60.0, monotonic=lambda: now[0])
    episode.succeeded()  # nothing to end: silent
    with caplog.at_level(logging.INFO, logger="t"):
        for _ in range(1000):  # 16 a second for a minute and a bit
            episode.failed("connection refused")
            now[0] += 0.0625  # exact in binary: the 961st failure is at 60 s
        episode.succeeded()
        episode.succeeded()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "store failing: connection refused"),
        (
            "WARNING",
            "store still failing after 60 s (960 failures since the last line): connection refused",
        ),
        ("INFO", "store recovered after 62 s (1000 failures)"),
    ]
    assert not episode.failing


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every"):
        RepeatedFailure(logging.getLogger("t"), "x", every=0)
