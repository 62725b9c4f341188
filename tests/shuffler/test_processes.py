"""Real `crowdmix shuffler serve` processes on one real Redis, a real gRPC aggregator."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.redis_store import RedisStore
from tests.shuffler.helpers import RAPPOR, REGISTRY_TOML, RecordingAggregator, make_registry
from tests.shuffler.test_pipeline import columns_request, ids_of, wait_for

FP = make_registry().metrics[RAPPOR].fingerprint


class ShufflerProcess:
    def __init__(self, tmp: Path, name: str, config: Path, redis_url: str, aggregator: str) -> None:
        self.port_file = tmp / f"{name}.port"
        self.log = (tmp / f"{name}.log").open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "crowdmix", "shuffler", "serve", "--allow-unauthenticated",
                "--config", str(config),
                "--redis", redis_url,
                "--listen", "127.0.0.1:0",
                "--aggregator", aggregator,
                "--port-file", str(self.port_file),
                "--grace", "3",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"shuffler did not start: {self.logs(tmp, name)}")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text())
        self.tmp, self.name = tmp, name

    @staticmethod
    def logs(tmp: Path, name: str) -> str:
        return (tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=30)
        self.log.close()
        return code


@pytest.fixture
def procs() -> Iterator[list[ShufflerProcess]]:
    started: list[ShufflerProcess] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


def write_config(tmp: Path, *, min_batch: int, max_batch: int, max_delay: float) -> Path:
    path = tmp / "metrics.toml"
    path.write_text(
        REGISTRY_TOML.format(min_batch=min_batch, max_batch=max_batch, max_delay=max_delay)
    )
    return path


def test_two_processes_on_one_redis_never_share_a_report(
    tmp_path: Path,
    redis_url: str,
    aggregator: RecordingAggregator,
    procs: list[ShufflerProcess],
) -> None:
    config = write_config(tmp_path, min_batch=500, max_batch=1500, max_delay=0.02)
    for name in ("a", "b"):
        procs.append(ShufflerProcess(tmp_path, name, config, redis_url, aggregator.target))
    n = 40_000
    channels = [grpc.insecure_channel(f"127.0.0.1:{p.port}") for p in procs]
    stubs = [crowdmix_pb2_grpc.ShufflerStub(ch) for ch in channels]
    futures = [
        stubs[i % 2].Submit.future(columns_request(np.arange(i, i + 1000), FP), timeout=30)
        for i in range(0, n, 1000)
    ]
    assert sum(f.result().accepted for f in futures) == n
    for ch in channels:
        ch.close()
    store = RedisStore(redis_url)

    def settled() -> bool:
        pending = sum(store.pending(RAPPOR).values())
        return pending < 500 and aggregator.total() + pending == n

    wait_for(settled, timeout=60)
    forwarded = np.concatenate([ids_of(b.chunk) for b in aggregator.all_reports()])
    assert len(np.unique(forwarded)) == len(forwarded)  # no report in two batches
    assert np.isin(forwarded, np.arange(n)).all()
    assert min(b.chunk.count for b in aggregator.all_reports()) >= 500
    assert [p.stop(signal.SIGTERM) for p in procs] == [0, 0]  # graceful exit
    assert store.inflight_ids(RAPPOR) == []
    store.close()


def test_sigkill_then_restart_forwards_every_acknowledged_report(
    tmp_path: Path,
    redis_url: str,
    aggregator: RecordingAggregator,
    procs: list[ShufflerProcess],
) -> None:
    config = write_config(tmp_path, min_batch=1000, max_batch=2500, max_delay=0.05)
    aggregator.fail_next = 10**9  # the aggregator is down: the first batch stays in flight
    procs.append(ShufflerProcess(tmp_path, "first", config, redis_url, aggregator.target))
    n = 10_000
    with grpc.insecure_channel(f"127.0.0.1:{procs[0].port}") as ch:
        stub = crowdmix_pb2_grpc.ShufflerStub(ch)
        for i in range(0, n, 1000):
            assert stub.Submit(columns_request(np.arange(i, i + 1000), FP), timeout=30).accepted
    store = RedisStore(redis_url)
    # generous deadlines: on a loaded 2-core box the retries' backoff and a daemon's
    # start can take tens of seconds (seen failing at 30 s under load 6-9)
    wait_for(lambda: len(store.inflight_ids(RAPPOR)) == 1 and aggregator.calls >= 2, 120)
    assert procs[0].stop(signal.SIGKILL) == -signal.SIGKILL
    assert aggregator.total() == 0
    aggregator.fail_next = 0  # the aggregator is back
    procs.append(ShufflerProcess(tmp_path, "second", config, redis_url, aggregator.target))
    wait_for(lambda: aggregator.total() == n, timeout=120)
    forwarded = np.sort(np.concatenate([ids_of(b.chunk) for b in aggregator.all_reports()]))
    assert np.array_equal(forwarded, np.arange(n))
    assert procs[1].stop() == 0
    assert store.pending(RAPPOR) == {} and store.inflight_ids(RAPPOR) == []
    logs = ShufflerProcess.logs(tmp_path, "second")
    assert "re-forwarding in-flight batch" in logs
    store.close()


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_processes_share_one_port_and_stop_together(
    tmp_path: Path, redis_url: str, aggregator: RecordingAggregator
) -> None:
    config = write_config(tmp_path, min_batch=100, max_batch=1000, max_delay=0.05)
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "crowdmix", "shuffler", "serve", "--allow-unauthenticated",
            "--config", str(config),
            "--redis", redis_url, "--listen", "127.0.0.1:0", "--aggregator", aggregator.target,
            "--port-file", str(port_file), "--processes", "2",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: port_file.exists(), timeout=30)
        port = int(port_file.read_text())
        wait_for(lambda: len(_children(proc.pid)) == 1, timeout=30)
        (child,) = _children(proc.pid)
        n = 0
        for i in range(20):  # separate connections, spread by the kernel over both processes
            ch = grpc.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
            )
            ids = np.arange(i * 100, (i + 1) * 100)
            deadline = time.monotonic() + 20
            while True:  # the sibling may still be starting: UNAVAILABLE is retried
                try:
                    stub = crowdmix_pb2_grpc.ShufflerStub(ch)
                    n += stub.Submit(columns_request(ids, FP), timeout=10).accepted
                    break
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            ch.close()
        assert n == 2000
        wait_for(lambda: aggregator.total() == 2000, timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        wait_for(lambda: not Path(f"/proc/{child}").exists() or _zombie(child), timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_stream_refused_after_stored_messages_answers_with_the_stored_count(
    tmp_path: Path,
    redis_url: str,
    aggregator: RecordingAggregator,
    procs: list[ShufflerProcess],
) -> None:
    """SubmitStream [10 ok, 10 ok, 1 bad]: INVALID_ARGUMENT (the bad message's reason)
    whose details and trailing metadata say 20 reports of 2 messages were stored, and
    the store holds exactly those 20."""
    config = write_config(tmp_path, min_batch=1000, max_batch=2000, max_delay=60)
    procs.append(ShufflerProcess(tmp_path, "a", config, redis_url, aggregator.target))
    bad = columns_request(np.arange(1), FP)
    bad.columns[0].report_bytes += 1  # wrong length
    messages = [columns_request(np.arange(10), FP), columns_request(np.arange(10, 20), FP), bad]
    with grpc.insecure_channel(f"127.0.0.1:{procs[0].port}") as ch:
        stub = crowdmix_pb2_grpc.ShufflerStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitStream(iter(messages), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert details.startswith("stored 20 report(s) of 2 message(s) before this failure; ")
    assert "bit_length" in details
    trailing = dict(err.value.trailing_metadata() or ())
    assert (trailing["crowdmix-stored-reports"], trailing["crowdmix-stored-messages"]) == (
        "20",
        "2",
    )
    store = RedisStore(redis_url)
    assert sum(store.pending(RAPPOR).values()) == 20
    store.close()
    assert procs[0].stop() == 0
