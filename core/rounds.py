"""The round file of heavy-hitter discoveries: which round's params each window serves.

The aggregator's round job (``crowdmix discover``) writes it, the shuffler reads it
(re-read when it changes) and serves, per heavy-hitters metric, the round whose
window it is (``GetConfig``); a device encodes against that round for that window.
JSON, written whole by rename: ``{"metrics": {NAME: {"fingerprint": HEX16, "rounds":
[ROUND, ...]}}}``, a prefix round ``{"round", "window", "opened", "epsilon", "start",
"stop", "seeds", "buckets"}``, the value round ``{"round", "window", "opened",
"epsilon", "candidates": [...]}`` (``opened``: round 0's window, naming the discovery).
Rounds have increasing windows and are never rewritten (a window's reports were encoded
against what it served). A report carries its round's fingerprint
(``ServedRound.fingerprint``), so shufflers and the aggregator refuse one encoded against
another round. Why a file: docs/design.md, "Heavy hitters through the pipeline".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from crowdmix.core.discovery import (
    MAX_EPSILON,
    MIN_EPSILON,
    HeavyHittersParams,
    PrefixRound,
    ValueRound,
)
from crowdmix.core.errors import ParamsError
from crowdmix.core.watched_file import WatchedFile

__all__ = ["RoundBook", "ServedRound", "read_rounds", "write_rounds"]

_ROUND_TAG = b"crowdmix/round/v1\x00"
_ROUND_FIELDS = struct.Struct("<3Id5I")
_U32 = 0xFFFFFFFF


def _check_discovery(metric: str, rounds: tuple[ServedRound, ...]) -> None:
    """One discovery's rounds: indexes 0, 1, ... under one ``opened`` (round 0's window)
    in increasing windows, so each device (one round, ``device_round``) reports once."""
    for i, r in enumerate(rounds):
        if r.round != i:
            raise ParamsError(
                f"metric {metric!r}: round {r.round} is listed where round {i} belongs"
            )
        if r.opened != rounds[0].window:
            raise ParamsError(
                f"metric {metric!r}: round {i} names opened={r.opened}, not its discovery's "
                f"first window {rounds[0].window}"
            )
        if i and r.window <= rounds[i - 1].window:
            raise ParamsError(
                f"metric {metric!r}: round {i} must have a later window than {rounds[i - 1].window}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedRound:
    """One round as served: its index, window, its discovery's first window
    (``opened``) and local ε0, and either a prefix round's span, seeds and buckets or
    the value round's candidates."""

    round: int
    window: int
    opened: int
    epsilon: float
    start: int = 0
    stop: int = 0
    seeds: int = 0
    buckets: int = 0
    candidates: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return "value" if self.candidates else "prefix"

    def params(self, metric: HeavyHittersParams) -> PrefixRound | ValueRound:
        """The round's params for ``metric`` (``ParamsError`` when they do not fit it)."""
        if self.candidates:
            if self.round != len(metric.spans):
                raise ParamsError(f"round {self.round} is not the value round")
            return ValueRound(
                symbols=metric.symbols, epsilon=self.epsilon, candidates=self.candidates
            )
        r = self.round
        if not 0 <= r < len(metric.spans) or (self.start, self.stop) != (
            metric.spans[r - 1] if r else 0,
            metric.spans[r],
        ):
            raise ParamsError(
                f"round {r} does not extend prefixes from {self.start} to {self.stop}"
            )
        return PrefixRound(
            symbols=metric.symbols,
            start=self.start,
            stop=self.stop,
            epsilon=self.epsilon,
            seeds=self.seeds,
            buckets=self.buckets,
        )

    @classmethod
    def of(cls, r: int, window: int, opened: int, params: PrefixRound | ValueRound) -> ServedRound:
        if isinstance(params, ValueRound):
            return cls(
                round=r,
                window=window,
                opened=opened,
                epsilon=params.epsilon,
                candidates=params.candidates,
            )
        return cls(
            round=r,
            window=window,
            opened=opened,
            epsilon=params.epsilon,
            start=params.start,
            stop=params.stop,
            seeds=params.seeds,
            buckets=params.buckets,
        )

    def fingerprint(self, metric_fingerprint: int) -> int:
        """The round's fingerprint, which its reports carry instead of the metric's:
        BLAKE2b-64 (little-endian) of ``b"crowdmix/round/v1\\0"`` ‖ the metric's
        fingerprint (u64) ‖ round, window, opened (u32) ‖ ε (f64) ‖ start, stop, seeds,
        buckets, the number of candidates (u32) ‖ each candidate's UTF-8 length (u32)
        and bytes; every integer little-endian, every field as served."""
        h = hashlib.blake2b(digest_size=8)
        h.update(_ROUND_TAG + metric_fingerprint.to_bytes(8, "little"))
        h.update(
            _ROUND_FIELDS.pack(
                self.round, self.window, self.opened, self.epsilon, self.start,
                self.stop, self.seeds, self.buckets, len(self.candidates),
            )
        )  # fmt: skip
        for c in self.candidates:
            raw = c.encode()
            h.update(len(raw).to_bytes(4, "little") + raw)
        return int.from_bytes(h.digest(), "little")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "round": self.round,
            "window": self.window,
            "opened": self.opened,
            "epsilon": self.epsilon,
        }
        if self.candidates:
            out["candidates"] = list(self.candidates)
        else:
            out.update(start=self.start, stop=self.stop, seeds=self.seeds, buckets=self.buckets)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ServedRound:
        if not isinstance(data, dict):
            raise ParamsError(f"a round must be an object, got {data!r}")
        known = {"round", "window", "opened", "epsilon", "start", "stop", "seeds", "buckets"}
        known.add("candidates")
        unknown = set(data) - known
        if unknown:
            raise ParamsError(f"unknown round field(s) {sorted(unknown)}")
        for key in ("round", "window", "opened", "epsilon"):
            if key not in data:
                raise ParamsError(f"a round needs {key}")
        ints = ("round", "window", "opened", "start", "stop", "seeds", "buckets")
        for key in ints:
            v = data.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _U32:
                raise ParamsError(f"round field {key} must be an integer in [0, {_U32}], got {v!r}")
        eps = data["epsilon"]
        if (
            isinstance(eps, bool)
            or not isinstance(eps, int | float)
            or not MIN_EPSILON <= eps <= MAX_EPSILON  # NaN fails too
        ):
            raise ParamsError(
                f"round field epsilon must be a number in [2^-48, {MAX_EPSILON}], got {eps!r}"
            )
        cands = data.get("candidates", [])
        if not isinstance(cands, list) or not all(isinstance(c, str) for c in cands):
            raise ParamsError("round field candidates must be a list of strings")
        if not cands and "stop" not in data:
            raise ParamsError("a round needs candidates (value round) or start/stop (prefix)")
        return cls(
            **{k: data[k] for k in ints if k in data},
            epsilon=float(eps),
            candidates=tuple(cands),
        )


@dataclass(frozen=True, slots=True)
class RoundBook:
    """Every heavy-hitters metric's served rounds: name → (fingerprint, rounds)."""

    metrics: dict[str, tuple[int, tuple[ServedRound, ...]]] = field(default_factory=dict)

    def rounds(self, metric: str, fingerprint: int) -> tuple[ServedRound, ...]:
        """The metric's rounds, if they were planned for these params (else none)."""
        entry = self.metrics.get(metric)
        if entry is None or entry[0] != fingerprint:
            return ()
        return entry[1]

    def round_of(self, metric: str, fingerprint: int, window: int) -> ServedRound | None:
        """The round served in ``window``, or None."""
        for r in self.rounds(metric, fingerprint):
            if r.window == window:
                return r
        return None

    def round_fingerprint(self, metric: str, fingerprint: int, window: int) -> int | None:
        """The fingerprint a report of ``window`` carries (``ServedRound.fingerprint``),
        or None when the window serves no round."""
        served = self.round_of(metric, fingerprint, window)
        return None if served is None else served.fingerprint(fingerprint)

    def with_round(self, metric: str, fingerprint: int, served: ServedRound) -> RoundBook:
        """This book with ``served`` appended (a new discovery if the params changed):
        refused unless it is the next round, in a later window."""
        entry = self.metrics.get(metric)
        rounds = entry[1] if entry is not None and entry[0] == fingerprint else ()
        if served.round == 0:
            # a new discovery of this metric replaces the old one, after every window it
            # served (whatever its params): a device may hold that window's round cached
            last = entry[1][-1].window if entry is not None and entry[1] else None
            if last is not None and served.window <= last:
                raise ParamsError(
                    f"metric {metric!r}: a new discovery must open in a later window than "
                    f"{last} (a served window is never rewritten)"
                )
            rounds = ()
        elif (
            not rounds or rounds[-1].round != served.round - 1 or rounds[-1].opened != served.opened
        ):
            raise ParamsError(f"metric {metric!r}: round {served.round} does not follow")
        if rounds and served.window <= rounds[-1].window:
            raise ParamsError(
                f"metric {metric!r}: round {served.round} must have a later window than "
                f"{rounds[-1].window} (a served window is never rewritten)"
            )
        _check_discovery(metric, (*rounds, served))
        metrics = dict(self.metrics)
        metrics[metric] = (fingerprint, (*rounds, served))
        return RoundBook(metrics)

    def to_dict(self) -> dict[str, Any]:
        return {
            "metrics": {
                name: {"fingerprint": f"{fp:016x}", "rounds": [r.to_dict() for r in rounds]}
                for name, (fp, rounds) in sorted(self.metrics.items())
            }
        }

    @classmethod
    def from_dict(cls, data: Any) -> RoundBook:
        if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
            raise ParamsError('not a round file (no "metrics" object)')
        metrics = {}
        for name, entry in data["metrics"].items():
            try:
                fp = int(entry["fingerprint"], 16)
                rounds = tuple(ServedRound.from_dict(r) for r in entry["rounds"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ParamsError(f"metric {name!r}: {exc}") from None
            _check_discovery(name, rounds)
            metrics[name] = (fp, rounds)
        return cls(metrics)


def read_rounds(path: str | os.PathLike[str], *, missing_ok: bool = True) -> RoundBook:
    """The round file at ``path`` (an empty book when it does not exist yet, unless
    ``missing_ok`` is false); ``ParamsError`` naming the file when it cannot be read."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        if not missing_ok:
            raise ParamsError(f"round file {p} is gone") from None
        return RoundBook()
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsError(f"round file {p}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return RoundBook.from_dict(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ParamsError(f"round file {p} is not JSON: {exc}") from None
    except ParamsError as exc:
        raise ParamsError(f"round file {p}: {exc}") from None


def write_rounds(path: str | os.PathLike[str], book: RoundBook) -> None:
    """Write ``book`` whole: a temporary file renamed over ``path`` (readers see the
    old file or the new one, never a part)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(book.to_dict(), fh, indent=1)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, p)


class WatchedRounds(WatchedFile[RoundBook]):
    """The round file at ``path`` as the shuffler and the aggregator hold it: none yet is
    no round; re-read when it changes; a file that cannot be read, or is gone between the
    look and the read, keeps the last good book. At start-up a file that cannot be read
    raises ``error`` (the daemon's ``ConfigError``)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        error: Callable[[str], Exception],
        log: logging.Logger,
        check_seconds: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        def first(p: Path) -> RoundBook:
            try:
                return read_rounds(p)
            except ParamsError as exc:
                raise error(str(exc)) from None

        super().__init__(
            path, partial(read_rounds, missing_ok=False), "heavy-hitter rounds", log=log,
            check_seconds=check_seconds, monotonic=monotonic, first=first,
        )  # fmt: skip
