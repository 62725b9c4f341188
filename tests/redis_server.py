"""The tests' private redis-servers: the same class the local-cluster launcher uses,
and ``ListeningRedis`` for the other ways to reach Redis (TLS, a unix socket).

The tests never use a machine's system Redis: each session starts its own on a
free loopback port, so CI and fresh machines behave the same. scripts/bootstrap
installs redis-server when it is missing.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from crowdmix.cluster import RedisClusterServers, RedisServer, free_port

__all__ = ["ListeningRedis", "RedisClusterServers", "RedisServer", "free_port", "self_signed"]


def self_signed(directory: Path, name: str = "redis") -> tuple[Path, Path]:
    """A one-day self-signed certificate for 127.0.0.1 (its own CA): (cert, key)."""
    key, crt = directory / f"{name}.key", directory / f"{name}.crt"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "1",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    return crt, key


class ListeningRedis:
    """A redis-server on TLS only (``rediss://``, client certificates required) or on
    a unix socket only (``unix://``), in ``directory``; no persistence."""

    def __init__(self, kind: str, directory: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed: run scripts/bootstrap")
        self.dir = directory
        common = ["--dir", str(directory), "--save", "", "--appendonly", "no",
                  "--protected-mode", "no", "--logfile", str(directory / "redis.log")]  # fmt: skip
        if kind == "rediss":
            crt, key = self_signed(directory)
            port = free_port()
            listen = ["--port", "0", "--bind", "127.0.0.1", "--tls-port", str(port),
                      "--tls-cert-file", str(crt), "--tls-key-file", str(key),
                      "--tls-ca-cert-file", str(crt), "--tls-auth-clients", "yes"]  # fmt: skip
            # the same certificate is the client's (mTLS) and the CA both sides trust
            self.url = (
                f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={crt}"
                f"&ssl_certfile={crt}&ssl_keyfile={key}"
            )
        elif kind == "unix":
            sock = directory / "redis.sock"
            listen = ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
            self.url = f"unix://{sock}?db=0"
        else:
            raise ValueError(f"kind must be 'rediss' or 'unix', got {kind!r}")
        self.proc = subprocess.Popen(
            [exe, *common, *listen], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait()

    def _wait(self, timeout: float = 10.0) -> None:
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=1.0)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.proc.poll() is not None:
                    log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {log}")
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.close()
                        raise RuntimeError(f"redis-server did not answer at {self.url}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def flush(self) -> None:
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=5.0)
        try:
            client.flushall()
        finally:
            client.close()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
