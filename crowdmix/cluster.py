"""A local crowdmix cluster on loopback: N shufflers sharing one redis-server (AOF), one
aggregator with a redis-server of its own, a generated metric registry and tokens. With
``redis_cluster=True`` (``crowdmix cluster --redis-cluster``) a 3-master, 3-replica
Redis Cluster holds both stores instead, and several aggregators may run.

    with LocalCluster(workdir, shufflers=2) as cluster:
        cluster.shuffler_targets      # ["127.0.0.1:PORT", ...]
        cluster.token                 # bearer token for the shufflers
        cluster.registry_path         # the generated metric registry

``crowdmix cluster`` runs one in the foreground until SIGTERM/Ctrl-C (``deploy/launch.sh``
calls it). Everything binds 127.0.0.1, each process logs to ``workdir/<name>.log``, and
``stop()`` sends SIGTERM first (shufflers flush and forward), SIGKILL only past the grace
period. Two Redis instances: the aggregator must not read the shuffler's queues.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "DaemonProcess",
    "LocalCluster",
    "RedisClusterServers",
    "RedisServer",
    "free_port",
    "register",
    "write_demo_registry",
]


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Redis ``appendfsync`` modes offered (README "Durability of an acknowledgement").
FSYNC_MODES = ("everysec", "always")


class RedisServer:
    """``start()``, ``stop()``, ``kill()`` and ``restart()`` a private redis-server.

    With ``appendonly=True`` (AOF, fsync ``fsync``: "everysec" or "always") data
    survives a restart;
    ``stop()`` is a clean SHUTDOWN, ``kill()`` a SIGKILL.
    """

    def __init__(
        self,
        *,
        appendonly: bool = True,
        directory: str | None = None,
        fsync: str = "everysec",
        cluster_bus_port: int | None = None,
        node_timeout_ms: int = 1000,
    ) -> None:
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_MODES)}, got {fsync!r}")
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError(
                "redis-server is not installed: run scripts/bootstrap (it apt-get installs it)"
            )
        self.exe = exe
        self.appendonly = appendonly
        self.fsync = fsync
        self._own_dir = directory is None
        self.dir = Path(directory) if directory else Path(_mkdtemp("crowdmix-redis-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._started = False
        self.proc: subprocess.Popen[bytes] | None = None
        # a cluster node: its bus port is given (port + 10000 may be past 65535)
        self.cluster_bus_port = cluster_bus_port
        self.node_timeout_ms = node_timeout_ms

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        args = [
            self.exe,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.fsync,
            "--protected-mode", "no",
            "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        if self.cluster_bus_port is not None:
            args += [
                "--cluster-enabled", "yes",
                "--cluster-port", str(self.cluster_bus_port),
                "--cluster-config-file", str(self.dir / "nodes.conf"),
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # a replica takes over however long its master has been silent: the
                # failover test kills masters under load
                "--cluster-replica-validity-factor", "0",
            ]  # fmt: skip
        # a session of its own, as the daemons have: a Ctrl-C in the launcher's terminal
        # is the launcher's to handle (it stops everything in order), not Redis's to die of
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                if not self._started and "Address already in use" in log:
                    # another process took the free port between free_port() and the
                    # bind (parallel test workers, a client's ephemeral port): a first
                    # start may move; a restart keeps its port, which clients know
                    self.port = free_port()
                    self.start(timeout)
                    return
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {log}")
            if self.ping():
                self._started = True
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout}s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(b"SHUTDOWN\r\n")
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class RedisClusterServers:
    """A Redis Cluster on loopback: ``masters`` masters with ``replicas`` replicas each,
    one redis-server per node (AOF with ``fsync``), made with ``redis-cli --cluster
    create``. ``url`` is its ``redis+cluster://`` URL; ``kill_master(i)`` is a SIGKILL of
    one master, after which its replica takes over (node timeout ``node_timeout_ms``)."""

    def __init__(
        self,
        directory: str | Path,
        *,
        masters: int = 3,
        replicas: int = 1,
        fsync: str = "everysec",
        node_timeout_ms: int = 1000,
    ) -> None:
        if masters < 3:
            raise ValueError(f"a Redis Cluster needs at least 3 masters, got {masters}")
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed: run scripts/bootstrap")
        self.cli = cli
        self.dir = Path(directory)
        self.masters, self.replicas = masters, replicas
        self.fsync = fsync
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[RedisServer] = []

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 30.0) -> None:
        try:
            for i in range(self.masters * (1 + self.replicas)):
                node = RedisServer(
                    appendonly=True,
                    directory=str(self.dir / f"node-{i}"),
                    fsync=self.fsync,
                    cluster_bus_port=free_port(),
                    node_timeout_ms=self.node_timeout_ms,
                )
                node.start()
                self.nodes.append(node)
            create = subprocess.run(
                [self.cli, "--cluster", "create",
                 *(f"127.0.0.1:{n.port}" for n in self.nodes),
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                capture_output=True, text=True, timeout=timeout,
            )  # fmt: skip
            if create.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout[-2000:]}")
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise

    def _info(self, node: RedisServer, *command: str) -> str:
        out = subprocess.run(
            [self.cli, "-p", str(node.port), *command], capture_output=True, text=True, timeout=5
        )
        return out.stdout

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok`` and each slot range has a
        master with its replicas attached."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
            ok = all("cluster_state:ok" in self._info(n, "cluster", "info") for n in live)
            if ok:
                linked = sum(
                    "master_link_status:up" in self._info(n, "info", "replication") for n in live
                )
                if linked >= len(live) - self.masters:  # every replica left has synced
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the Redis Cluster did not reach cluster_state:ok in {timeout}s")

    def master_ports(self) -> list[int]:
        """Ports of the masters that serve slots, as the cluster sees itself now."""
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            ports = []
            for line in self._info(node, "cluster", "nodes").splitlines():
                fields = line.split()
                if len(fields) > 8 and "master" in fields[2] and "fail" not in fields[2]:
                    ports.append(int(fields[1].split("@")[0].rsplit(":", 1)[1]))
            if ports:
                return sorted(ports)
        return []

    def node_on(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def stop(self) -> None:
        """SIGTERM to every node at once (a master alone would wait for its replicas to
        catch up, up to 10 s), then SIGKILL what is left after 10 s."""
        live = [n.proc for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        for proc in live:
            proc.terminate()
        deadline = time.monotonic() + 10.0
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _mkdtemp(prefix: str) -> str:
    import tempfile

    return tempfile.mkdtemp(prefix=prefix)


@dataclass
class DaemonProcess:
    """One ``crowdmix`` daemon as a subprocess, logging to ``log_path``."""

    name: str
    args: list[str]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        env = dict(os.environ)
        env.update(self.env)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "crowdmix", *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a Ctrl-C in the launcher's terminal is ours to relay
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(
        self, timeout: float = 30.0, interrupted: Callable[[], bool] = lambda: False
    ) -> None:
        """Until the daemon answers SERVING; KeyboardInterrupt once ``interrupted()``."""
        from crowdmix.health import check_health

        deadline = time.monotonic() + timeout
        status = "not started"
        while time.monotonic() < deadline:
            if interrupted():
                raise KeyboardInterrupt
            if not self.alive():
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode if self.proc else '?'}; "
                    f"last log lines:\n{self.tail_log()}"
                )
            status = check_health(self.target, timeout=1.0)
            if status == "SERVING":
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"{self.name} not healthy after {timeout}s ({status}):\n{self.tail_log()}"
        )

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(timeout=10)

    def tail_log(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


DEMO_METRIC = "demo_values"
#: The metric of the README's SDK walkthrough (examples/daily_setting.py): k-RR over a
#: small known domain, so one app's report is meaningful on its own.
THEME_METRIC = "theme"
THEME_VALUES = ("light", "dark", "system")


def _lock_directory(workdir: Path) -> int | None:
    """An exclusive flock on ``workdir/cluster.lock``, held until ``_unlock``.

    ValueError when another process holds it."""
    import fcntl

    path = workdir / "cluster.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise ValueError(
            f"{workdir} is in use by another crowdmix cluster (pid {holder}): "
            "give each cluster its own --dir"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _has_heavy_hitters(registry_path: Path) -> bool:
    from crowdmix.core.registry import load_registry

    return any(m.heavy_hitters is not None for m in load_registry(registry_path).metrics.values())


def write_demo_registry(
    path: Path, *, min_batch: int = 1000, max_delay_seconds: float = 1.0
) -> Path:
    """A metric registry for a local cluster: a RAPPOR metric (``demo_values``, for
    ``crowdmix simulate``) and the k-RR ``theme`` metric the README's SDK walkthrough
    reports (``examples/daily_setting.py``)."""
    domain = ", ".join(f'"{v}"' for v in THEME_VALUES)
    path.write_text(
        "# Generated by crowdmix cluster: a RAPPOR metric for crowdmix simulate, and the\n"
        "# k-RR metric of the README's SDK walkthrough (examples/daily_setting.py).\n"
        f"[metrics.{DEMO_METRIC}]\n"
        'encoding = "rappor"\n'
        'hashing = "mmh3"\n'
        "k = 32\nh = 2\nm = 16\nf = 0.25\np = 0.25\nq = 0.75\n\n"
        f"[metrics.{DEMO_METRIC}.shuffle]\n"
        f"min_batch = {min_batch}\nmax_batch = 100000\nmax_delay_seconds = {max_delay_seconds}\n\n"
        f"[metrics.{THEME_METRIC}]\n"
        'encoding = "krr"\n'
        "epsilon = 2.0\n"
        f"domain = [{domain}]\n\n"
        f"[metrics.{THEME_METRIC}.shuffle]\n"
        f"min_batch = {min_batch}\nmax_delay_seconds = {max_delay_seconds}\n"
    )
    return path


class LocalCluster:
    """Redis (AOF) + ``shufflers`` shuffler processes + one aggregator, on loopback."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        shufflers: int = 2,
        registry_path: str | Path | None = None,
        min_batch: int = 1000,
        extra_shuffler_args: list[str] | None = None,
        extra_aggregator_args: list[str] | None = None,
        fsync: str = "everysec",
        sealed: bool = True,
        aggregators: int = 1,
        redis_cluster: bool = False,
        min_replicas_ack: int | None = None,
        http_allow_origins: list[str] | None = None,
    ) -> None:
        if shufflers < 1:
            raise ValueError(f"shufflers must be at least 1, got {shufflers}")
        if aggregators < 1:
            raise ValueError(f"aggregators must be at least 1, got {aggregators}")
        if min_replicas_ack is not None and min_replicas_ack < 0:
            raise ValueError(f"min_replicas_ack must be >= 0, got {min_replicas_ack}")
        self.workdir = Path(workdir)
        if self.workdir.exists() and not self.workdir.is_dir():
            raise ValueError(f"{workdir} is a file, not a directory")
        self.workdir.mkdir(parents=True, exist_ok=True)
        # One cluster per directory: a second one would share the AOF files and
        # overwrite the first one's token and registry.
        self._lock = _lock_directory(self.workdir)
        if registry_path is not None:
            from crowdmix.core.registry import load_registry

            try:
                load_registry(registry_path)  # a bad registry is found before anything starts
            except ValueError:
                self._unlock()
                raise
        self.num_shufflers = shufflers
        self.registry_path = (
            Path(registry_path)
            if registry_path is not None
            else write_demo_registry(self.workdir / "metrics.toml", min_batch=min_batch)
        )
        # A registry with a heavy-hitters metric: the shufflers serve the round file
        # here (``crowdmix discover open/step --rounds`` writes it; none yet: no round),
        # and the aggregator counts each window's reports against its round.
        self.rounds_path: Path | None = (
            self.workdir / "rounds.json" if _has_heavy_hitters(self.registry_path) else None
        )
        self.token = secrets.token_hex(
            24
        )  # hex: never starts with "-", so it is safe as a CLI argument
        self.tokens_path = self.workdir / "tokens.txt"
        self.tokens_path.write_text(f"local-cluster {self.token}\n")
        self.tokens_path.chmod(0o600)
        # what an app holds: the token alone (the shuffler's file names the app too)
        self.app_token_path = self.workdir / "app-token.txt"
        self.app_token_path.write_text(f"{self.token}\n")
        self.app_token_path.chmod(0o600)
        self.redis = RedisServer(
            appendonly=True, directory=str(self.workdir / "redis-shuffler"), fsync=fsync
        )
        # The aggregator's Redis fsyncs before every reply, whatever --fsync says: the
        # shuffler deletes a batch once the aggregator acknowledged it, so a batch applied
        # and then lost to a power failure would be lost for good. One fsync per batch.
        self.aggregator_redis = RedisServer(
            appendonly=True, directory=str(self.workdir / "redis-aggregator"), fsync="always"
        )
        # --redis-cluster: one Redis Cluster (3 masters, 3 replicas, AOF always, for the
        # aggregator's sake) holds both stores under their own key prefixes instead: a local
        # trial on one box. In production give the aggregator a cluster of its own (the
        # trust boundary above). WAIT for one replica by default there.
        self.cluster = (
            RedisClusterServers(self.workdir / "redis-cluster", fsync="always")
            if redis_cluster
            else None
        )
        if min_replicas_ack is None:
            min_replicas_ack = 1 if redis_cluster else 0
        self.min_replicas_ack = min_replicas_ack
        self.num_aggregators = aggregators
        # Sealed (the default): the aggregator's key set stays in keys.json (0600, only the
        # aggregator reads it); the shufflers get the public config only.
        self.sealed = sealed
        self.keys_path = self.workdir / "keys.json"
        self.public_keys_path = self.workdir / "public-keys.json"
        self.aggregators: list[DaemonProcess] = []
        self.shufflers: list[DaemonProcess] = []
        self._extra_shuffler_args = extra_shuffler_args or []
        self._extra_aggregator_args = extra_aggregator_args or []
        # Every shuffler also serves its HTTP port (Connect protocol): the URLs are
        # ``http_urls``; these web origins may call it from a page (CORS).
        self._http_allow_origins = list(http_allow_origins or [])
        self._http_ports: dict[str, int] = {}

    @property
    def shuffler_redis_url(self) -> str:
        """The shufflers' store (pending and in-flight reports)."""
        return self.redis.url if self.cluster is None else self.cluster.url

    @property
    def aggregator_redis_url(self) -> str:
        """The aggregator's store (counts): what ``crowdmix report --redis`` reads."""
        return self.aggregator_redis.url if self.cluster is None else self.cluster.url

    @property
    def aggregator(self) -> DaemonProcess | None:
        """The first aggregator (shuffler i forwards to aggregator i mod N)."""
        return self.aggregators[0] if self.aggregators else None

    @property
    def aggregator_target(self) -> str:
        assert self.aggregator is not None, "cluster not started"
        return self.aggregator.target

    @property
    def shuffler_targets(self) -> list[str]:
        return [s.target for s in self.shufflers]

    @property
    def http_urls(self) -> list[str]:
        """Each shuffler's HTTP port (Submit and GetConfig for browsers and the TS SDK)."""
        return [f"http://127.0.0.1:{self._http_ports[s.name]}" for s in self.shufflers]

    def _make_keys(self) -> None:
        """A key set for a new cluster directory (kept across restarts in the same one);
        the public config is written again each start (it lists pending/active keys)."""
        from crowdmix.aggregator.sealing.keys import (
            KeySet,
            load_keyset,
            save_keyset,
            write_public_config,
        )

        now = int(time.time())
        if self.keys_path.exists():
            keys = load_keyset(self.keys_path)
        else:
            keys, _ = KeySet().with_new_key(now)
            save_keyset(self.keys_path, keys, now=now, create=True)
        write_public_config(self.public_keys_path, keys, now=now)

    def _wait_args(self) -> list[str]:
        return ["--min-replicas-ack", str(self.min_replicas_ack)] if self.min_replicas_ack else []

    def _aggregator(self, i: int = 1) -> DaemonProcess:
        port = free_port()
        keys = ["--keys", str(self.keys_path)] if self.sealed else []
        args = [
            "aggregator", "serve",
            "--config", str(self.registry_path),
            "--redis", self.aggregator_redis_url,
            "--listen", f"127.0.0.1:{port}",
            *self._wait_args(),
            *keys,
            *(["--rounds-file", str(self.rounds_path)] if self.rounds_path else []),
            *self._extra_aggregator_args,
        ]  # fmt: skip
        name = "aggregator" if i == 1 else f"aggregator-{i}"
        return DaemonProcess(name, args, port, self.workdir / f"{name}.log")

    def _shuffler(self, i: int, aggregator_target: str) -> DaemonProcess:
        port = free_port()
        http_port = self._http_ports.setdefault(f"shuffler-{i}", free_port())
        origins = [a for o in self._http_allow_origins for a in ("--http-allow-origin", o)]
        args = [
            "shuffler", "serve",
            "--config", str(self.registry_path),
            "--redis", self.shuffler_redis_url,
            "--listen", f"127.0.0.1:{port}",
            "--aggregator", aggregator_target,
            *self._wait_args(),
            "--tokens", str(self.tokens_path),
            *(["--public-keys", str(self.public_keys_path)] if self.sealed else []),
            *(["--rounds-file", str(self.rounds_path)] if self.rounds_path else []),
            "--http-port", str(http_port),
            *origins,
            *self._extra_shuffler_args,
        ]  # fmt: skip
        return DaemonProcess(f"shuffler-{i}", args, port, self.workdir / f"shuffler-{i}.log")

    def start(self, timeout: float = 60.0, interrupted: Callable[[], bool] = lambda: False) -> None:
        """Start everything and wait until it is healthy. Once ``interrupted()`` (a
        Ctrl-C noted by a signal handler), it stops at the next step: KeyboardInterrupt,
        after stopping what had started. An interrupt is only ever acted on between
        steps, never inside one, so no process is left started but unrecorded."""

        def step() -> None:
            if interrupted():
                raise KeyboardInterrupt

        try:
            if self.sealed:
                self._make_keys()
            if self.cluster is not None:
                self.cluster.start()
            else:
                self.redis.start()
                step()
                self.aggregator_redis.start()
            step()
            self.aggregators = [self._aggregator(i) for i in range(1, self.num_aggregators + 1)]
            for a in self.aggregators:
                a.start()
            for a in self.aggregators:
                a.wait_healthy(timeout, interrupted)
            targets = [a.target for a in self.aggregators]
            self.shufflers = [
                self._shuffler(i, targets[(i - 1) % len(targets)])
                for i in range(1, self.num_shufflers + 1)
            ]
            step()
            for s in self.shufflers:
                s.start()
            for s in self.shufflers:
                s.wait_healthy(timeout, interrupted)
            step()
        except BaseException:
            self.stop()
            raise

    def stop(self, grace: float = 20.0) -> dict[str, int | None]:
        """Stop shufflers first (they flush and forward), then the aggregator, then Redis."""
        codes: dict[str, int | None] = {}
        for s in self.shufflers:
            codes[s.name] = s.stop(grace)
        for a in self.aggregators:
            codes[a.name] = a.stop(grace)
        for server in (self.redis, self.aggregator_redis):
            server.stop()
            server.kill()
        if self.cluster is not None:
            self.cluster.stop()
        self._unlock()
        return codes

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor releases the flock
            self._lock = None

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def register(sub: Any) -> None:
    p = sub.add_parser(
        "cluster",
        help="run a local cluster on loopback: Redis (AOF), shufflers, an aggregator",
        description="Starts N shufflers sharing a redis-server (AOF) and one aggregator with "
        "a redis-server of its own, "
        "all on 127.0.0.1, with a generated metric registry and token; waits until all are "
        "healthy, prints how to reach them, and stops them all cleanly on SIGTERM or Ctrl-C.",
    )
    p.add_argument("--dir", required=True, metavar="DIR", help="work directory (config, logs, AOF)")
    p.add_argument("--shufflers", type=int, default=2, help="shuffler processes (default 2)")
    p.add_argument("--config", metavar="FILE", help="metric registry (default: generated)")
    p.add_argument("--min-batch", type=int, default=1000, help="generated registry's min_batch")
    p.add_argument(
        "--fsync",
        choices=FSYNC_MODES,
        default="everysec",
        help="the shufflers' Redis appendfsync: everysec (default; power loss can lose ~1-2 s "
        "of acknowledged reports) or always (fsync before every acknowledgement; slower). "
        "The aggregator's Redis is always 'always'",
    )
    p.add_argument(
        "--plaintext",
        action="store_true",
        help="no key set: shufflers take clear reports (default: sealed reports, the "
        "shufflers hold only the aggregator's public keys)",
    )
    p.add_argument(
        "--redis-cluster",
        action="store_true",
        help="a Redis Cluster instead of two redis-servers: 3 masters and 3 replicas on "
        "loopback (AOF always), holding both stores under their own prefixes",
    )
    p.add_argument("--aggregators", type=int, default=1, help="aggregator processes (default 1)")
    p.add_argument(
        "--min-replicas-ack",
        type=int,
        metavar="N",
        help="the daemons acknowledge a write once N replicas have it (Redis WAIT; "
        "default 1 with --redis-cluster, else 0)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from crowdmix.cli import CliError

    if args.shufflers < 1:
        raise CliError(f"--shufflers must be at least 1, got {args.shufflers}")
    if args.aggregators < 1:
        raise CliError(f"--aggregators must be at least 1, got {args.aggregators}")
    if args.min_replicas_ack and not args.redis_cluster:
        raise CliError(
            "--min-replicas-ack needs --redis-cluster (the redis-servers have no replicas)"
        )

    # Ctrl-C or SIGTERM during start-up abandons it: whatever was started is stopped and
    # the command exits 130 (not 1, blaming whichever daemon was starting then).
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cluster = LocalCluster(
            args.dir,
            shufflers=args.shufflers,
            registry_path=args.config,
            min_batch=args.min_batch,
            fsync=args.fsync,
            sealed=not args.plaintext,
            aggregators=args.aggregators,
            redis_cluster=args.redis_cluster,
            min_replicas_ack=args.min_replicas_ack,
        )
        cluster.start(interrupted=stop.is_set)
    except KeyboardInterrupt:
        print("crowdmix cluster: interrupted during start-up; stopped what had started",
              file=sys.stderr)  # fmt: skip
        raise
    except (RuntimeError, ValueError) as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot use {args.dir}: {exc.strerror or exc}") from None
    print(f"crowdmix local cluster in {cluster.workdir} (logs: *.log there)")
    if cluster.cluster is not None:
        print(f"  redis       {cluster.cluster.url}")
        print(
            "              (Redis Cluster, 3 masters + 3 replicas, AOF always; shufflers and "
            f"aggregators; WAIT for {cluster.min_replicas_ack} replica(s))"
        )
    else:
        print(f"  redis       {cluster.shuffler_redis_url}  (shufflers; AOF {args.fsync})")
        print(f"  redis       {cluster.aggregator_redis_url}  (aggregator; AOF always)")
    for a in cluster.aggregators:
        print(f"  {a.name:<11} {a.target}")
    for s in cluster.shufflers:
        print(f"  {s.name:<11} {s.target}")
    print(f"  registry    {cluster.registry_path}")
    if cluster.rounds_path is not None:
        print(f"  rounds      {cluster.rounds_path} (heavy hitters: crowdmix discover --rounds)")
    if cluster.sealed:
        print(f"  keys        {cluster.keys_path} (aggregator, private)")
        print(f"  public keys {cluster.public_keys_path} (shufflers; sealed reports only)")
    else:
        print("  sealing     off (--plaintext): the shufflers see report contents")
    print(f"  token       in {cluster.tokens_path} (the shufflers' file: app name, token)")
    print(f"  app token   {cluster.app_token_path} (what an app holds: the token alone)")
    print(
        "Try: crowdmix simulate --target "
        f"{cluster.shuffler_targets[0]} --config {cluster.registry_path} "
        f"--metric {DEMO_METRIC} --token-file {cluster.tokens_path} --clients 100000"
        + ("" if cluster.sealed else " --plaintext")
    )
    # the README's SDK walkthrough; the cluster serves gRPC without TLS: --insecure
    target, app_token = cluster.shuffler_targets[0], cluster.app_token_path
    print(
        f"SDK (README): crowdmix config export --shuffler {target} --token-file {app_token} "
        "--insecure --out crowdmix-config.pb"
    )
    print(
        f"              python examples/daily_setting.py --app-dir DIR --shuffler {target} "
        f"--token-file {app_token} --insecure --config crowdmix-config.pb --theme dark"
    )
    print("Stop with Ctrl-C or SIGTERM.", flush=True)
    while not stop.wait(1.0):
        dead = [s.name for s in [*cluster.shufflers, *cluster.aggregators] if not s.alive()]
        if dead:
            print(f"crowdmix cluster: {', '.join(dead)} exited; stopping", file=sys.stderr)
            break
    codes = cluster.stop()
    print("stopped: " + ", ".join(f"{k} exit {v}" for k, v in codes.items()))
    return 0 if all(v == 0 for v in codes.values()) else 1
