"""GetConfig and the published keys, on a real in-process shuffler (gRPC on loopback)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest

from crowdmix.aggregator.sealing.keys import write_public_config
from crowdmix.client.errors import TransportError
from crowdmix.client.report import Report
from crowdmix.client.transport import ShufflerClient
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.config_service import ConfigService
from crowdmix.shuffler.errors import ConfigError
from crowdmix.shuffler.server import start_shuffler
from tests.shuffler.helpers import RAPPOR, make_registry, write_keys


def test_get_config_serves_params_and_public_keys_and_follows_the_file(tmp_path: Path) -> None:
    keys, private, public = write_keys(tmp_path)
    registry = make_registry()
    settings = ShufflerSettings(public_keys=str(public), config_cache_seconds=120)
    with start_shuffler(registry, settings=settings) as shuffler:
        sender = ShufflerClient(f"127.0.0.1:{shuffler.port}")
        config = sender.config()
        assert config.cache_seconds == 120
        assert set(config.metrics) == set(registry.metrics)
        for name, metric in registry.metrics.items():  # params rebuilt, fingerprints equal
            assert config.metrics[name].fingerprint == metric.fingerprint
        assert [k.public_key for k in config.keys.keys] == [k.public_key for k in keys.keys]
        assert private.read_text() not in str(config)  # nothing private is served
        # a rotation published to the file is served without a restart
        later = int(time.time()) + 5  # (a key rotated in its first second stays one more)
        rotated, new = keys.rotate(later)
        write_public_config(public, rotated, now=later)
        time.sleep(1.1)  # re-read at most once a second
        again = sender.config(refresh=True)
        assert [k.key_id for k in again.keys.keys] == [new.key_id]
        assert again.version != config.version
        # an unknown metric asked for by name is refused, with the reason
        stub = crowdmix_pb2_grpc.ShufflerStub(grpc.insecure_channel(f"127.0.0.1:{shuffler.port}"))
        with pytest.raises(grpc.RpcError) as info:
            stub.GetConfig(pb.GetConfigRequest(metrics=["nope"]), timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        sender.close(flush=False)


def test_a_private_key_file_is_refused_as_public_keys(tmp_path: Path) -> None:
    _, private, _ = write_keys(tmp_path)
    with pytest.raises(ConfigError, match="public key"):
        start_shuffler(make_registry(), settings=ShufflerSettings(public_keys=str(private)))


def test_no_sender_sends_clear_reports_unless_told_to(tmp_path: Path) -> None:
    registry = make_registry()
    fp = registry[RAPPOR].fingerprint
    nb = registry[RAPPOR].report_bytes
    report = Report(metric=RAPPOR, cohort=0, bits=bytes(nb), params_fingerprint=fp)
    with start_shuffler(registry) as shuffler:
        target = f"127.0.0.1:{shuffler.port}"
        for strict in (
            ShufflerClient(target),  # sealed by default: no downgrade
            ShufflerClient(target, sealing="required"),
        ):
            # GetConfig says why there is no key: this shuffler takes clear reports only
            assert strict.config().plaintext is True and strict.config().keys.keys == ()
            strict.submit(report)
            with pytest.raises(TransportError, match="takes clear reports only"):
                strict.flush()
            assert (strict.sent, strict.failed, strict.refetches) == (0, 1, 1)
            strict.close(flush=False)
        plain = ShufflerClient(target, sealing="off")  # said explicitly
        plain.submit(report)
        assert plain.flush() == 1 and plain.sealed == 0
        plain.close()
    _, _, public = write_keys(tmp_path)
    with start_shuffler(registry, settings=ShufflerSettings(public_keys=str(public))) as shuffler:
        sealed = ShufflerClient(f"127.0.0.1:{shuffler.port}")
        assert sealed.config().plaintext is False and sealed.config().keys.keys
        sealed.submit(report)
        assert sealed.flush() == 1 and sealed.sealed == 1
        sealed.close()
        # a clear report to a shuffler that publishes keys is refused with the reason
        off = ShufflerClient(f"127.0.0.1:{shuffler.port}", sealing="off")
        off.submit(report)
        with pytest.raises(TransportError, match="sealing_required"):
            off.flush()
        off.close(flush=False)
    assert os.stat(public).st_mode & 0o777 == 0o644


def test_config_service_stamps_every_answer_with_its_clock() -> None:
    now = [1_728_000_000.0]
    T = now[0]
    service = ConfigService(make_registry(), None, clock=lambda: now[0])
    raw = pb.GetConfigRequest().SerializeToString()
    assert service.answer(raw).server_time == T
    now[0] = T + 7.5
    assert service.answer(raw).server_time == T + 7.5  # the cached answer is not reused as is
    named = pb.GetConfigRequest(metrics=["browser"]).SerializeToString()
    assert service.answer(named).server_time == T + 7.5


def test_get_config_serves_the_window_tolerance_the_shuffler_applies() -> None:
    settings = ShufflerSettings(window_tolerance=2)
    with start_shuffler(make_registry(), settings=settings) as shuffler:
        sender = ShufflerClient(f"127.0.0.1:{shuffler.port}", sealing="off")
        assert sender.config().window_tolerance == 2 == shuffler.intake.windows.tolerance
        sender.close(flush=False)
