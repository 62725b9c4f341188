"""The aggregator's settings: defaults < the registry file's ``[aggregator]`` table <
flags, an unknown or mistyped field refused by name, and a loud WARNING when a daemon
keeps its counts in memory. The table is used, not ignored: a real daemon started
with ``--config`` alone counts into the Redis the table names."""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from crowdmix.aggregator.daemon.service import batch_to_proto
from crowdmix.aggregator.daemon.settings import AggregatorSettings, load_config
from crowdmix.aggregator.errors import ConfigError
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.cli import main
from crowdmix.cluster import DaemonProcess, free_port
from crowdmix.protos import crowdmix_pb2_grpc
from tests.service.helpers import REGISTRY_TOML, now_window, random_batch, write_registry


def _config(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "metrics.toml"
    path.write_text(REGISTRY_TOML + "\n[aggregator]\n" + table)
    return path


def _cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, err.getvalue()


def test_the_table_overrides_the_defaults_and_flags_override_the_table(tmp_path: Path) -> None:
    path = _config(tmp_path, 'listen = "127.0.0.1:7600"\nworkers = 3\nkeys = "k.json"\n')
    registry, settings = load_config(path)
    assert set(registry.metrics) == {"pages", "browser"}
    assert (settings.listen, settings.workers, settings.keys) == ("127.0.0.1:7600", 3, "k.json")
    assert settings.open_workers == AggregatorSettings().open_workers  # not in the table
    _, flagged = load_config(path, {"listen": "127.0.0.1:0", "workers": None})
    assert (flagged.listen, flagged.workers) == ("127.0.0.1:0", 3)  # None: flag not given


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ("colour = 1\n", r"unknown field\(s\) \['colour'\]"),
        ("listen = 7500\n", r"listen \(--listen\) must be a string"),
        ("workers = 0\n", r"workers \(--workers\) must be an integer >= 1"),
        ('redis = "memory"\n', r"redis \(--redis\) must be a redis://"),
        ('redis = ""\n', r"redis \(--redis\) must be a redis://"),
        ("min_replicas_ack = 1\n", r"min_replicas_ack \(--min-replicas-ack\) needs redis"),
        ('tls_cert = "a.crt"\n', "tls_cert .* and tls_key .* go together"),
    ],
)
def test_a_bad_aggregator_table_is_refused_naming_the_field(
    tmp_path: Path, table: str, named: str
) -> None:
    path = _config(tmp_path, table)
    with pytest.raises(ConfigError, match=named):
        load_config(path)
    code, err = _cli("aggregator", "serve", "--config", str(path))
    assert code == 1 and "Traceback" not in err
    assert str(path) in err


def test_an_aggregator_table_that_is_not_a_table_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "metrics.toml"
    path.write_text('aggregator = "127.0.0.1:7500"\n' + REGISTRY_TOML)
    code, err = _cli("aggregator", "serve", "--config", str(path))
    assert code == 1 and "[aggregator] must be a table" in err


@pytest.mark.slow
def test_a_daemon_started_with_config_alone_counts_into_the_tables_redis(
    tmp_path: Path, redis_url: str
) -> None:
    port_file = tmp_path / "port"
    path = _config(
        tmp_path,
        f'listen = "127.0.0.1:0"\nredis = "{redis_url}"\nport_file = "{port_file}"\n',
    )
    registry, _ = load_config(path)
    d = DaemonProcess(
        "aggregator", ["aggregator", "serve", "--config", str(path)], 0, tmp_path / "a.log"
    )
    d.start()
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert d.alive(), d.tail_log()
            assert time.monotonic() < deadline, d.tail_log()
            time.sleep(0.05)
        d.port = int(port_file.read_text())
        d.wait_healthy(30)
        batch = random_batch(np.random.default_rng(3), registry["pages"], 25, now_window(registry))
        with grpc.insecure_channel(d.target) as channel:
            resp = crowdmix_pb2_grpc.AggregatorStub(channel).Ingest(
                batch_to_proto(batch), timeout=10
            )
        assert resp.applied == 25
        store = RedisCountStore.from_url(redis_url)
        try:
            stored = store.load("pages")
        finally:
            store.close()
        assert stored is not None and int(stored.totals.sum()) == 25
        assert d.stop() == 0
        log = d.log_path.read_text()
        assert "store redis" in log and "in-memory store" not in log
    finally:
        d.kill()


@pytest.mark.slow
def test_a_daemon_on_the_memory_store_warns_loudly(tmp_path: Path) -> None:
    config, _ = write_registry(tmp_path)
    port = free_port()
    d = DaemonProcess(
        "aggregator",
        ["aggregator", "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"],
        port,
        tmp_path / "a.log",
    )
    d.start()
    try:
        d.wait_healthy(30)
        assert d.stop() == 0
        warning = [line for line in d.log_path.read_text().splitlines() if "WARNING" in line]
        assert any("in-memory store: counts are lost" in line for line in warning), warning
    finally:
        d.kill()
