"""The tests' private redis-server: the same class the local-cluster launcher uses.

The tests never use a machine's system Redis: each session starts its own on a
free loopback port, so CI and fresh machines behave the same. scripts/bootstrap
installs redis-server when it is missing.
"""

from __future__ import annotations

from crowdmix.cluster import RedisServer, free_port

__all__ = ["RedisServer", "free_port"]
