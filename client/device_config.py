"""What ``Shuffler.GetConfig`` serves a device: metrics with their params, and keys.

``DeviceConfig`` is the domain value; ``to_proto`` / ``from_proto`` are the one
place it meets the wire (the shuffler builds the answer with the first, the SDK
reads it with the second). ``from_proto`` rebuilds each metric's params and
refuses an answer whose advertised fingerprint differs from the one the params
give here (an SDK and a server that would disagree byte for byte).

Importing this module loads protobuf (``protos``); ``import client`` does not.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from crowdmix.client.basic import BasicParams
from crowdmix.client.errors import ParamsError
from crowdmix.client.histogram import HistogramParams
from crowdmix.client.params import RapporParams
from crowdmix.client.registry import MIN_WINDOW_SECONDS, MetricConfig, Registry
from crowdmix.client.sealed import PROTOCOL_VERSION, PublicKeyConfig, PublicKeySet
from crowdmix.protos import crowdmix_pb2 as pb

__all__ = [
    "DEFAULT_CACHE_SECONDS",
    "DEFAULT_WINDOW_SECONDS",
    "DeviceConfig",
    "from_proto",
    "to_proto",
]

#: How long a device may use one answer (a stale key is refused and refetched anyway).
DEFAULT_CACHE_SECONDS = 3600
#: The registry's default collection window (``Registry.window_seconds``).
DEFAULT_WINDOW_SECONDS = 86400


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
        h.update(f"|window:{self.window_seconds}".encode())
        if self.plaintext:
            h.update(b"|plaintext")
        for name in sorted(self.metrics):
            fp, age = self.metrics[name].fingerprint, self.disposal_seconds.get(name, 0)
            h.update(f"|{name}:{fp:016x}:{age}".encode())
        return h.hexdigest()[:16]

    @classmethod
    def of(
        cls,
        registry: Registry,
        keys: PublicKeySet,
        cache_seconds: int = DEFAULT_CACHE_SECONDS,
        *,
        plaintext: bool = False,
    ) -> DeviceConfig:
        return cls(
            plaintext=plaintext,
            metrics=dict(registry.metrics),
            keys=keys,
            cache_seconds=cache_seconds,
            window_seconds=registry.window_seconds,
            disposal_seconds={
                name: math.ceil(m.shuffle.disposal_days * 86400)
                for name, m in registry.metrics.items()
            },
        )


def _metric_to_proto(m: MetricConfig, disposal_seconds: int) -> pb.MetricInfo:
    info = pb.MetricInfo(
        name=m.name,
        encoding=m.encoding,
        params_fingerprint=m.fingerprint,
        report_bytes=m.report_bytes,
        disposal_seconds=disposal_seconds,
    )
    if m.rappor is not None:
        r = m.rappor
        info.rappor.CopyFrom(
            pb.RapporConfig(k=r.k, h=r.h, m=r.m, f=r.f, p=r.p, q=r.q, hashing=m.hashing)
        )
    elif m.histogram is not None:
        h = m.histogram
        info.histogram.CopyFrom(
            pb.HistogramConfig(
                domain_size=h.domain_size,
                fake_slots=h.fake_slots,
                fake_probability=h.fake_probability,
                local_epsilon=h.local_epsilon or 0.0,
                domain=list(m.domain or ()),
            )
        )
    else:
        assert m.basic is not None  # MetricConfig guarantees one of the three
        info.basic.CopyFrom(
            pb.BasicConfig(
                epsilon=m.basic.epsilon,
                domain_size=m.basic.domain_size,
                domain=list(m.domain or ()),
            )
        )
    return info


def to_proto(config: DeviceConfig, names: list[str] | None = None) -> pb.ConfigResponse:
    """The GetConfig answer; ``names`` restricts the metrics (unknown names are left out)."""
    chosen = sorted(config.metrics) if not names else [n for n in names if n in config.metrics]
    return pb.ConfigResponse(
        version=config.version,
        cache_seconds=config.cache_seconds,
        metrics=[
            _metric_to_proto(config.metrics[n], config.disposal_seconds.get(n, 0)) for n in chosen
        ],
        keys=[
            pb.PublicKey(
                key_id=k.key_id,
                suite=k.suite,
                public_key=k.public_key,
                not_before=k.not_before,
                not_after=k.not_after or 0,
            )
            for k in config.keys.keys
        ],
        protocol=PROTOCOL_VERSION,
        window_seconds=config.window_seconds,
        plaintext=config.plaintext,
    )


def _metric_from_proto(info: pb.MetricInfo) -> MetricConfig:
    kind = info.WhichOneof("params")
    if kind == "rappor":
        r = info.rappor
        metric = MetricConfig(
            name=info.name,
            rappor=RapporParams(k=r.k, h=r.h, m=r.m, f=r.f, p=r.p, q=r.q),
            hashing=r.hashing or "mmh3",  # type: ignore[arg-type]
        )
    elif kind == "basic":
        b = info.basic
        metric = MetricConfig(
            name=info.name,
            basic=BasicParams(
                mechanism=info.encoding,  # type: ignore[arg-type]
                epsilon=b.epsilon,
                domain_size=b.domain_size,
            ),
            domain=tuple(b.domain) or None,
        )
    elif kind == "histogram":
        hc = info.histogram
        metric = MetricConfig(
            name=info.name,
            histogram=HistogramParams(
                domain_size=hc.domain_size,
                fake_slots=hc.fake_slots,
                fake_probability=hc.fake_probability,
                local_epsilon=hc.local_epsilon or None,
            ),
            domain=tuple(hc.domain) or None,
        )
    else:
        raise ParamsError(f"metric {info.name!r}: the config carries no params")
    if metric.fingerprint != info.params_fingerprint:
        raise ParamsError(
            f"metric {info.name!r}: the served fingerprint {info.params_fingerprint:#018x} "
            f"is not that of the served params ({metric.fingerprint:#018x})"
        )
    return metric


def from_proto(message: pb.ConfigResponse) -> DeviceConfig:
    """The answer as a ``DeviceConfig``; ``ParamsError`` when it is inconsistent."""
    if message.protocol != PROTOCOL_VERSION:
        raise ParamsError(f"unsupported sealing protocol version {message.protocol}")
    if message.window_seconds and message.window_seconds < MIN_WINDOW_SECONDS:
        # the device claims one report per metric per window: a server must not be able
        # to draw one every second (each basic report composes; see client.privacy)
        raise ParamsError(
            f"window_seconds {message.window_seconds} is below the shortest collection "
            f"window ({MIN_WINDOW_SECONDS} s)"
        )
    metrics = {m.name: _metric_from_proto(m) for m in message.metrics}
    keys = PublicKeySet(
        tuple(
            PublicKeyConfig(
                key_id=k.key_id,
                suite=k.suite,
                public_key=k.public_key,
                not_before=k.not_before,
                not_after=k.not_after or None,
            )
            for k in message.keys
        )
    )
    return DeviceConfig(
        metrics=metrics,
        keys=keys,
        cache_seconds=message.cache_seconds,
        # an older shuffler does not say: the registry's default window
        window_seconds=message.window_seconds or DEFAULT_WINDOW_SECONDS,
        disposal_seconds={
            m.name: m.disposal_seconds for m in message.metrics if m.disposal_seconds
        },
        plaintext=message.plaintext,
    )
