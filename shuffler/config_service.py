"""Sealed reports at the shuffler: the published keys it checks, and ``GetConfig``.

The shuffler never holds a private key. It reads the aggregator's *public* key config
(``crowdmix keys export``) and re-reads it when the file changes (at most once per
``check_seconds``, on use), so a key rotation needs no restart; a file that is not a
public key config is refused at start-up. With keys it takes sealed reports only
(``sealing_required`` for a clear one) and learns the metric, key id and length, never
the report; without keys (plaintext setups, google/rappor imports, benchmarks) clear
reports only. Sealed reports travel through the store as opaque fixed-length rows in the
ordinary chunk format (``crowdmix.shuffler.columns``): key id in the cohort column, the
sealed value in the bits column, no report ids (inside the seal), in a queue whose
fingerprint is ``SEALED_QUEUE[suite]``. ``RoundFile``: the heavy-hitter rounds per
window (``crowdmix.core.rounds``), re-read like the keys; ``GetConfig`` serves each
heavy-hitters metric's rounds of the windows around the current one.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from crowdmix.core.device_config import DEFAULT_CACHE_SECONDS, DeviceConfig, to_proto
from crowdmix.core.errors import ParamsError
from crowdmix.core.registry import MetricConfig, Registry
from crowdmix.core.rounds import RoundBook, ServedRound, WatchedRounds
from crowdmix.core.sealed import SUITES, PublicKeyConfig, PublicKeySet
from crowdmix.core.watched_file import WatchedFile
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.shuffler.errors import ConfigError, InvalidRequest

__all__ = [
    "SEALED_QUEUE",
    "SEALED_SUITE_OF_QUEUE",
    "ConfigService",
    "PublishedKeys",
    "RoundFile",
    "is_sealed_queue",
]

log = logging.getLogger("crowdmix.shuffler")

# Queue "fingerprints" of sealed reports, one per suite (suites differ in length).
# A real params fingerprint (64 bits of BLAKE2b) equal to one of these has
# probability 2^-63; the registry check would refuse such a clear report anyway.
SEALED_QUEUE: Final[Mapping[str, int]] = {
    name: 0x5EA1ED0000000000 | i for i, name in enumerate(SUITES, start=1)
}
SEALED_SUITE_OF_QUEUE: Final[Mapping[int, str]] = {fp: s for s, fp in SEALED_QUEUE.items()}


def is_sealed_queue(fingerprint: int) -> bool:
    return fingerprint in SEALED_SUITE_OF_QUEUE


def _read_public(path: Path) -> PublicKeySet:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"public key file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"public key file {path} is not UTF-8 JSON") from None
    try:
        return PublicKeySet.from_json(text)
    except ParamsError as exc:
        raise ConfigError(
            f"public key file {path}: {exc} (write it with 'crowdmix keys export')"
        ) from None


class PublishedKeys:
    """The aggregator's public keys from a file, re-read when the file changes."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        check_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._file = WatchedFile(
            path, _read_public, "public keys", log=log, check_seconds=check_seconds,
            monotonic=monotonic,
        )  # fmt: skip
        self.path = self._file.path
        self._clock = clock
        if not self._file.value.keys:
            raise ConfigError(f"public key file {self.path} lists no key")

    def refresh(self, *, force: bool = False) -> None:
        self._file.refresh(force=force)

    @property
    def keys(self) -> PublicKeySet:
        return self._file.value

    def accepted(self, key_id: int) -> PublicKeyConfig | None:
        """The key a sealed report may name: published and not past its end."""
        key = next((k for k in self.keys.keys if k.key_id == key_id), None)
        if key is None or (key.not_after is not None and self._clock() >= key.not_after):
            return None
        return key


class RoundFile(WatchedRounds):
    """The heavy-hitter round file, looked at on use at most once per ``check_seconds``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        check_seconds: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            path, error=ConfigError, log=log, check_seconds=check_seconds, monotonic=monotonic
        )

    @property
    def book(self) -> RoundBook:
        return self.value

    def round_of(self, metric: MetricConfig, window: int) -> ServedRound | None:
        return self.book.round_of(metric.name, metric.fingerprint, window)


def _fits(name: str, metric: MetricConfig, served: ServedRound) -> bool:
    assert metric.heavy_hitters is not None  # windowed metrics are heavy hitters
    try:
        served.params(metric.heavy_hitters)
    except ParamsError as exc:
        log.warning(
            "metric %r: not serving round %d of the round file: %s", name, served.round, exc
        )
        return False
    return True


class ConfigService:
    """Answers GetConfig from the registry and the published keys (cached per version)."""

    def __init__(
        self,
        registry: Registry,
        keys: PublishedKeys | None,
        *,
        cache_seconds: int = DEFAULT_CACHE_SECONDS,
        window_tolerance: int = 1,
        clock: Callable[[], float] = time.time,
        rounds: RoundFile | None = None,
    ) -> None:
        self.registry = registry
        self.keys = keys
        self.rounds = rounds
        self.cache_seconds = cache_seconds
        self.window_tolerance = window_tolerance
        # the clock the store files reports by: every answer carries its reading
        self._clock = clock
        self._cached: tuple[str, pb.ConfigResponse] | None = None

    def served_rounds(self, window: int) -> dict[str, tuple[ServedRound, ...]]:
        """Per heavy-hitters metric, its rounds of windows ``window - 1`` to ``window + 1``
        (a device near a window's edge finds its own). A round that does not fit its
        metric's params is left out (and logged): devices refuse a whole config holding one."""
        if self.rounds is None:
            return {}
        book = self.rounds.book
        return {
            name: tuple(
                r
                for r in book.rounds(name, m.fingerprint)
                if abs(r.window - window) <= 1 and _fits(name, m, r)
            )
            for name, m in self.registry.metrics.items()
            if m.windowed
        }

    def config(self, window: int | None = None) -> DeviceConfig:
        keys = self.keys.keys if self.keys is not None else PublicKeySet(())
        if window is None:
            window = self.registry.window_of(self._clock())
        # no key file: clear reports only, and the answer says so (SDKs can name it)
        return DeviceConfig.of(
            self.registry,
            keys,
            self.cache_seconds,
            plaintext=self.keys is None,
            window_tolerance=self.window_tolerance,
            rounds=self.served_rounds(window),
        )

    def answer(self, raw: bytes) -> pb.ConfigResponse:
        try:
            request = pb.GetConfigRequest.FromString(raw)
        except Exception:  # DecodeError; one status for anything unparsable
            raise InvalidRequest("malformed", "the request is not a GetConfigRequest") from None
        unknown = [n for n in request.metrics if n not in self.registry.metrics]
        if unknown:
            raise InvalidRequest("unknown_metric", f"unknown metric {unknown[0][:128]!r}")
        config = self.config(self.registry.window_of(self._clock()))
        if request.metrics:
            answer = to_proto(config, list(request.metrics))
        else:
            cached = self._cached
            version = config.version
            if cached is None or cached[0] != version:
                cached = self._cached = (version, to_proto(config))
            answer = pb.ConfigResponse()
            answer.CopyFrom(cached[1])
        # read last, as close to the reply as possible: the device's server time starts here
        now = self._clock()
        answer.server_time = now
        answer.window = self.registry.window_of(now)
        return answer
