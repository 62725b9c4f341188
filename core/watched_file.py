"""A file's parsed value, re-read when its mtime, size or inode changes (looked at on use,
at most once per ``check_seconds``). A read that fails (``ValueError``: the daemons'
``ConfigError``, ``ParamsError``, ``KeySetError``) or a file gone keeps the last good value
and is tried again at the next look (a ``chmod`` changes none of the three)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

__all__ = ["WatchedFile"]

T = TypeVar("T")


class WatchedFile(Generic[T]):
    """The value ``read`` makes of the file at ``path`` (``first`` makes the value at
    start-up, default ``read``; its errors propagate). ``what`` names it in the log.
    ``on_change`` is called with each new value under ``lock`` (default: one of its own),
    so a holder can keep what it builds from the value in step with it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        read: Callable[[Path], T],
        what: str,
        *,
        log: logging.Logger,
        check_seconds: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        first: Callable[[Path], T] | None = None,
        lock: threading.Lock | None = None,
        on_change: Callable[[T], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self._read = read
        self._what = what
        self._log = log
        self._check_seconds = check_seconds
        self._monotonic = monotonic
        self._lock = threading.Lock() if lock is None else lock
        self._on_change = on_change
        self._stamp = self._stat()
        self._value = (first or read)(self.path)
        self._checked = monotonic()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def refresh(self, *, force: bool = False) -> bool:
        """Re-read a changed file now if due (or ``force``); True when the value changed."""
        now = self._monotonic()
        if not force and now - self._checked < self._check_seconds:
            return False
        self._checked = now
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:  # a file gone keeps its last value
            return False
        with self._lock:
            if stamp == self._stamp:  # another thread re-read it meanwhile
                return False
            try:
                value = self._read(self.path)
            except ValueError as exc:
                self._log.warning("keeping the previous %s: %s", self._what, exc)
                return False
            self._value, self._stamp = value, stamp
            if self._on_change is not None:
                self._on_change(value)
            self._log.info("%s reloaded from %s", self._what, self.path)
            return True

    @property
    def last(self) -> T:  # without a look at the file
        return self._value

    @property
    def value(self) -> T:
        self.refresh()
        return self._value
