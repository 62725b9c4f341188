"""A real browser for the tests and the bench: the repository served over loopback HTTP
(the page POSTs its result to /result) and headless Chromium loading one page."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise AssertionError("this test needs Debian's chromium package (apt-get install chromium)")
    return path


class Site:
    """The repository's files over HTTP on loopback, and POST /result for the page."""

    def __init__(self) -> None:
        self.results: queue.Queue[Any] = queue.Queue()
        results = self.results

        class Handler(SimpleHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                results.put(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(REPO)))
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def page_result(
    site: Site, url: str, profile: Path | str, *, timeout: float = 90.0, linger: float = 0.0
) -> Any:
    """Load ``url`` in a fresh headless Chromium with ``profile``; what the page POSTs.
    The whole browser is then killed (SIGKILL: no pagehide, no flush), ``linger`` seconds
    after the result came (to let a keepalive request leave first)."""
    proc = subprocess.Popen(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        return site.results.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"the page never reported back: {url}") from None
    finally:
        time.sleep(linger)
        os.killpg(proc.pid, signal.SIGKILL)  # every process the browser started
        proc.communicate(timeout=30)
