"""What a device reads from ``Shuffler.GetConfig``: the answer as a ``DeviceConfig``.

``from_proto`` is the device's side of ``crowdmix.core.device_config`` (the shuffler
builds the answer with its ``to_proto``): it rebuilds each metric's params and
refuses an answer whose advertised fingerprint differs from the one the params give
here (an SDK and a server that would disagree byte for byte), of another protocol,
or with a window below the registry's shortest. Importing it loads protobuf.
"""

from __future__ import annotations

from crowdmix.core.basic import BasicParams
from crowdmix.core.device_config import DEFAULT_WINDOW_TOLERANCE, DeviceConfig, value_of
from crowdmix.core.discovery import HeavyHittersParams
from crowdmix.core.errors import ParamsError
from crowdmix.core.histogram import HistogramParams
from crowdmix.core.params import RapporParams
from crowdmix.core.registry import MIN_WINDOW_SECONDS, MetricConfig
from crowdmix.core.rounds import ServedRound
from crowdmix.core.sealed import PROTOCOL_VERSION, PublicKeyConfig, PublicKeySet
from crowdmix.protos import crowdmix_pb2 as pb

__all__ = ["from_proto"]


def _metric_from_proto(info: pb.MetricInfo) -> MetricConfig:
    kind = info.WhichOneof("params")
    if kind == "rappor":
        rappor = value_of(RapporParams, info.rappor)
        hashing = info.rappor.hashing or "mmh3"
        metric = MetricConfig(name=info.name, rappor=rappor, hashing=hashing)  # type: ignore[arg-type]
    elif kind == "basic":
        basic = value_of(BasicParams, info.basic, mechanism=info.encoding)
        metric = MetricConfig(name=info.name, basic=basic, domain=tuple(info.basic.domain) or None)
    elif kind == "histogram":
        hc = info.histogram
        histogram = value_of(HistogramParams, hc, local_epsilon=hc.local_epsilon or None)
        metric = MetricConfig(name=info.name, histogram=histogram, domain=tuple(hc.domain) or None)
    elif kind == "heavy_hitters":
        hh = value_of(HeavyHittersParams, info.heavy_hitters)
        metric = MetricConfig(name=info.name, heavy_hitters=hh)
    else:
        raise ParamsError(f"metric {info.name!r}: the config carries no params")
    if metric.fingerprint != info.params_fingerprint:
        raise ParamsError(
            f"metric {info.name!r}: the served fingerprint {info.params_fingerprint:#018x} "
            f"is not that of the served params ({metric.fingerprint:#018x})"
        )
    return metric


def _rounds_from_proto(info: pb.MetricInfo, metric: MetricConfig) -> tuple[ServedRound, ...]:
    """A heavy-hitters metric's served rounds, each checked against its params."""
    assert metric.heavy_hitters is not None
    rounds = tuple(value_of(ServedRound, r) for r in info.heavy_hitters.rounds)
    for r in rounds:
        try:
            r.params(metric.heavy_hitters)
        except ParamsError as exc:
            raise ParamsError(f"metric {info.name!r}: served round {r.round}: {exc}") from None
    if len({r.window for r in rounds}) != len(rounds):
        raise ParamsError(f"metric {info.name!r}: two served rounds name one window")
    return rounds


def from_proto(message: pb.ConfigResponse) -> DeviceConfig:
    """The answer as a ``DeviceConfig``; ``ParamsError`` when it is inconsistent."""
    if message.protocol != PROTOCOL_VERSION:
        raise ParamsError(f"unsupported sealing protocol version {message.protocol}")
    if message.window_seconds < MIN_WINDOW_SECONDS:
        # the device claims one report per metric per window: a server must not be able
        # to draw one every second (each basic report composes; see crowdmix.core.privacy)
        raise ParamsError(
            f"window_seconds {message.window_seconds} is below the shortest collection "
            f"window ({MIN_WINDOW_SECONDS} s)"
        )
    metrics = {m.name: _metric_from_proto(m) for m in message.metrics}
    rounds = {
        m.name: _rounds_from_proto(m, metrics[m.name])
        for m in message.metrics
        if metrics[m.name].heavy_hitters is not None
    }
    keys = PublicKeySet(
        tuple(value_of(PublicKeyConfig, k, not_after=k.not_after or None) for k in message.keys)
    )
    return DeviceConfig(
        metrics=metrics,
        keys=keys,
        cache_seconds=message.cache_seconds,
        window_seconds=message.window_seconds,
        disposal_seconds={
            m.name: m.disposal_seconds for m in message.metrics if m.disposal_seconds
        },
        plaintext=message.plaintext,
        # absent (an answer from before the field): the shuffler's default, not proto3's 0
        window_tolerance=(
            message.window_tolerance
            if message.HasField("window_tolerance")
            else DEFAULT_WINDOW_TOLERANCE
        ),
        rounds=rounds,
    )
