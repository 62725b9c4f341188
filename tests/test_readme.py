"""The README's promises cannot rot: the quick-start commands run, the SDK snippet runs
against a real shuffler, and the documentation's plan/privacy commands and the SDK
walkthrough (docs/sdk.md) run as written. tests/test_docs.py checks that every
``crowdmix`` command line of every page parses."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from crowdmix.cli import build_parser
from tests.doc_pages import code_blocks, crowdmix_commands

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = [README, *(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))]


def _code_blocks(lang: str = "", text: str = README) -> list[str]:
    return code_blocks(text, lang)


def _crowdmix_commands(texts: list[str] = DOCS) -> list[list[str]]:
    return [argv for text in texts for argv in crowdmix_commands(text)]


def test_readme_names_the_two_commands_and_ci_runs_the_test_one() -> None:
    quick = _code_blocks()[1]
    assert "scripts/crowdmix demo" in quick and "scripts/check" in quick
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec scripts/check" in ci


def test_every_crowdmix_command_of_the_docs_parses() -> None:
    commands = _crowdmix_commands()
    assert len(commands) >= 12
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv)  # exits (fails the test) on an unknown flag
        assert getattr(args, "func", None) is not None, argv


@pytest.mark.slow
def test_quick_start_run_command_works(tmp_path: Path) -> None:
    # The exact README command (scripts/crowdmix bootstraps .venv, then runs), at a
    # smaller population so the suite stays quick.
    out = subprocess.run(
        [str(ROOT / "scripts" / "crowdmix"), "demo", "--clients", "20000", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "95% interval" in out.stdout and "true" in out.stdout
    assert "total variation distance" in out.stdout
    assert "Privacy:" in out.stdout and "δ = 1e-06" in out.stdout
    assert {p.name for p in tmp_path.iterdir()} >= {"results.csv", "summary.json", "plot.png"}


@pytest.mark.slow  # computes the privacy figures of each example: the full check runs it
def test_planner_and_privacy_commands_of_the_docs_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # Through crowdmix.cli.main, from the repository (the documented paths are relative
    # to it): the commands' own code, without a new interpreter per command
    # (tests/test_smoke.py and the quick start above start one).
    import contextlib
    import io

    from crowdmix.cli import main

    runnable = [c for c in _crowdmix_commands() if c[0] in ("plan", "privacy")]
    assert any(c[0] == "plan" for c in runnable)
    monkeypatch.chdir(ROOT)
    for argv in runnable:
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(argv)
        assert code == 0, (argv, err.getvalue())


def test_sdk_snippet_runs_against_a_real_shuffler(tmp_path: Path) -> None:
    """The README's SDK snippet is the core of examples/daily_setting.py, line for line,
    and it runs: one sealed report per day, a second start makes none."""
    import time

    from crowdmix.aggregator.sealing.keys import KeySet, write_public_config
    from crowdmix.config_cmd import export_config
    from crowdmix.core.basic import BasicParams
    from crowdmix.core.registry import MetricConfig, Registry, ShufflePolicy
    from crowdmix.shuffler.config import ShufflerSettings
    from crowdmix.shuffler.config_service import is_sealed_queue
    from crowdmix.shuffler.server import start_shuffler

    snippet = _code_blocks("python")[0]
    example = (ROOT / "examples" / "daily_setting.py").read_text()
    example_lines = {line.strip() for line in example.splitlines()}
    in_constructor = False
    for line in snippet.splitlines():
        if line.startswith("reporter ="):
            in_constructor = not line.rstrip().endswith(")")
            continue  # the example spells the constructor with its command line's values
        if in_constructor:
            in_constructor = line.strip() != ")"
            continue
        if line.startswith("import") or not line.strip():
            continue
        assert line.strip() in example_lines, line
    assert "client.Reporter(" in example

    registry = Registry(
        metrics={
            "theme": MetricConfig(
                name="theme",
                basic=BasicParams(mechanism="krr", epsilon=2.0, domain_size=3),
                domain=("light", "dark", "system"),
                shuffle=ShufflePolicy(min_batch=10),
            )
        }
    )
    token = "t" * 32
    keys, _ = KeySet().with_new_key(int(time.time()))
    write_public_config(tmp_path / "public.json", keys, now=time.time())
    settings = ShufflerSettings(public_keys=str(tmp_path / "public.json"))
    with start_shuffler(registry, tokens=frozenset({token}), settings=settings) as shuffler:
        target = f"127.0.0.1:{shuffler.port}"
        bundled = tmp_path / "crowdmix-config.pb"  # what `crowdmix config export` writes
        export_config(target, bundled, token=token, tls=False)
        code = snippet.replace('"shuffler.example:7400"', f'"{target}"')
        code = code.replace("tls=True", "tls=False")
        namespace: dict[str, object] = {
            "APP_TOKEN": token,
            "APP_DIR": tmp_path / "app",
            "BUNDLED_CONFIG": bundled,
            "theme": "dark",
        }
        exec(compile(code, "README.md", "exec"), namespace)
        assert (bool(namespace["result"]), namespace["left"]) == (True, 0)
        assert sum(shuffler.store.pending("theme").values()) == 1
        # "sealed": the one stored report sits in a sealed queue (an opaque row)
        assert all(is_sealed_queue(q.fingerprint) for q in shuffler.store.pending("theme"))
        again = dict(namespace)
        exec(compile(code, "README.md", "exec"), again)  # the app starts again today
        assert (again["result"].status.value, again["left"]) == (  # type: ignore[attr-defined]
            "already_reported_this_window",
            0,
        )
        assert sum(shuffler.store.pending("theme").values()) == 1  # nothing more sent


@pytest.mark.slow  # a local cluster: two redis-servers, two shufflers, an aggregator
def test_the_sdk_walkthrough_runs_against_crowdmix_cluster_as_written(tmp_path: Path) -> None:
    """docs/sdk.md's two commands, parsed out of it and run as written (only the
    directories moved under the test's own, and PORT replaced by what the cluster
    prints): the cluster registers ``theme``, serves without TLS, and its
    ``app-token.txt`` is the file the example reads."""
    import signal

    sdk = (ROOT / "docs" / "sdk.md").read_text()
    (block,) = [
        b for b in _code_blocks(text=sdk) if "examples/daily_setting.py" in b and "cluster" in b
    ]
    lines = [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line]
    (cluster_argv,) = [w for w in lines if w[:2] == ["crowdmix", "cluster"]]
    (export_argv,) = [w for w in lines if w[:3] == ["crowdmix", "config", "export"]]
    (app_argv,) = [w for w in lines if w[:2] == ["python", "examples/daily_setting.py"]]
    moved = {
        "/tmp/crowdmix-cluster": str(tmp_path / "cluster"),
        "/tmp/crowdmix-app": str(tmp_path / "app"),
        "/tmp/crowdmix-config.pb": str(tmp_path / "config.pb"),
    }

    def here(words: list[str]) -> list[str]:
        out = []
        for w in words:
            for old, new in moved.items():
                w = w.replace(old, new)
            out.append(w)
        return out

    cluster = subprocess.Popen(
        [sys.executable, "-m", "crowdmix", *here(cluster_argv)[1:]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert cluster.stdout is not None
        printed = []
        while not printed or not printed[-1].startswith("Stop with"):
            line = cluster.stdout.readline()
            assert line, "".join(printed) + (cluster.stderr.read() if cluster.stderr else "")
            printed.append(line)
        target = next(ln.split()[1] for ln in printed if ln.strip().startswith("shuffler-1"))
        assert any("--insecure" in ln and "app-token.txt" in ln for ln in printed)
        argv = [w.replace("127.0.0.1:PORT", target) for w in here(export_argv)]
        export = subprocess.run(
            [sys.executable, "-m", *argv], capture_output=True, text=True, cwd=ROOT, timeout=120
        )
        assert export.returncode == 0, export.stderr
        argv = [w.replace("127.0.0.1:PORT", target) for w in here(app_argv)]
        run = subprocess.run(
            [sys.executable, *argv[1:]], capture_output=True, text=True, cwd=ROOT, timeout=120
        )
        assert run.returncode == 0, run.stderr
        assert "reported theme for this window" in run.stdout, run.stdout + run.stderr
        assert "0 report(s) waiting" in run.stdout
        cluster.send_signal(signal.SIGTERM)
        out, _ = cluster.communicate(timeout=90)
        assert cluster.returncode == 0, out
    finally:
        if cluster.poll() is None:
            cluster.kill()
            cluster.wait(timeout=30)
