"""Two processes of one app (say, the app and its widget) on one app directory.

They share the outbox: one report per metric and window between them. (A report both
of them send counts once in ``counters()``: tests/client/test_outbox.py, the rows
deleted, not the ids acknowledged.)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from crowdmix import client
from crowdmix.cluster import free_port
from crowdmix.shuffler.server import start_shuffler
from tests.e2e.config_server import TOKEN
from tests.shuffler.helpers import make_registry

pytestmark = pytest.mark.slow  # real servers and processes, seconds each

KW: dict[str, Any] = {"token": TOKEN, "tls": False, "sealing": "off", "background": False}

CLAIMER = """
import sys, time
from pathlib import Path
from crowdmix import client
app, target, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
r = client.Reporter(app, target, token="app-token-123", tls=False, sealing="off",
                    background=False)
while not go.exists():
    time.sleep(0.001)
print(r.report("home_page", "x").status.value)
r.close()
"""


def test_two_processes_on_one_app_dir_claim_one_report(tmp_path: Path) -> None:
    """Both report at the same instant: one report is made, the other process is told so."""
    offline = f"127.0.0.1:{free_port()}"  # nothing listens: the cached config is used
    with start_shuffler(make_registry(min_batch=1), tokens=frozenset({TOKEN})) as s:
        for i in range(3):
            app, go = tmp_path / f"app{i}", tmp_path / f"go{i}"
            with client.Reporter(app, f"127.0.0.1:{s.port}", **KW) as r:
                assert r.flush(timeout=10) == 0  # caches the config
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", CLAIMER, str(app), offline, str(go)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(2)
            ]
            time.sleep(1.0)  # both started and waiting (a late one only makes it easier)
            go.touch()
            outs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
            assert outs == ["already_reported_this_window", "claimed"], outs
            with client.Reporter(app, offline, **KW) as r:
                assert r.queued == 1
