"""Operators' commands (demo on Redis, counts list/export, one cluster per directory,
simulate and Ctrl-C), each through the real command or the real store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crowdmix.aggregator.counting.files import load_counts as load_counts_file
from crowdmix.aggregator.store import load_counts, open_store
from crowdmix.cluster import LocalCluster
from crowdmix.demo import METRIC, demo_redis_urls

ROOT = Path(__file__).resolve().parents[2]


def crowdmix(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "crowdmix"), *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_demo_redis_keeps_shuffler_and_aggregator_apart_and_refuses_a_used_store(
    tmp_path: Path, redis_url: str
) -> None:
    base = redis_url.rsplit("/", 1)[0] + "/3"
    shuffler_url, aggregator_url = demo_redis_urls(base)
    assert aggregator_url.endswith("/4")
    args = ("demo", "--clients", "3000", "--min-batch", "1000", "--out", str(tmp_path / "o"))
    first = crowdmix(*args, "--redis", base)
    assert first.returncode == 0, first.stderr
    # the counts are in the aggregator's database only; the shuffler's holds no counts
    assert load_counts(aggregator_url, METRIC).totals.sum() == 3000
    with pytest.raises(LookupError):
        load_counts(shuffler_url, METRIC)
    # a second run on the same databases is refused before it starts, with the way out
    second = crowdmix(*args, "--redis", base)
    assert second.returncode == 1 and "Traceback" not in second.stderr
    line = second.stderr.strip().splitlines()[-1]
    assert "already holds" in line and "database number" in line and "FLUSHDB" in line


def test_counts_list_and_export_a_file_report_reads(tmp_path: Path, redis_url: str) -> None:
    shuffler_url, aggregator_url = demo_redis_urls(redis_url.rsplit("/", 1)[0] + "/5")
    done = crowdmix("demo", "--clients", "2000", "--min-batch", "500", "--redis", shuffler_url,
                    "--out", str(tmp_path / "o"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    listed = crowdmix("counts", "list", "--redis", aggregator_url, "--json")
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)["metrics"]
    assert entry["metric"] == METRIC and entry["reports"] == 2000 and entry["batches"] >= 1
    assert entry["encoding"] == "rappor" and len(entry["windows"]) == 1
    out = tmp_path / "c.npz"
    exported = crowdmix("counts", "export", "--redis", aggregator_url, "--metric", METRIC,
                        "--out", str(out))  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    saved = load_counts_file(out)
    stored = load_counts(aggregator_url, METRIC)
    np.testing.assert_array_equal(saved.counts.totals, stored.totals)
    np.testing.assert_array_equal(saved.counts.ones, stored.ones)
    assert saved.window == entry["windows"][0] and saved.metric == METRIC
    text = crowdmix("counts", "list", "--redis", aggregator_url)
    assert METRIC in text.stdout and "2,000 reports" in text.stdout
    store = open_store(shuffler_url)  # the shuffler's database holds no counts
    try:
        assert store.metrics() == []
    finally:
        store.close()


def test_one_cluster_per_directory(tmp_path: Path) -> None:
    first = LocalCluster(tmp_path / "c", shufflers=1)
    try:
        with pytest.raises(ValueError, match="in use by another crowdmix cluster"):
            LocalCluster(tmp_path / "c", shufflers=1)
        # the command says so in one line, from another process
        second = crowdmix("cluster", "--dir", str(tmp_path / "c"), timeout=60)
        assert second.returncode == 1
        assert second.stderr.strip().splitlines()[-1].startswith("crowdmix: error: ")
        assert "in use" in second.stderr and "Traceback" not in second.stderr
    finally:
        first.stop()
    LocalCluster(tmp_path / "c", shufflers=1).stop()  # free again once the first stopped


def test_simulate_unary_stops_on_ctrl_c(tmp_path: Path) -> None:
    import signal
    import time

    from crowdmix.shuffler.config import ShufflerSettings
    from crowdmix.shuffler.memory_store import MemoryStore
    from crowdmix.shuffler.server import start_shuffler
    from tests.service.helpers import write_registry

    config, registry = write_registry(tmp_path)
    shuffler = start_shuffler(
        registry, MemoryStore(), None, listen="127.0.0.1:0", settings=ShufflerSettings()
    )
    try:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "crowdmix"), "simulate", "--target",
             f"127.0.0.1:{shuffler.port}", "--config", str(config), "--metric", "pages",
             "--mode", "unary", "--concurrency", "2", "--clients", "200000", "--plaintext"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60  # encoding the clients comes first
        while sum(shuffler.store.pending("pages").values()) == 0:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)  # not the minutes 200,000 unary calls take
        assert proc.returncode == 130 and "Traceback" not in err
        assert "interrupted" in err
        assert "\r" not in err  # no progress bar when stderr is not a terminal
    finally:
        shuffler.stop()


def test_simulate_stops_on_ctrl_c_while_every_sender_waits_on_a_silent_shuffler(
    tmp_path: Path,
) -> None:
    """A shuffler that takes connections and never answers: each of the 16 senders sits
    in a call that lasts its 10 s deadline, then retries. Ctrl-C must not wait for them
    (it once waited 5 s per sender in turn: 50 s here, more on a busy box)."""
    import signal
    import socket
    import time

    from tests.service.helpers import write_registry

    config, _ = write_registry(tmp_path)
    silent = socket.create_server(("127.0.0.1", 0))
    silent.settimeout(60)  # encoding the clients comes first
    held: list[socket.socket] = []
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "crowdmix"), "simulate", "--target",
         f"127.0.0.1:{silent.getsockname()[1]}", "--config", str(config), "--metric", "pages",
         "--mode", "unary", "--concurrency", "16", "--clients", "1000", "--plaintext"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        held.append(silent.accept()[0])  # the senders' channels share one connection
        time.sleep(2)  # every sender is in its first call by now
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)  # not the 50 s and more of waiting on senders
        assert proc.returncode == 130 and "Traceback" not in err
        assert "interrupted" in err
    finally:
        proc.kill()
        proc.communicate()
        for conn in held:
            conn.close()
        silent.close()
