"""``report()`` of the TypeScript SDK in headless Chromium: encode + claim + IndexedDB write.

    .venv/bin/python bench/typescript_browser.py [--reports 200]

A shuffler (in this process, memory store) serves the HTTP port; the repository is served
over HTTP; Chromium loads examples/browser/index.html?bench=N, which times N report()
calls of N RAPPOR metrics (k=128) in one outbox (the first one also fetches the config
and is reported apart) and POSTs the times back. Needs the built SDK and Debian's chromium.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crowdmix.core.registry import parse_registry
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import start_shuffler
from tests.browser import Site, page_result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reports", type=int, default=200)
    p.add_argument(
        "--runs", type=int, default=3, help="fresh browser profiles, one after the other"
    )
    args = p.parse_args()
    medians = [run(args.reports) for _ in range(args.runs)]
    print(
        f"medians of the runs: {', '.join(f'{m:.2f}' for m in medians)} ms; "
        f"median of medians {statistics.median(medians):.2f} ms"
    )


def run(reports: int) -> float:
    rappor = {"encoding": "rappor", "k": 128, "h": 2, "m": 64, "f": 0.5, "p": 0.5, "q": 0.75}
    registry = parse_registry({"metrics": {f"m{i}": dict(rappor) for i in range(reports)}})
    site = Site()
    settings = ShufflerSettings(http_port=0, http_allow_origins=(site.origin,))
    shuffler = start_shuffler(registry, MemoryStore(), None, settings=settings)
    q = {"shuffler": f"http://127.0.0.1:{shuffler.http_port}", "result": "/result"}
    url = f"{site.origin}/examples/browser/index.html?bench={reports}&{urllib.parse.urlencode(q)}"
    with tempfile.TemporaryDirectory() as profile:
        try:
            result = page_result(site, url, profile, timeout=300)
        finally:
            shuffler.stop(1.0)
            site.close()
    times = result["times"]
    rest = sorted(times[1:])
    print(f"{result['userAgent']}")
    print(
        f"report() over {len(rest)} calls: median {statistics.median(rest):.2f} ms, "
        f"p90 {rest[int(0.9 * len(rest))]:.2f} ms, max {rest[-1]:.2f} ms; "
        f"first call (fetches the config) {times[0]:.1f} ms"
    )
    time.sleep(0.1)
    return float(statistics.median(rest))


if __name__ == "__main__":
    main()
