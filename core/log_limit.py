"""A failure that repeats, logged as an episode rather than as every attempt.

A daemon whose store is down fails every pass of its loops (the shuffler's releaser
every 50 ms, each request, the aggregator's fold every second): one line per attempt is
tens of thousands an hour and buries everything else. ``RepeatedFailure`` logs the
first failure at once, then at most one summary per ``every`` seconds (how many
failed since, and the last error), and one line when it ends (how long, how many).

Standard library only: both daemons use it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["RepeatedFailure"]


class RepeatedFailure:
    """The episodes of one kind of failure (``what``, e.g. "redis store") in ``logger``."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        every: float = 60.0,
        level: int = logging.WARNING,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not every > 0:
            raise ValueError(f"every must be positive, got {every!r}")
        self._log = logger
        self._what = what
        self._every = every
        self._level = level
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._since: float | None = None  # when the episode began (None: all is well)
        self._logged_at = 0.0
        self._unlogged = 0  # failures since the last line
        self._total = 0  # failures in this episode

    @property
    def failing(self) -> bool:
        return self._since is not None

    def failed(self, error: object) -> None:
        """One more failure: logged if it starts an episode or ``every`` s passed."""
        now = self._monotonic()
        with self._lock:
            self._total += 1
            if self._since is None:
                self._since = self._logged_at = now
                self._unlogged = 0
                line: str | None = f"{self._what} failing: {error}"
            elif now - self._logged_at >= self._every:
                self._unlogged += 1
                line = (
                    f"{self._what} still failing after {now - self._since:.0f} s "
                    f"({_times(self._unlogged)} since the last line): {error}"
                )
                self._logged_at, self._unlogged = now, 0
            else:
                self._unlogged += 1
                line = None
        if line is not None:
            self._log.log(self._level, line)

    def succeeded(self) -> None:
        """It worked: ends an episode with one INFO line (nothing when none was open)."""
        if self._since is None:  # the common case: no lock
            return
        now = self._monotonic()
        with self._lock:
            if self._since is None:
                return
            lasted, total = now - self._since, self._total
            self._since, self._total, self._unlogged = None, 0, 0
        self._log.info("%s recovered after %.0f s (%s)", self._what, lasted, _times(total))


def _times(n: int) -> str:
    return "1 failure" if n == 1 else f"{n} failures"
