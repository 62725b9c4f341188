"""The SDK embeds cheaply: ``from crowdmix import client`` loads no heavy or server-side module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FORBIDDEN = (
    "grpc",
    "numpy",
    "redis",
    "cryptography",
    "crowdmix.shuffler",
    "crowdmix.aggregator",
    "google.protobuf",
    "crowdmix.protos",
)


def _modules_after(statement: str) -> set[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def _loaded(modules: set[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


def test_import_client_loads_no_heavy_module() -> None:
    modules = _modules_after(
        "from crowdmix import client; client.RapporEncoder; client.RapporParams"
    )
    assert "crowdmix.client" in modules
    assert [name for name in FORBIDDEN if _loaded(modules, name)] == []


def test_encoding_a_report_loads_no_heavy_module() -> None:
    modules = _modules_after(
        "from crowdmix import client\n"
        "params = client.RapporParams()\n"
        "enc = client.RapporEncoder(params, secret=client.new_secret(), metric='m')\n"
        "enc.encode('x')"
    )
    assert [name for name in FORBIDDEN if _loaded(modules, name)] == []


def test_the_batch_encoder_is_what_loads_numpy() -> None:
    # The check above can fail: importing client.batch does load numpy.
    assert _loaded(_modules_after("import crowdmix.client.batch"), "numpy")


def test_creating_a_reporter_loads_no_heavy_module(tmp_path: Path) -> None:
    # grpc and cryptography load when the reporter first reaches for the shuffler
    modules = _modules_after(
        "from crowdmix import client\n"
        f"r = client.Reporter({str(tmp_path)!r}, '127.0.0.1:1', background=False)\n"
        "r.close()"
    )
    assert [name for name in FORBIDDEN if _loaded(modules, name)] == []
