"""The device's durable outbox: claimed reports until the shuffler acknowledges them.

One SQLite file in the app's directory holds ``claims`` (per metric, the last window
claimed and the last ``settled``: its report left the outbox), ``outbox`` (every claimed,
unacknowledged report: id, metric, window, cohort, params fingerprint, encoded bits),
``config`` (the last ``GetConfig`` answer, its clock offset) and ``counters``. Each
promise is one transaction (``BEGIN IMMEDIATE``, WAL, ``synchronous=FULL``): ``claim``
allows at most one report per (metric, window), windows move forward, claim and
report(s) written together or not at all; ``acknowledged`` deletes rows only once the
shuffler acknowledged them; ``withdraw`` deletes a report named in a window not begun and
moves the claim back to the last window waiting or settled. Bounded (``max_reports``,
``max_bytes``: when full, ``FULL``). Another schema version (``SCHEMA_VERSION``) is
refused. Only encoded (randomized) reports are stored, never values; deleted rows are
zeroed (``secure_delete``), the WAL truncated after every delete. docs/design.md, "Client".
"""

from __future__ import annotations

import contextlib
import enum
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crowdmix.client.errors import CrowdmixClientError
from crowdmix.client.report import Report, make_report

__all__ = ["SCHEMA_VERSION", "Claim", "Outbox", "OutboxError", "PendingReport"]

#: The outbox file's schema (``PRAGMA user_version``); any other is refused.
SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE claims (
    metric TEXT PRIMARY KEY,
    window INTEGER NOT NULL,
    window_seconds INTEGER NOT NULL,
    settled_window INTEGER,
    settled_seconds INTEGER
);
CREATE TABLE outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    report_id BLOB NOT NULL UNIQUE,
    metric TEXT NOT NULL,
    window INTEGER NOT NULL,
    window_seconds INTEGER NOT NULL,
    cohort INTEGER NOT NULL,
    fingerprint INTEGER NOT NULL,
    bits BLOB NOT NULL
);
CREATE INDEX outbox_group ON outbox(metric, window);
CREATE TABLE config (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    answer BLOB NOT NULL,
    fetched REAL NOT NULL,
    offset REAL NOT NULL
);
CREATE TABLE counters (
    name TEXT PRIMARY KEY,
    n INTEGER NOT NULL
);
"""
#: Bytes a row costs beyond its bits (report id, window, cohort, ... ; for the bound only).
ROW_OVERHEAD = 64
_U64 = 1 << 64
_SELECT = "SELECT report_id, metric, window, window_seconds, cohort, fingerprint, bits FROM outbox"


class OutboxError(CrowdmixClientError):
    """The outbox file cannot be opened, read or written, or has another schema version."""


class Claim(enum.Enum):
    """What ``Outbox.claim`` did."""

    MADE = "made"  # claimed and queued, one transaction
    USED = "used"  # this window (or a later one) has its report already
    FULL = "full"  # the outbox is at its bound: nothing claimed, nothing queued


@dataclass(frozen=True, slots=True)
class PendingReport:
    """One row of the outbox: a report, the window it was claimed in and that
    window's length (a window index means nothing without it)."""

    report: Report
    window: int
    window_seconds: int


def _signed(fp: int) -> int:
    """A u64 fingerprint as SQLite's signed 64-bit integer (and back with ``% 2**64``)."""
    return fp - _U64 if fp >= 1 << 63 else fp


def _marks(n: int) -> str:
    return ",".join("?" * n)


class Outbox:
    """The SQLite outbox at ``path`` (created, 0600, on first use)."""

    def __init__(
        self, path: str | os.PathLike[str], *, max_reports: int = 1000, max_bytes: int = 1 << 20
    ) -> None:
        for name, v in (("max_reports", max_reports), ("max_bytes", max_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.path = Path(path)
        self.max_reports = max_reports
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA secure_delete=ON")
        except (OSError, sqlite3.Error) as exc:
            raise OutboxError(f"cannot open the outbox {self.path}: {exc}") from None
        self._tx(self._check_schema)

    def _check_schema(self, db: sqlite3.Connection) -> None:
        """Make the tables in a new file; refuse a file of another schema version."""
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version == SCHEMA_VERSION:
            return
        if version == 0 and not db.execute("SELECT 1 FROM sqlite_master").fetchone():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        made_by = "an unreleased SDK (no version)" if version == 0 else f"schema version {version}"
        raise OutboxError(
            f"the outbox {self.path} was written by {made_by}; this SDK reads schema version "
            f"{SCHEMA_VERSION} only (move the file away to start afresh)"
        )

    # -- transactions ---------------------------------------------------------

    def _tx(self, body: Callable[[sqlite3.Connection], object]) -> object:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    result = body(self._db)
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
                return result
            except sqlite3.Error as exc:
                raise OutboxError(f"outbox {self.path}: {exc}") from None

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        """A read outside a transaction, its failure an ``OutboxError`` like every other."""
        with self._lock:
            try:
                return list(self._db.execute(sql, args).fetchall())
            except sqlite3.Error as exc:
                raise OutboxError(f"outbox {self.path}: {exc}") from None

    @staticmethod
    def _add(db: sqlite3.Connection, name: str, n: int) -> None:
        if n:
            db.execute(
                "INSERT INTO counters(name, n) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET n = n + excluded.n",
                (name, n),
            )

    # -- claiming -------------------------------------------------------------

    def claim(
        self,
        metric: str,
        window: int,
        window_seconds: int,
        make: Callable[[], Report | Sequence[Report]],
    ) -> Claim:
        """If ``metric`` has no report in ``window`` (of ``window_seconds``) or in a
        window ending after it begins: call ``make()`` (encode) and store its report —
        or its group: a shuffled histogram's real report and its fakes — with the claim,
        in one transaction. ``make`` raising stores nothing. The bounds count every row
        of a group; a group that does not fit is refused whole (``outbox_full``).

        Windows compare by the time they cover, so a new window length neither
        reopens the time of a claimed window nor blocks the metric for good."""

        def body(db: sqlite3.Connection) -> Claim:
            row = db.execute(
                "SELECT window, window_seconds FROM claims WHERE metric = ?", (metric,)
            ).fetchone()
            if row is not None and window * window_seconds < (row[0] + 1) * row[1]:
                return Claim.USED
            n, size = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(bits) + LENGTH(metric)), 0) FROM outbox"
            ).fetchone()
            made = make()
            reports = [made] if isinstance(made, Report) else list(made)
            if not reports:
                raise ValueError(f"metric {metric!r}: the encoder made no report")
            cost = sum(len(r.bits) + len(metric.encode()) + ROW_OVERHEAD for r in reports)
            if (
                n + len(reports) > self.max_reports
                or size + n * ROW_OVERHEAD + cost > self.max_bytes
            ):
                self._add(db, "outbox_full", 1)
                return Claim.FULL
            db.executemany(
                "INSERT INTO outbox(report_id, metric, window, window_seconds, cohort,"
                " fingerprint, bits) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (r.report_id, metric, window, window_seconds, r.cohort,
                     _signed(r.params_fingerprint), r.bits)
                    for r in reports
                ],
            )  # fmt: skip
            db.execute(
                "INSERT INTO claims(metric, window, window_seconds) VALUES (?, ?, ?) "
                "ON CONFLICT(metric) DO UPDATE SET window = excluded.window,"
                " window_seconds = excluded.window_seconds",
                (metric, window, window_seconds),
            )
            return Claim.MADE

        result = self._tx(body)
        assert isinstance(result, Claim)
        return result

    def last_window(self, metric: str) -> tuple[int, int] | None:
        """The window last claimed for ``metric`` and its length, or None."""
        rows = self._read("SELECT window, window_seconds FROM claims WHERE metric = ?", (metric,))
        return None if not rows else (int(rows[0][0]), int(rows[0][1]))

    # -- sending --------------------------------------------------------------

    def _rows(self, where: str, args: Sequence[Any]) -> list[PendingReport]:
        return [
            PendingReport(make_report(metric, cohort, bits, fp % _U64, rid), w, ws)
            for rid, metric, w, ws, cohort, fp, bits in self._read(f"{_SELECT} {where}", args)
        ]

    def pending(self) -> list[PendingReport]:
        """Every waiting report, oldest first."""
        return self._rows("ORDER BY seq", ())

    def next_group(self, skip: Iterable[tuple[str, int]] = ()) -> list[PendingReport]:
        """The oldest report's group: every waiting row of its metric and window, in the
        order made (one report, or a shuffled histogram's real report and fakes: sent in
        one request, never split), leaving out the (metric, window) groups in ``skip``.
        Empty when nothing (else) waits."""
        skipped = list(skip)
        unless = ""
        if skipped:
            unless = (
                " WHERE (metric, window) NOT IN (VALUES "
                + ",".join(["(?, ?)"] * len(skipped))
                + ")"
            )
        return self._rows(
            "WHERE (metric, window) = (SELECT metric, window FROM outbox"
            f"{unless} ORDER BY seq LIMIT 1) ORDER BY seq",
            [v for group in skipped for v in group],
        )

    def __len__(self) -> int:
        return int(self._read("SELECT COUNT(*) FROM outbox")[0][0])

    def acknowledged(self, report_ids: Sequence[bytes]) -> int:
        """The shuffler acknowledged these rows: delete them, and count as ``delivered``
        the rows deleted here (another process on the app dir may have deleted some)."""
        return self._delete(report_ids, "delivered")

    def drop(self, report_ids: Iterable[bytes], reason: str) -> int:
        """Delete rows that will never be delivered, counted under ``reason``."""
        return self._delete(list(report_ids), reason)

    def withdraw(self, report_ids: Iterable[bytes]) -> int:
        """Delete rows whose window never began on the server (a wall clock set forward
        named it), counted as ``window_ahead``, and move each metric's claim back to the
        latest window of its rows still waiting or settled (its report left the outbox
        otherwise): no report of a window after that was ever accepted, so the metric
        can be reported in its right window, still at most once per window."""
        return self._delete(list(report_ids), "window_ahead", withdrawn=True)

    def _delete(self, report_ids: Sequence[bytes], counter: str, withdrawn: bool = False) -> int:
        def body(db: sqlite3.Connection) -> int:
            marks = _marks(len(report_ids))
            gone = db.execute(
                f"SELECT DISTINCT metric, window, window_seconds FROM outbox"
                f" WHERE report_id IN ({marks})",
                list(report_ids),
            ).fetchall()
            n = db.execute(
                f"DELETE FROM outbox WHERE report_id IN ({marks})", list(report_ids)
            ).rowcount
            self._add(db, counter, n)
            if withdrawn:
                for metric in {m for m, _, _ in gone}:
                    self._move_claim_back(db, metric)
            else:  # these windows may have reached a shuffler: never claimed again
                for metric, w, ws in gone:
                    db.execute(
                        "UPDATE claims SET settled_window = ?, settled_seconds = ?"
                        " WHERE metric = ? AND (settled_window IS NULL"
                        " OR (settled_window + 1) * settled_seconds < ?)",
                        (w, ws, metric, (w + 1) * ws),
                    )
            return int(n)

        if not report_ids:
            return 0
        deleted = self._tx(body)
        self._checkpoint()
        assert isinstance(deleted, int)
        return deleted

    @staticmethod
    def _move_claim_back(db: sqlite3.Connection, metric: str) -> None:
        """The claim of ``metric`` := the latest window (by its end) of its rows still
        waiting and of its settled window; none: no claim."""
        held = db.execute(
            "SELECT w, ws FROM (SELECT window AS w, window_seconds AS ws FROM outbox"
            " WHERE metric = ? UNION ALL SELECT settled_window, settled_seconds FROM claims"
            " WHERE metric = ? AND settled_window IS NOT NULL)"
            " ORDER BY (w + 1) * ws DESC LIMIT 1",
            (metric, metric),
        ).fetchone()
        if held is None:
            db.execute("DELETE FROM claims WHERE metric = ?", (metric,))
        else:
            db.execute(
                "UPDATE claims SET window = ?, window_seconds = ? WHERE metric = ?",
                (held[0], held[1], metric),
            )

    def _checkpoint(self) -> None:
        """Fold the WAL into the database and truncate it: with ``secure_delete`` the
        deleted rows' bytes are then zeroed in the file and gone from the WAL."""
        # best effort: a failed checkpoint is retried by the next delete
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def count(self, name: str) -> None:
        """Count one event under ``name`` (a report the app asked for and got none)."""
        self._tx(lambda db: self._add(db, name, 1))

    def counters(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self._read("SELECT name, n FROM counters")}

    # -- the cached config ----------------------------------------------------

    def cached_config(self) -> tuple[bytes, float, float] | None:
        """The last stored GetConfig answer, when it arrived (device Unix seconds) and
        the server's clock offset it gave (server − device seconds)."""
        rows = self._read("SELECT answer, fetched, offset FROM config WHERE id = 1")
        return None if not rows else (bytes(rows[0][0]), float(rows[0][1]), float(rows[0][2]))

    def store_config(self, answer: bytes, fetched: float, offset: float) -> None:
        self._tx(
            lambda db: db.execute(
                "INSERT INTO config(id, answer, fetched, offset) VALUES (1, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET answer = excluded.answer,"
                " fetched = excluded.fetched, offset = excluded.offset",
                (answer, fetched, offset),
            )
        )

    def close(self) -> None:
        with self._lock:
            self._db.close()
