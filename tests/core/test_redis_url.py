"""``redis+cluster://`` URLs: seeds, credentials, and a clear error for each mistake."""

from __future__ import annotations

import pytest

from crowdmix.core.redis_url import ClusterUrl, is_cluster_url, is_redis_url, parse_cluster_url


def test_seeds_and_credentials() -> None:
    url = parse_cluster_url("redis+cluster://app:s%40cret@10.0.0.1:7000,10.0.0.2:7001/0")
    assert url == ClusterUrl((("10.0.0.1", 7000), ("10.0.0.2", 7001)), "app", "s@cret")
    assert url.node_url("10.0.0.3", 7002) == "redis://app:s%40cret@10.0.0.3:7002/0"
    assert parse_cluster_url("redis+cluster://127.0.0.1:7000").node_url("h", 1) == ("redis://h:1/0")


def test_a_node_url_of_an_ipv6_node_is_bracketed() -> None:
    """The slot map names IPv6 nodes bare (``::1``); the shuffler's event-loop appender
    connects to each master by ``node_url``, which gave ``redis://::1:7000/0`` (no port
    redis-py can read: every flush failed on an IPv6 cluster). Found in review."""
    url = parse_cluster_url("redis+cluster://[::1]:7000")
    assert url.nodes == (("::1", 7000),)
    assert url.node_url("::1", 7000) == "redis://[::1]:7000/0"
    assert url.node_url("[fe80::2]", 7001) == "redis://[fe80::2]:7001/0"


def test_which_urls_are_redis() -> None:
    for url in ("redis://h:1/0", "rediss://h:1/0", "unix:///s.sock", "redis+cluster://h:1"):
        assert is_redis_url(url)
    assert is_cluster_url("redis+cluster://h:1") and not is_cluster_url("redis://h:1")
    assert not is_redis_url("memory://")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://h:1/3", "only database 0"),
        ("redis+cluster://h:1/?ssl=true", "options are not taken"),
        ("redis+cluster://h:1,h", "HOST:PORT"),
        ("redis+cluster://h:99999", "HOST:PORT"),
        ("redis://h:1", "starts with redis\\+cluster://"),
    ],
)
def test_bad_urls_name_the_mistake(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_cluster_url(url)
