"""The checked-in generated code is what scripts/gen-protos produces, and the
runtime floors in pyproject equal the versions recorded in it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ["crowdmix_pb2.py", "crowdmix_pb2.pyi", "crowdmix_pb2_grpc.py"]


def test_checked_in_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    subprocess.run(
        [str(ROOT / "scripts" / "gen-protos"), str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    for name in GENERATED:
        fresh = (tmp_path / name).read_bytes()
        checked_in = (ROOT / "protos" / name).read_bytes()
        assert fresh == checked_in, f"protos/{name} drifted: run scripts/gen-protos"


def _generated_versions() -> tuple[str, str]:
    grpc_src = (ROOT / "protos" / "crowdmix_pb2_grpc.py").read_text()
    pb_src = (ROOT / "protos" / "crowdmix_pb2.py").read_text()
    grpc_m = re.search(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", grpc_src, re.M)
    pb_m = re.search(r"^# Protobuf Python Version: ([0-9.]+)$", pb_src, re.M)
    assert grpc_m and pb_m
    return grpc_m.group(1), pb_m.group(1)


def test_runtime_floors_equal_generated_versions() -> None:
    grpc_version, protobuf_version = _generated_versions()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    floors: dict[str, set[str]] = {}
    for reqs in extras.values():
        for req in reqs:
            m = re.fullmatch(r"(grpcio|grpcio-health-checking|protobuf)>=([0-9.]+)", req)
            if m:
                floors.setdefault(m.group(1), set()).add(m.group(2))
    assert floors["grpcio"] == {grpc_version}
    assert floors["grpcio-health-checking"] == {grpc_version}
    assert floors["protobuf"] == {protobuf_version}
    # Every extra that installs grpcio or protobuf states the floor.
    for name, reqs in extras.items():
        for req in reqs:
            if re.match(r"(grpcio|protobuf)\b", req) and not req.startswith("grpcio-tools"):
                assert ">=" in req, f"{name}: {req} has no floor"


def test_generated_code_imports_and_round_trips() -> None:
    from crowdmix.protos import crowdmix_pb2

    cols = crowdmix_pb2.ReportColumns(
        metric="m", params_fingerprint=2**64 - 1, count=2, report_bytes=1, cohorts=[0, 7]
    )
    cols.bits = b"\x01\x02"
    again = crowdmix_pb2.ReportColumns.FromString(cols.SerializeToString())
    assert again == cols and list(again.cohorts) == [0, 7]
