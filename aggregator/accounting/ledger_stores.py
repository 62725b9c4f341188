"""Storage for the privacy ledger: one small protocol, three backends.

Every backend offers ``load`` and a compare-and-append (append only if the
metric still has the expected number of entries), so validation in
``PrivacyLedger.record`` and the append cannot be split by another writer.
The same contract suite (tests/accounting/test_ledger.py) runs against all three.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from threading import Lock
from typing import Any

from crowdmix.aggregator.accounting.ledger import (
    ConcurrentUpdateError,
    LedgerCorruptError,
    LedgerMissingError,
    LedgerStore,
)

__all__ = ["JsonFileLedgerStore", "LedgerStore", "MemoryLedgerStore", "RedisLedgerStore"]
# LedgerStore, the protocol these keep, is defined by its user, aggregator.accounting.ledger.


class MemoryLedgerStore:
    """In-process store (tests, the embedded demo)."""

    def __init__(self) -> None:
        self._data: dict[str, list[dict[str, Any]]] = {}
        self._lock = Lock()

    def load(self, metric: str) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(json.dumps(e)) for e in self._data.get(metric, [])]

    def append(self, metric: str, entry: dict[str, Any], expected_length: int) -> None:
        copy = json.loads(json.dumps(entry))
        with self._lock:
            entries = self._data.setdefault(metric, [])
            if len(entries) != expected_length:
                raise ConcurrentUpdateError(f"ledger of {metric!r} changed; retry")
            entries.append(copy)


class JsonFileLedgerStore:
    """One JSON file {metric: [entries]}; an exclusive flock guards each append
    and the file is replaced atomically (a crash never leaves half a ledger).

    ``create=False`` (what the command line uses): a missing file is a
    LedgerMissingError, never an empty ledger — a mistyped path must not read
    as "nothing spent yet". ``init()`` starts a new, empty ledger file.
    """

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        self.create = create
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    def init(self) -> None:
        """Create the file as an empty ledger; LedgerCorruptError if it already exists."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(self.path, "x", encoding="utf-8") as fh:
                fh.write("{}\n")
        except FileExistsError:
            raise LedgerCorruptError(
                f"ledger file {self.path} already exists: not starting a new one"
            ) from None

    def _read(self) -> dict[str, list[dict[str, Any]]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if not self.create:
                raise LedgerMissingError(f"ledger file {self.path} does not exist") from None
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise LedgerCorruptError(f"cannot read ledger file {self.path}: {exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LedgerCorruptError(f"ledger file {self.path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
            raise LedgerCorruptError(f"ledger file {self.path} must map metric names to lists")
        return data

    def load(self, metric: str) -> list[dict[str, Any]]:
        return list(self._read().get(metric, []))

    def metrics(self) -> list[str]:
        """Every metric with an entry, sorted."""
        return sorted(self._read())

    def append(self, metric: str, entry: dict[str, Any], expected_length: int) -> None:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                data = self._read()
                entries = data.setdefault(metric, [])
                if len(entries) != expected_length:
                    raise ConcurrentUpdateError(f"ledger of {metric!r} changed; retry")
                entries.append(entry)
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".")
                try:
                    with os.fdopen(fd, "w", encoding="utf-8") as fh:
                        json.dump(data, fh, indent=1, sort_keys=True)
                        fh.flush()
                        os.fsync(fh.fileno())
                    os.replace(tmp, self.path)
                except BaseException:
                    Path(tmp).unlink(missing_ok=True)
                    raise
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


class RedisLedgerStore:
    """A Redis list per metric; WATCH/MULTI makes the append a compare-and-append."""

    def __init__(self, client: Any, prefix: str = "crowdmix:ledger:") -> None:
        self._redis = client
        self._prefix = prefix

    def _key(self, metric: str) -> str:
        return f"{self._prefix}{{{metric}}}"

    def load(self, metric: str) -> list[dict[str, Any]]:
        out = []
        for raw in self._redis.lrange(self._key(metric), 0, -1):
            try:
                out.append(json.loads(raw))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise LedgerCorruptError(f"ledger entry of {metric!r} is not JSON: {exc}") from None
        return out

    def append(self, metric: str, entry: dict[str, Any], expected_length: int) -> None:
        import redis

        key = self._key(metric)
        with self._redis.pipeline() as pipe:
            try:
                pipe.watch(key)
                if pipe.llen(key) != expected_length:
                    raise ConcurrentUpdateError(f"ledger of {metric!r} changed; retry")
                pipe.multi()
                pipe.rpush(key, json.dumps(entry, sort_keys=True))
                pipe.execute()
            except redis.WatchError:
                raise ConcurrentUpdateError(f"ledger of {metric!r} changed; retry") from None
