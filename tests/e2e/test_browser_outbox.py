"""The IndexedDB outbox in a real browser: headless Chromium loads
sdk/typescript/test/browser/outbox.html once, which drives IdbBackend through the Outbox
API beside the in-memory backend given the same calls, and POSTs each check's outcome;
each check here is one test, named as the page names it. crash.html: a claim survives the
browser killed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser import Site, page_result
from tests.typescript import built_sdk

pytestmark = pytest.mark.integration

CHECKS = [
    "claim",
    "same window again: taken",
    "over maxReports: full",
    "over maxBytes: full",
    "at maxBytes: claimed",
    "remove: rows gone, counted",
    "remove: window settled, still taken",
    "remove: counted once",
    "withdraw: rows gone, counted window_ahead",
    "withdraw: claim dropped, window claimable again",
    "withdraw: claim moved back to the window held",
    "counters",
    "config stored and read back",
    "rows in claim order",
    "each answer as the in-memory outbox's",
    "after reopen: the in-memory outbox's state",
    "secret: 32 bytes, the same after reopen",
    "after reopen: taken and full as before",
    *(
        f"old layout v{v}: {what}"
        for v in (1, 2)
        for what in ("recreated empty", "works", "no old record left")
    ),
    "older version held open: open rejects, no hang",
    "newer version opened elsewhere: this one gives way, its calls reject",
    "a change failing half-way commits nothing",
]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the page reported, from one load in a fresh browser profile."""
    built_sdk()
    site = Site()
    profile = tmp_path_factory.mktemp("idb") / "profile"
    url = f"{site.origin}/sdk/typescript/test/browser/outbox.html?result=/result"
    try:
        result: dict[str, Any] = page_result(site, url, profile)
    finally:
        site.close()
    return result


def test_the_page_ran_every_check_without_error(page: dict[str, Any]) -> None:
    assert page["error"] is None, page["error"]
    assert sorted(page["checks"]) == sorted(CHECKS)


@pytest.mark.parametrize("check", CHECKS)
def test_indexeddb_outbox(page: dict[str, Any], check: str) -> None:
    assert page["checks"].get(check) is True, f"{check}: saw {page['checks'].get(check)}"


def test_a_claimed_report_survives_the_browser_killed(tmp_path: Path) -> None:
    """The claim resolved, the browser is killed at once (SIGKILL, no pagehide, no flush):
    the same profile loaded again reads the row, with its report id, and the claim."""
    built_sdk()
    site = Site()
    profile = tmp_path / "profile"
    try:
        claimed = _load(site, profile, "claim")
        assert claimed == {"claimed": "claimed"}, claimed
        state = _load(site, profile, "read")["state"]
        assert [r["id"] for r in state["rows"]] == ["00112233445566778899aabbccddeeff"], state
        assert state["claims"] == {"m": 80}, state
    finally:
        site.close()


def _load(site: Site, profile: Path, phase: str) -> dict[str, Any]:
    """Load crash.html in `phase` with `profile`; kill the browser as soon as it POSTs."""
    url = f"{site.origin}/sdk/typescript/test/browser/crash.html?phase={phase}&result=/result"
    result: dict[str, Any] = page_result(site, url, profile, timeout=60)
    return result
