"""deploy/ cannot run here (no Docker engine on this machine kind), so its files are
checked statically: the compose file parses, its commands are accepted by our own
CLI parser, every file it mounts exists, and the Dockerfile copies every package."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import yaml

from client.registry import load_registry
from crowdmix.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _compose() -> dict:  # type: ignore[type-arg]
    data = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_topology_and_commands_parse() -> None:
    services = _compose()["services"]
    assert set(services) == {
        "redis-shuffler", "redis-aggregator", "aggregator", "shuffler-1", "shuffler-2"
    }  # fmt: skip
    assert "--appendonly" in services["redis-aggregator"]["command"]
    # The aggregator must not reach the shufflers' queues: separate Redis instances.
    assert "--redis=redis://redis-aggregator:6379/0" in services["aggregator"]["command"]
    for name in ("shuffler-1", "shuffler-2"):
        assert "--redis=redis://redis-shuffler:6379/0" in services[name]["command"]
    parser = build_parser()
    for name in ("aggregator", "shuffler-1", "shuffler-2"):
        svc = services[name]
        args = parser.parse_args(svc["command"])  # SystemExit on an unknown flag
        assert args.command in ("aggregator", "shuffler")
        health = svc["healthcheck"]["test"]
        assert health[:3] == ["CMD", "crowdmix", "health"]
        parser.parse_args(health[2:])
        for volume in svc["volumes"]:
            src = volume.split(":")[0]
            assert (DEPLOY / src).is_file(), f"{name} mounts missing {src}"
    # Shufflers forward to the aggregator service and listen where they are published.
    shuffler = services["shuffler-1"]["command"]
    assert "--aggregator=aggregator:7500" in shuffler
    assert "--listen=0.0.0.0:7500" in services["aggregator"]["command"]


def test_example_registry_and_tokens_load() -> None:
    from shuffler.config import load_tokens

    registry = load_registry(DEPLOY / "metrics.example.toml")
    assert registry.metrics
    assert load_tokens(DEPLOY / "tokens.example.txt")


def test_dockerfile_copies_every_package() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]
    copied = set(re.findall(r"^COPY (\S+) \./", text, flags=re.M))
    assert set(packages) <= copied
    for src in re.findall(r"^COPY (.+) \S+$", text, flags=re.M):
        for path in src.split():
            assert (ROOT / path).exists(), f"Dockerfile copies missing {path}"
    assert re.search(r"^USER (?!root|0)", text, flags=re.M), "image must not run as root"
    assert 'ENTRYPOINT ["crowdmix"]' in text


def test_make_certs_produces_a_verifiable_chain(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(DEPLOY / "tls" / "make-certs.sh"), str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    for name in ("shuffler", "aggregator", "shuffler-client"):
        out = subprocess.run(
            [
                "openssl",
                "verify",
                "-CAfile",
                str(tmp_path / "ca.crt"),
                str(tmp_path / f"{name}.crt"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip().endswith("OK")
        assert (tmp_path / f"{name}.key").stat().st_mode & 0o077 == 0
