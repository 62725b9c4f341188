"""A real browser: headless Chromium loads examples/browser/index.html, which embeds the
built bundle, and reports through the HTTP port of a real shuffler (a cross-origin page:
CORS preflight, bearer token, sealed report); the aggregator counts it. Leaving the page
without a flush sends the report on pagehide with fetch keepalive. Two browsing contexts
of one app claim a window once."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crowdmix.cluster import LocalCluster
from tests.browser import Site, page_result
from tests.daemons import counted, local_cluster
from tests.typescript import built_sdk
from tests.waiting import eventually

pytestmark = pytest.mark.integration

REGISTRY = """
[metrics.theme]
encoding = "krr"
epsilon = 1.0
domain = ["light", "dark", "sepia"]
[metrics.theme.shuffle]
min_batch = 1
max_delay_seconds = 0.1
release = "max_batch"
"""


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    s = Site()
    yield s
    s.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, site: Site) -> Iterator[LocalCluster]:
    built_sdk()
    work = tmp_path_factory.mktemp("browser")
    with local_cluster(work, REGISTRY, shufflers=1, http_allow_origins=[site.origin]) as c:
        yield c


def open_page(site: Site, cluster: LocalCluster, profile: Path, **query: str) -> Any:
    """Load the example page with ``query`` in a fresh headless Chromium; what it POSTs."""
    q = {"shuffler": cluster.http_urls[0], "token": cluster.token, "result": "/result", **query}
    url = f"{site.origin}/examples/browser/index.html?{urllib.parse.urlencode(q)}"
    return page_result(site, url, profile, linger=1.0)


def test_a_page_in_chromium_reports_through_the_shuffler_http_port(
    site: Site, cluster: LocalCluster, tmp_path: Path
) -> None:
    result = open_page(site, cluster, tmp_path / "profile", value="dark")
    assert result["made"] is True, result
    assert result["queued"] == 0 and result["counters"]["delivered"] == 1, result
    assert eventually(lambda: counted(cluster, "theme") == 1, 60, 0.2)


def test_leaving_the_page_sends_the_report_with_keepalive(
    site: Site, cluster: LocalCluster, tmp_path: Path
) -> None:
    before = counted(cluster, "theme")
    result = open_page(site, cluster, tmp_path / "profile", leave="sepia", background="0")
    assert result == {"made": True, "queued": 1}
    assert eventually(lambda: counted(cluster, "theme") == before + 1, 60, 0.2)


def test_two_tabs_of_one_app_claim_a_window_once(
    site: Site, cluster: LocalCluster, tmp_path: Path
) -> None:
    """The page and a frame of it share one IndexedDB outbox and report the same metric at
    the same moment: the claim is one transaction, so exactly one of them makes it."""
    result = open_page(site, cluster, tmp_path / "profile", race="light", background="0")
    made = sorted((r["made"], r["status"]) for r in result["results"])
    assert made == [(False, "already_reported_this_window"), (True, "claimed")]
