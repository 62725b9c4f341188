"""What a device reads from ``Shuffler.GetConfig``: the answer as a ``DeviceConfig``.

``from_proto`` is the device's side of ``crowdmix.core.device_config`` (the shuffler
builds the answer with its ``to_proto``): it rebuilds each metric's params and
refuses an answer whose advertised fingerprint differs from the one the params give
here (an SDK and a server that would disagree byte for byte), of another protocol,
or with a window below the registry's shortest. Importing it loads protobuf.
"""

from __future__ import annotations

from crowdmix.core.basic import BasicParams
from crowdmix.core.device_config import DEFAULT_WINDOW_TOLERANCE, DeviceConfig
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
    elif kind == "heavy_hitters":
        hh = info.heavy_hitters
        metric = MetricConfig(
            name=info.name,
            heavy_hitters=HeavyHittersParams(
                alphabet=hh.alphabet,
                max_length=hh.max_length,
                spans=tuple(hh.spans),
                keep=hh.keep,
                candidates=hh.candidates,
                seeds=hh.seeds,
                weights=tuple(hh.weights),
                epsilon=hh.epsilon,
                delta=hh.delta,
                devices=hh.devices,
            ),
        )
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
    rounds = tuple(
        ServedRound(
            round=r.round,
            window=r.window,
            opened=r.opened,
            epsilon=r.epsilon,
            start=r.start,
            stop=r.stop,
            seeds=r.seeds,
            buckets=r.buckets,
            candidates=tuple(r.candidates),
        )
        for r in info.heavy_hitters.rounds
    )
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
