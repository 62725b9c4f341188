"""The health service follows the store: NOT_SERVING while it cannot be reached.

A shuffler whose Redis is down refuses every submit (``UNAVAILABLE``), so a health
check that answers SERVING then (compose files and load balancers use it) sends
devices to a shuffler that can take nothing. ``StoreWatch`` pings the store every
``interval`` seconds in a thread of its own and sets the serving status from the
answer; the first failure and the recovery are logged once each (``RepeatedFailure``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from crowdmix.core.log_limit import RepeatedFailure
from crowdmix.shuffler.store import ShufflerStore

__all__ = ["StoreWatch"]

log = logging.getLogger("crowdmix.shuffler")


class StoreWatch:
    """Pings ``store`` and calls ``set_serving(False)`` / ``set_serving(True)`` on changes."""

    def __init__(
        self,
        store: ShufflerStore,
        set_serving: Callable[[bool], None],
        *,
        interval: float = 1.0,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be positive, got {interval!r}")
        self._store = store
        self._set_serving = set_serving
        self._interval = interval
        self._stop = threading.Event()
        self._episode = RepeatedFailure(log, "store (health NOT_SERVING)")
        self._thread = threading.Thread(target=self._run, name="store-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def check(self) -> bool:
        """Ping once and set the status; True when the store answered."""
        try:
            self._store.ping()
        except Exception as exc:  # StoreUnavailable, or anything else that stops a ping
            if not self._episode.failing:
                self._set_serving(False)
            self._episode.failed(exc)
            return False
        if self._episode.failing:
            self._set_serving(True)
            self._episode.succeeded()
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.check()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
