"""Store URLs shared by the shuffler and the aggregator: which Redis, and whether a cluster.

A Redis Cluster (or Valkey cluster) is named by ``redis+cluster://`` followed by one or
more seed nodes, comma separated; the client asks any of them for the slot map::

    redis+cluster://10.0.0.1:7000,10.0.0.2:7000
    redis+cluster://user:password@10.0.0.1:7000

A cluster has only database 0, so a path other than ``/`` or ``/0`` is refused. String
handling, and ``blocking_client`` for the daemons, which imports redis-py when called
(``import client`` stays light), and ``redirected`` for a cluster's error replies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

__all__ = [
    "CLUSTER_SCHEME",
    "ClusterUrl",
    "blocking_client",
    "is_cluster_url",
    "is_redis_url",
    "parse_cluster_url",
    "redirected",
    "redis_url_problem",
]

CLUSTER_SCHEME = "redis+cluster://"
_SINGLE = ("redis://", "rediss://", "unix://")
_REDIRECTS = ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN")


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEME)


def is_redis_url(url: str) -> bool:
    """A URL the Redis stores take: one node (redis://, rediss://, unix://) or a cluster."""
    return url.startswith(_SINGLE) or is_cluster_url(url)


@dataclass(frozen=True, slots=True)
class ClusterUrl:
    """The seed nodes and credentials of a ``redis+cluster://`` URL."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None

    def node_url(self, host: str, port: int) -> str:
        """A ``redis://`` URL of one node, with the cluster's credentials."""
        auth = ""
        if self.password is not None:
            user = self.username or ""
            auth = f"{_quote(user)}:{_quote(self.password)}@"
        if ":" in host:  # an IPv6 address (the slot map gives it bare): bracket it
            host = f"[{host.strip('[]')}]"
        return f"redis://{auth}{host}:{port}/0"


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def parse_cluster_url(url: str) -> ClusterUrl:
    """Seeds and credentials of a ``redis+cluster://`` URL; ValueError naming what is wrong."""
    if not is_cluster_url(url):
        raise ValueError(f"a Redis Cluster URL starts with {CLUSTER_SCHEME}, got {url!r}")
    rest = url[len(CLUSTER_SCHEME) :]
    netloc, _, path = rest.partition("/")
    path, _, query = path.partition("?")
    if path not in ("", "0"):
        raise ValueError(f"{url!r}: a Redis Cluster has only database 0, got /{path}")
    if query:
        raise ValueError(f"{url!r}: options are not taken in a cluster URL, got ?{query}")
    username = password = None
    if "@" in netloc:
        auth, _, netloc = netloc.rpartition("@")
        user, sep, secret = auth.partition(":")
        username, password = (
            (unquote(user) or None, unquote(secret)) if sep else (None, unquote(user))
        )
    nodes: list[tuple[str, int]] = []
    for seed in netloc.split(","):
        host, sep, port = seed.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{url!r}: each seed node must be HOST:PORT, got {seed!r}")
        nodes.append((host.strip("[]"), int(port)))
    return ClusterUrl(tuple(nodes), username, password)


def redis_url_problem(name: str, url: str) -> str | None:
    """What is wrong with a setting ``name`` holding the Redis URL ``url``, or None."""
    if not is_redis_url(url):
        return (
            f"{name} must be a redis://, rediss://, unix:// or "
            f"redis+cluster://host:port,... URL, got {url!r}"
        )
    if is_cluster_url(url):
        try:
            parse_cluster_url(url)
        except ValueError as exc:
            return f"{name}: {exc}"
    return None


def blocking_client(url: str, *, timeout: float, resend: bool, error: type[Exception]) -> Any:
    """A blocking redis-py client of ``url``: one node, or a cluster's ``RedisCluster``
    (``resend``: whether it may send a command again after a socket failure, when the
    command may have run; safe only if every write is idempotent). ``timeout`` per
    command, at most 5 s to connect; ``error`` when no seed node of a cluster answers."""
    import redis
    import redis.cluster

    connect = min(timeout, 5.0)
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=connect)
    cluster = parse_cluster_url(url)
    options: dict[str, Any] = {}
    if not resend:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        options["retry"] = Retry(NoBackoff(), 0)
    try:
        return redis.cluster.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in cluster.nodes],  # type: ignore[no-untyped-call]
            username=cluster.username,
            password=cluster.password,
            socket_timeout=timeout,
            socket_connect_timeout=connect,
            **options,
        )
    except (redis.exceptions.RedisClusterException, redis.RedisError) as exc:
        seeds = ",".join(f"{host}:{port}" for host, port in cluster.nodes)
        raise error(f"redis cluster {seeds}: {exc}") from None


def redirected(reply: Any) -> bool:
    """An error reply that says the command did not run here: ask the slot map again."""
    from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError

    if isinstance(reply, MovedError | AskError | TryAgainError | ClusterDownError):
        return True
    return isinstance(reply, Exception) and str(reply).split(" ", 1)[0] in _REDIRECTS
