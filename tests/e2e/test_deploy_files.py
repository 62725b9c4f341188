"""deploy/ cannot run here (no Docker engine on this machine kind), so its files are
checked statically: the compose file parses, its commands are accepted by our own
CLI parser, every file it mounts exists, and the Dockerfile copies every package."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest
import yaml

from crowdmix.cli import build_parser
from crowdmix.core.registry import load_registry
from crowdmix.shuffler.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _compose() -> dict:  # type: ignore[type-arg]
    data = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_topology_and_commands_parse() -> None:
    services = _compose()["services"]
    assert set(services) == {
        "redis-shuffler", "redis-aggregator", "keys", "aggregator", "shuffler-1", "shuffler-2"
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
            if not src.startswith("./"):  # a named volume
                assert src in _compose()["volumes"]
                continue
            if src == "./tokens.txt":  # made by deploy/make-token.sh, never checked in
                assert (DEPLOY / "make-token.sh").is_file()
                continue
            assert (DEPLOY / src).is_file(), f"{name} mounts missing {src}"
        if args.command == "shuffler":  # Prometheus in compose must be able to scrape it
            assert "--metrics-host=0.0.0.0" in svc["command"]
    # Sealed reports: the key set is made once, mounted by the aggregator only; the
    # shufflers mount the public config read-only and never the private volume.
    keys = parser.parse_args(services["keys"]["command"])
    assert (keys.command, keys.keys_command, keys.if_missing) == ("keys", "new", True)
    private = keys.file.rsplit("/", 1)[0]
    assert parser.parse_args(services["aggregator"]["command"]).keys == keys.file
    for name in ("shuffler-1", "shuffler-2"):
        svc = services[name]
        assert parser.parse_args(svc["command"]).public_keys == keys.public
        assert not any(private in v or "aggregator-keys" in v for v in svc["volumes"])
        assert "public-keys:/var/lib/crowdmix/public:ro" in svc["volumes"]
    # Shufflers forward to the aggregator service and listen where they are published.
    shuffler = services["shuffler-1"]["command"]
    assert "--aggregator=aggregator:7500" in shuffler
    assert "--listen=0.0.0.0:7500" in services["aggregator"]["command"]


def test_example_registry_and_tokens_load() -> None:
    from crowdmix.shuffler.config import load_tokens

    registry = load_registry(DEPLOY / "metrics.example.toml")
    assert registry.metrics
    # each daemon reads its own table of it, and both are checked field by field
    from crowdmix.aggregator.daemon.settings import load_config as aggregator_config
    from crowdmix.shuffler.config import load_config as shuffler_config

    assert aggregator_config(DEPLOY / "metrics.example.toml")[1].listen == "127.0.0.1:7500"
    assert shuffler_config(DEPLOY / "metrics.example.toml")[1].listen == "127.0.0.1:7400"
    # its placeholder token is public: refused unless unauthenticated serving is allowed
    with pytest.raises(ConfigError, match="placeholder"):
        load_tokens(DEPLOY / "tokens.example.txt")
    assert load_tokens(DEPLOY / "tokens.example.txt", allow_placeholder=True)


def test_dockerfile_copies_every_package() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {p.rstrip("*") for p in setuptools["packages"]["find"]["include"]}
    copied = set(re.findall(r"^COPY (\S+) \./", text, flags=re.M))
    assert packages <= copied
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
        # group 65534 (the image's user) may read it; others may not (run as root here)
        key = (tmp_path / f"{name}.key").stat()
        assert key.st_mode & 0o077 == 0o040 and key.st_gid == 65534
    assert (tmp_path / "ca.key").stat().st_mode & 0o077 == 0


TLS_MOUNT = "/etc/crowdmix/tls/"
CERT_FILES = {  # what deploy/tls/make-certs.sh writes
    "ca.crt", "aggregator.crt", "aggregator.key", "shuffler.crt", "shuffler.key",
    "shuffler-client.crt", "shuffler-client.key",
}  # fmt: skip


def _tls_override() -> dict:  # type: ignore[type-arg]
    data = yaml.safe_load((DEPLOY / "compose.tls.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_tls_override_commands_parse_and_name_the_generated_files() -> None:
    services = _tls_override()["services"]
    assert set(services) == {"aggregator", "shuffler-1", "shuffler-2"}
    assert set(services) <= set(_compose()["services"])
    parser = build_parser()
    for svc in services.values():
        command, health = svc["command"], svc["healthcheck"]["test"]
        parser.parse_args(command)
        parser.parse_args(health[2:])
        tls_paths = [a.split("=", 1)[1] for a in command + health if TLS_MOUNT in a]
        assert tls_paths and {p.removeprefix(TLS_MOUNT) for p in tls_paths} <= CERT_FILES
        # single files, exactly those used: the CA key never enters a container
        mounted = {v.split(":")[1] for v in svc["volumes"]}
        assert mounted == set(tls_paths)
        # the override repeats each command in full: sealing stays on with TLS
        assert any(a.startswith(("--keys=", "--public-keys=")) for a in command)
        assert not any("ca.key" in v for v in svc["volumes"])
    aggregator = services["aggregator"]["command"]
    assert f"--tls-client-ca={TLS_MOUNT}ca.crt" in aggregator  # mutual TLS
    for name in ("shuffler-1", "shuffler-2"):
        shuffler = services[name]["command"]
        assert f"--aggregator-cert={TLS_MOUNT}shuffler-client.crt" in shuffler
        assert any(a.startswith("--tls-cert=") for a in shuffler)


def test_compose_tls_override_runs_with_certificates_from_make_certs(tmp_path: Path) -> None:
    """The override's flags, with its paths mapped to this machine, start real daemons
    that serve TLS; the aggregator's health check (mutual TLS) and the shuffler's pass,
    and the certificates name the host the shufflers dial inside compose."""
    from crowdmix.cluster import DaemonProcess, free_port
    from crowdmix.health import check_health

    certs = tmp_path / "out"
    tokens = tmp_path / "tokens.txt"
    subprocess.run(["bash", str(DEPLOY / "make-token.sh"), str(tokens)], check=True, timeout=30)
    hosts = ["localhost", "127.0.0.1", "aggregator", "shuffler-1", "shuffler-2"]
    header = (DEPLOY / "compose.tls.yaml").read_text()
    assert f"make-certs.sh deploy/tls/out {' '.join(hosts)}" in header  # the documented call
    subprocess.run(
        ["bash", str(DEPLOY / "tls/make-certs.sh"), str(certs), *hosts],
        check=True,
        capture_output=True,
        timeout=60,
    )
    crt = str(certs / "aggregator.crt")
    sans = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", crt],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert "DNS:aggregator" in sans

    services = _tls_override()["services"]
    agg_port, shuf_port = free_port(), free_port()

    def local(args: list[str]) -> list[str]:
        out = []
        for a in args:
            a = a.replace(TLS_MOUNT, f"{certs}/")
            a = a.replace("/etc/crowdmix/metrics.toml", str(DEPLOY / "metrics.example.toml"))
            a = a.replace("/etc/crowdmix/tokens.txt", str(tokens))
            a = a.replace("0.0.0.0:7500", f"127.0.0.1:{agg_port}")
            a = a.replace("0.0.0.0:7400", f"127.0.0.1:{shuf_port}")
            a = a.replace("aggregator:7500", f"localhost:{agg_port}")
            a = a.replace("/var/lib/crowdmix/", f"{tmp_path}/var/")
            if a.startswith(("--redis=", "--metrics-port=", "--metrics-host=")):
                continue  # in-memory stores, no metrics endpoint: not what is tested here
            out.append(a)
        return out

    # the base file's one-shot `keys` service makes the key set both daemons need
    for d in ("keys", "public"):
        (tmp_path / "var" / d).mkdir(parents=True)
    keys_cmd = local(_compose()["services"]["keys"]["command"])
    for _ in range(2):  # a second start keeps the key set (--if-missing)
        made = subprocess.run(
            [sys.executable, "-m", "crowdmix", *keys_cmd], capture_output=True, text=True
        )
        assert made.returncode == 0, made.stderr
    assert "kept" in made.stdout
    agg = DaemonProcess(
        "aggregator", local(services["aggregator"]["command"]), agg_port, tmp_path / "agg.log"
    )
    shuf = DaemonProcess(
        "shuffler", local(services["shuffler-1"]["command"]), shuf_port, tmp_path / "shuf.log"
    )
    agg.start()
    try:
        shuf.start()
        try:
            for daemon, svc in ((agg, "aggregator"), (shuf, "shuffler-1")):
                health = local(services[svc]["healthcheck"]["test"][3:])
                flags = dict(a.removeprefix("--").split("=", 1) for a in health if "=" in a)
                read = {k: Path(v).read_bytes() for k, v in flags.items()}
                deadline = time.monotonic() + 30
                while True:
                    assert health[-1] in ("127.0.0.1:7500", "127.0.0.1:7400")
                    port = agg_port if svc == "aggregator" else shuf_port
                    status = check_health(
                        f"127.0.0.1:{port}",
                        tls_ca=read["tls-ca"],
                        tls_cert=read.get("tls-cert"),
                        tls_key=read.get("tls-key"),
                    )
                    if status == "SERVING" or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
                assert status == "SERVING", (svc, status, daemon.tail_log())
            # without the client certificate the aggregator refuses the connection
            no_cert = check_health(f"127.0.0.1:{agg_port}", tls_ca=read["tls-ca"])
            assert no_cert.startswith("UNREACHABLE")
        finally:
            assert shuf.stop() == 0
    finally:
        assert agg.stop() == 0


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_the_container_user_can_read_every_mounted_secret_but_not_the_ca_key() -> None:
    """The image runs as uid/gid 65534: as that user (setpriv, as root here), every
    file compose.tls.yaml mounts and the token file load; the CA key does not."""
    work = Path(tempfile.mkdtemp(prefix="crowdmix-deploy-"))
    try:
        work.chmod(0o755)  # the unprivileged user must reach the files, as in a container
        certs, tokens = work / "out", work / "tokens.txt"
        subprocess.run(
            ["bash", str(DEPLOY / "tls/make-certs.sh"), str(certs), "localhost"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        subprocess.run(["bash", str(DEPLOY / "make-token.sh"), str(tokens)], check=True)
        mounted = sorted(
            {v.split(":")[0].removeprefix("./tls/out/")
             for svc in _tls_override()["services"].values() for v in svc["volumes"]}
        )  # fmt: skip
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        read = (
            "import sys; from shuffler.config import load_tokens; load_tokens(sys.argv[1]);"
            "[open(p, 'rb').read() for p in sys.argv[2:]]"
        )
        files = [str(certs / name) for name in mounted]
        ok = subprocess.run(
            [*as_nobody, sys.executable, "-c", read, str(tokens), *files],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        ca_key = subprocess.run(
            [*as_nobody, sys.executable, "-c", "open(__import__('sys').argv[1]).read()",
             str(certs / "ca.key")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert ca_key.returncode != 0 and "Permission denied" in ca_key.stderr
        assert (certs / "ca.key").stat().st_mode & 0o077 == 0
    finally:
        shutil.rmtree(work)


def test_dockerignore_keeps_the_build_context_small() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "crowdmix-out", "deploy/tls/out", "deploy/tokens.txt"} <= set(ignored)


def test_health_client_certificate_flags_go_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from crowdmix.cli import main

    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    assert main(["health", "--tls-ca", str(ca), "--tls-cert", str(ca), "127.0.0.1:1"]) == 1
    assert "--tls-key" in capsys.readouterr().err
    assert main(["health", "--tls-ca", str(tmp_path / "missing.crt"), "127.0.0.1:1"]) == 1
    assert "missing.crt" in capsys.readouterr().err


def test_compose_runs_the_aggregators_redis_with_fsync_always() -> None:
    """README: the aggregator's Redis must fsync before every reply."""
    import yaml

    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    command = services["redis-aggregator"]["command"]
    assert command[command.index("--appendfsync") + 1] == "always"


def test_compose_cluster_variant_runs_every_daemon_on_the_cluster_with_wait() -> None:
    """deploy/compose.cluster.yaml: six cluster nodes (AOF always) joined once by
    ``redis-cli --cluster create --cluster-replicas 1``; two shufflers and two aggregators
    whose ``--redis`` is a cluster URL naming those nodes, with ``--min-replicas-ack=1``."""
    from crowdmix.core.redis_url import parse_cluster_url

    data = yaml.safe_load((DEPLOY / "compose.cluster.yaml").read_text())
    services = data["services"]
    nodes = {n for n in services if n.startswith("redis-") and n != "redis-cluster-init"}
    assert len(nodes) == 6
    for n in nodes:
        command = services[n]["command"]
        assert command[:3] == ["redis-server", "--cluster-enabled", "yes"]
        assert command[command.index("--appendfsync") + 1] == "always"
        assert command[command.index("--cluster-announce-hostname") + 1] == n
    init = services["redis-cluster-init"]
    assert "--cluster create --cluster-replicas 1" in init["command"][0]
    assert all(n in init["command"][0] for n in nodes)
    assert set(init["depends_on"]) == nodes
    parser = build_parser()
    daemons = ["aggregator-1", "aggregator-2", "shuffler-1", "shuffler-2"]
    for name in daemons:
        args = parser.parse_args(services[name]["command"])
        seeds = parse_cluster_url(args.redis).nodes
        assert {host for host, _ in seeds} <= nodes
        assert args.min_replicas_ack == 1
        assert "redis-cluster-init" in services[name]["depends_on"]
    targets = {parser.parse_args(services[s]["command"]).aggregator for s in daemons[2:]}
    assert targets == {"aggregator-1:7500", "aggregator-2:7500"}


def test_the_example_ledger_states_what_the_current_bounds_give() -> None:
    """deploy/ledger.example.json: every release's ε is what the privacy statement gives
    today for its crowd and rounds (the removed variation-ratio figure understated it)."""
    from crowdmix.aggregator.accounting import JsonFileLedgerStore, PrivacyLedger
    from crowdmix.aggregator.accounting.statement import privacy_statement
    from crowdmix.core.basic import BasicParams
    from crowdmix.core.registry import MetricConfig, ShufflePolicy

    ledger = PrivacyLedger(JsonFileLedgerStore(DEPLOY / "ledger.example.json", create=False))
    releases = ledger.releases("browser")
    assert releases
    for r in releases:
        assert r.bound != "variation-ratio"
        metric = MetricConfig(
            name="browser",
            basic=BasicParams(mechanism=r.mechanism, epsilon=r.segment["epsilon0"],  # type: ignore[index, arg-type]
                              domain_size=5),
            shuffle=ShufflePolicy(min_batch=500, max_batch=50000),
        )  # fmt: skip
        stated = privacy_statement(
            metric, r.n_reports, batch_sizes=r.batch_sizes, rounds=r.rounds,
            smallest_crowd=min(r.batch_sizes),
        )  # fmt: skip
        # the same figure up to floating-point noise across platforms and library versions
        # (numpy 2.4 / scipy 1.17 / dp_accounting 0.6 move it by 8e-12 relative)
        assert r.epsilon == pytest.approx(stated.longitudinal.epsilon, rel=1e-9)
