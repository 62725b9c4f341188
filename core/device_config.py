"""What ``Shuffler.GetConfig`` serves a device: metrics with their params, and keys.

``DeviceConfig`` is the domain value; ``to_proto`` builds the answer the shuffler
serves (``crowdmix.client.device_config.from_proto`` reads it on the device: the two
are the one place it meets the wire, tested both ways). Importing this module loads
protobuf (``crowdmix.protos``); ``import crowdmix.client`` does not.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from google.protobuf.message import Message

from crowdmix.core.registry import MetricConfig, Registry
from crowdmix.core.rounds import ServedRound
from crowdmix.core.sealed import PROTOCOL_VERSION, PublicKeySet
from crowdmix.protos import crowdmix_pb2 as pb

__all__ = [
    "DEFAULT_CACHE_SECONDS",
    "DEFAULT_WINDOW_SECONDS",
    "DEFAULT_WINDOW_TOLERANCE",
    "DeviceConfig",
    "message_of",
    "to_proto",
    "value_of",
]

V = TypeVar("V")
M = TypeVar("M", bound=Message)

#: How long a device may use one answer (a stale key is refused and refetched anyway).
DEFAULT_CACHE_SECONDS = 3600
#: The registry's default collection window (``Registry.window_seconds``).
DEFAULT_WINDOW_SECONDS = 86400
#: The shuffler's default ``window_tolerance``; also what a device reads from an answer
#: that does not carry the field (one from before it), never proto3's 0.
DEFAULT_WINDOW_TOLERANCE = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceConfig:
    """Per metric its config; the aggregator's public keys (empty: plaintext shuffler)."""

    metrics: dict[str, MetricConfig]
    keys: PublicKeySet
    cache_seconds: int = DEFAULT_CACHE_SECONDS
    #: the registry's collection window (a device claims one report per metric per window)
    window_seconds: int = DEFAULT_WINDOW_SECONDS
    #: per metric, the age past which the server disposes of a window's reports
    disposal_seconds: dict[str, int] = field(default_factory=dict)
    #: the shuffler says it takes clear reports only (started without public keys): an
    #: SDK that requires sealing can name the cause instead of waiting for a key
    plaintext: bool = False
    #: the shuffler takes the current window and this many before it (its setting)
    window_tolerance: int = DEFAULT_WINDOW_TOLERANCE
    #: per heavy-hitters metric, the rounds served around the current window (one per
    #: window; a report encodes against the round of its own window)
    rounds: dict[str, tuple[ServedRound, ...]] = field(default_factory=dict)

    def round_of(self, metric: str, window: int) -> ServedRound | None:
        """The round a heavy-hitters report of ``window`` encodes against, or None."""
        for r in self.rounds.get(metric, ()):
            if r.window == window:
                return r
        return None

    @property
    def sealed(self) -> bool:
        return bool(self.keys.keys)

    def why_unsealed(self, target: str) -> str:
        """Why a device that requires sealing cannot send to ``target`` now (no key)."""
        if self.plaintext:
            return (
                f"shuffler {target} takes clear reports only (it was started without the "
                "aggregator's public keys): reports that must be sealed are not sent to it"
            )
        return f"shuffler {target} publishes no aggregator key usable now"

    @property
    def version(self) -> str:
        h = hashlib.sha256(self.keys.version.encode())
        h.update(f"|window:{self.window_seconds}:{self.window_tolerance}".encode())
        if self.plaintext:
            h.update(b"|plaintext")
        for name in sorted(self.metrics):
            fp, age = self.metrics[name].fingerprint, self.disposal_seconds.get(name, 0)
            h.update(f"|{name}:{fp:016x}:{age}".encode())
            for r in self.rounds.get(name, ()):
                h.update(f"|round:{sorted(r.to_dict().items())!r}".encode())
        return h.hexdigest()[:16]

    @classmethod
    def of(
        cls,
        registry: Registry,
        keys: PublicKeySet,
        cache_seconds: int = DEFAULT_CACHE_SECONDS,
        *,
        plaintext: bool = False,
        window_tolerance: int = DEFAULT_WINDOW_TOLERANCE,
        rounds: dict[str, tuple[ServedRound, ...]] | None = None,
    ) -> DeviceConfig:
        return cls(
            plaintext=plaintext,
            window_tolerance=window_tolerance,
            rounds=dict(rounds or {}),
            metrics=dict(registry.metrics),
            keys=keys,
            cache_seconds=cache_seconds,
            window_seconds=registry.window_seconds,
            disposal_seconds={
                name: math.ceil(m.shuffle.disposal_days * 86400)
                for name, m in registry.metrics.items()
            },
        )


def message_of(message: type[M], value: Any, **extra: Any) -> M:
    """The wire ``message`` of a params value: its dataclass fields by their names (the
    message uses the same), those the message has; ``extra`` sets the rest."""
    names = message.DESCRIPTOR.fields_by_name
    kwargs = {f.name: getattr(value, f.name) for f in fields(value) if f.name in names}
    return message(**(kwargs | extra))


def value_of(cls: type[V], message: Message, **extra: Any) -> V:
    """``message_of`` read back: ``cls`` built from the fields of ``message`` with its
    field names (repeated ones as tuples); ``extra`` sets or overrides fields."""
    names = message.DESCRIPTOR.fields_by_name
    kwargs: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name in names:
            v = getattr(message, f.name)
            kwargs[f.name] = v if isinstance(v, str | bytes | int | float) else tuple(v)
    return cls(**(kwargs | extra))


def _metric_to_proto(
    m: MetricConfig, disposal_seconds: int, rounds: tuple[ServedRound, ...] = ()
) -> pb.MetricInfo:
    info = pb.MetricInfo(
        name=m.name,
        encoding=m.encoding,
        params_fingerprint=m.fingerprint,
        report_bytes=m.report_bytes,
        disposal_seconds=disposal_seconds,
    )
    domain = list(m.domain or ())
    if m.rappor is not None:
        info.rappor.CopyFrom(message_of(pb.RapporConfig, m.rappor, hashing=m.hashing))
    elif m.heavy_hitters is not None:
        info.heavy_hitters.CopyFrom(
            message_of(
                pb.HeavyHittersConfig,
                m.heavy_hitters,
                rounds=[message_of(pb.HeavyHittersRound, r) for r in rounds],
            )
        )
    elif m.histogram is not None:
        h = m.histogram
        info.histogram.CopyFrom(
            message_of(pb.HistogramConfig, h, local_epsilon=h.local_epsilon or 0.0, domain=domain)
        )
    else:
        assert m.basic is not None  # MetricConfig guarantees one of the three
        info.basic.CopyFrom(message_of(pb.BasicConfig, m.basic, domain=domain))
    return info


def to_proto(config: DeviceConfig, names: list[str] | None = None) -> pb.ConfigResponse:
    """The GetConfig answer; ``names`` restricts the metrics (unknown names are left out)."""
    chosen = sorted(config.metrics) if not names else [n for n in names if n in config.metrics]
    return pb.ConfigResponse(
        version=config.version,
        cache_seconds=config.cache_seconds,
        metrics=[
            _metric_to_proto(
                config.metrics[n], config.disposal_seconds.get(n, 0), config.rounds.get(n, ())
            )
            for n in chosen
        ],
        keys=[message_of(pb.PublicKey, k, not_after=k.not_after or 0) for k in config.keys.keys],
        protocol=PROTOCOL_VERSION,
        window_seconds=config.window_seconds,
        plaintext=config.plaintext,
        window_tolerance=config.window_tolerance,
    )
