"""``crowdmix aggregator serve`` as a real process: health, SIGTERM, mTLS. Its exit codes
for bad input are in tests/e2e/test_bad_input.py, with every other subcommand's."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from crowdmix.aggregator.daemon.service import batch_to_proto
from crowdmix.cluster import DaemonProcess, free_port
from crowdmix.health import check_health
from crowdmix.protos import crowdmix_pb2_grpc
from tests.service.helpers import REGISTRY_TOML, now_window, random_batch, write_registry
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


def aggregator(tmp_path: Path, *extra: str, config: Path | None = None) -> DaemonProcess:
    if config is None:
        config, _ = write_registry(tmp_path)
    port = free_port()
    return DaemonProcess(
        "aggregator",
        ["aggregator", "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}", *extra],
        port,
        tmp_path / "aggregator.log",
    )


def test_serve_answers_health_writes_its_port_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    # the config may carry the shuffler's own [shuffler] table: it is not a metric
    config = tmp_path / "shared.toml"
    config.write_text(REGISTRY_TOML + '\n[shuffler]\nlisten = "127.0.0.1:0"\n')
    port_file = tmp_path / "port"
    d = aggregator(tmp_path, "--port-file", str(port_file), "--metrics-port", "0", config=config)
    d.start()
    try:
        d.wait_healthy(30)
        # The file is written just after the server starts answering: a reader waits for it.
        eventually(port_file.exists, 10)
        assert int(port_file.read_text()) == d.port
        assert check_health(d.target, service="crowdmix.v2.Aggregator") == "SERVING"
        d.signal(signal.SIGTERM)
        assert d.proc is not None
        assert d.proc.wait(timeout=30) == 0
        assert "aggregator stopped" in d.tail_log()
    finally:
        d.kill()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["bash", str(ROOT / "deploy/tls/make-certs.sh"), str(out), "localhost", "127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out


def test_mtls_admits_only_clients_with_a_certificate_from_the_ca(
    tmp_path: Path, certs: Path
) -> None:
    _, registry = write_registry(tmp_path)
    d = aggregator(
        tmp_path,
        "--tls-cert", str(certs / "aggregator.crt"),
        "--tls-key", str(certs / "aggregator.key"),
        "--tls-client-ca", str(certs / "ca.crt"),
    )  # fmt: skip
    d.start()
    ca = (certs / "ca.crt").read_bytes()
    batch = batch_to_proto(
        random_batch(np.random.default_rng(1), registry["pages"], 20, now_window(registry))
    )
    try:
        deadline = time.monotonic() + 30
        with_cert = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(certs / "shuffler-client.key").read_bytes(),
            certificate_chain=(certs / "shuffler-client.crt").read_bytes(),
        )
        while True:  # wait for the server to listen
            with grpc.secure_channel(d.target, with_cert) as channel:
                try:
                    resp = crowdmix_pb2_grpc.AggregatorStub(channel).Ingest(batch, timeout=5)
                    break
                except grpc.RpcError:
                    if time.monotonic() > deadline or not d.alive():
                        raise
                    time.sleep(0.2)
        assert resp.applied == 20
        without_cert = grpc.ssl_channel_credentials(root_certificates=ca)
        with grpc.secure_channel(d.target, without_cert) as channel:
            with pytest.raises(grpc.RpcError) as info:
                crowdmix_pb2_grpc.AggregatorStub(channel).Ingest(batch, timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with grpc.insecure_channel(d.target) as channel, pytest.raises(grpc.RpcError):
            crowdmix_pb2_grpc.AggregatorStub(channel).Ingest(batch, timeout=5)
        assert d.stop() == 0
    finally:
        d.kill()
