"""Every subcommand, given bad input, answers with one clear line and a non-zero exit.

Missing files, unreadable files, dead ports, a port in use, bad values and wrong
types. For each case: the exit code is not 0 (for the daemons, the one
docs/operating.md gives: 1 bad configuration, 4 cannot bind, 5 store unavailable),
no "Traceback" (and no gRPC C-core log line such as ``E1123 ... add_port.cc``)
appears, and the last line on stderr is ``... error: ...`` naming the problem (the
fragments given).

The commands that start daemons or open gRPC channels (``SUBPROCESS``) run as an
outsider runs them: the installed ``crowdmix`` command in a subprocess, where a C
core log line or a daemon that starts anyway would show. The rest run in-process
through ``crowdmix.cli.main(argv)`` (the same code path less the interpreter's
start-up), which keeps the table fast.

"Unreadable" uses a directory in place of a file: the tests run as root, for
whom ``chmod 000`` does not stop a read, but reading a directory fails for
everyone.

The subprocess cases run concurrently in one module fixture; each case is still
its own test in the report.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.service.helpers import REGISTRY_TOML

ROOT = Path(__file__).resolve().parents[2]
C_CORE_LOG = re.compile(r"^[EWID]\d{4} \d\d:\d\d:\d\d")
TOKEN = "0123456789abcdef0123456789abcdef"


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    names: str | tuple[str, ...]  # fragments the error line must contain (after formatting)
    exit: int | None = None  # the exit code docs/operating.md gives, where it gives one


def _cases() -> list[Case]:
    c = Case
    cfg = ("--config", "{config}")
    rap = ("--rappor-counts", "{rcounts}", "--rappor-map", "{rmap}", "--rappor-params", "{rparams}")
    serve_s = ("shuffler", "serve", "--tokens", "{tokens}")
    return [
        # demo
        c("demo-min-batch-above-clients", ("demo", "--clients", "1000", "--min-batch", "2000"),
          "--min-batch"),
        c("demo-dead-redis", ("demo", "--clients", "100", "--redis", "redis://127.0.0.1:{dead}"),
          "127.0.0.1:{dead}"),
        c("demo-clients-wrong-type", ("demo", "--clients", "many"), "--clients"),
        c("demo-clients-zero", ("demo", "--clients", "0"), "--clients"),
        c("demo-distribution", ("demo", "--clients", "100", "--distribution", "pareto"),
          "pareto"),
        c("demo-bad-k", ("demo", "--clients", "100", "-k", "0"), "k"),
        c("demo-p-not-below-q", ("demo", "-p", "0.9"), "p must be below q", exit=1),
        c("demo-bad-f", ("demo", "--clients", "100", "-f", "2"), "f"),
        c("demo-out-under-a-file", ("demo", "--clients", "200", "--out", "{file}/sub"),
          "{file}"),
        # info
        c("info-bad-p", ("info", "-p", "2"), "p"),
        c("info-wrong-type", ("info", "-k", "sixteen"), "-k"),
        # health
        c("health-dead-port", ("health", "127.0.0.1:{dead}", "--timeout", "0.5"),
          "127.0.0.1:{dead}"),
        c("health-missing-ca", ("health", "127.0.0.1:{dead}", "--tls-ca", "{missing}"),
          "{missing}"),
        c("health-bad-target", ("health", "no-port-here", "--timeout", "0.5"), "no-port-here"),
        # aggregator serve
        c("aggregator-missing-config", ("aggregator", "serve", "--config", "{missing}"),
          ("{missing}", "does not exist"), exit=1),
        c("aggregator-bad-field", ("aggregator", "serve", "--config", "{zerok}"), "'pages': k",
          exit=1),
        c("aggregator-histogram-without-keys",
          ("aggregator", "serve", "--config", "{histogram}", "--listen", "127.0.0.1:0"),
          ("'screens' is a shuffled histogram and needs sealed reports", "--keys"), exit=1),
        c("aggregator-unreadable-config", ("aggregator", "serve", "--config", "{dir}"), "{dir}"),
        c("aggregator-garbage-config", ("aggregator", "serve", "--config", "{garbage}"),
          "{garbage}"),
        c("aggregator-port-in-use", ("aggregator", "serve", *cfg, "--listen", "127.0.0.1:{busy}"),
          "cannot listen on 127.0.0.1:{busy}", exit=4),
        c("aggregator-bad-listen", ("aggregator", "serve", *cfg, "--listen", "nowhere"),
          "nowhere"),
        c("aggregator-metrics-port-in-use",
          ("aggregator", "serve", *cfg, "--listen", "127.0.0.1:0", "--metrics-port", "{busy}"),
          "{busy}", exit=4),
        c("aggregator-dead-redis",
          ("aggregator", "serve", *cfg, "--listen", "127.0.0.1:0", "--redis",
           "redis://127.0.0.1:{dead}"), ("redis unavailable", "127.0.0.1:{dead}"), exit=5),
        c("aggregator-dead-cluster",
          ("aggregator", "serve", *cfg, "--listen", "127.0.0.1:0", "--redis",
           "redis+cluster://127.0.0.1:{dead}"), "127.0.0.1:{dead}"),
        c("aggregator-wait-negative", ("aggregator", "serve", *cfg, "--min-replicas-ack", "-1"),
          "--min-replicas-ack"),
        c("aggregator-missing-cert",
          ("aggregator", "serve", *cfg, "--tls-cert", "{missing}", "--tls-key", "{missing}"),
          "{missing}"),
        c("aggregator-cert-without-key", ("aggregator", "serve", *cfg, "--tls-cert", "x.crt"),
          "--tls-key", exit=1),
        c("aggregator-workers-zero", ("aggregator", "serve", *cfg, "--workers", "0"), "--workers"),
        c("aggregator-metrics-port-type", ("aggregator", "serve", *cfg, "--metrics-port", "x"),
          "--metrics-port"),
        # shuffler serve
        c("shuffler-missing-config", (*serve_s, "--config", "{missing}"), "{missing}"),
        c("shuffler-unreadable-config", (*serve_s, "--config", "{dir}"), "{dir}"),
        c("shuffler-garbage-config", (*serve_s, "--config", "{garbage}"), "{garbage}"),
        c("shuffler-bad-field", (*serve_s, "--config", "{zerobatch}"), "'pages': min_batch",
          exit=1),
        c("shuffler-histogram-without-keys",
          (*serve_s, "--config", "{histogram}", "--listen", "127.0.0.1:0"),
          ("'screens' is a shuffled histogram and needs sealed reports", "--public-keys"),
          exit=1),
        c("shuffler-port-in-use", (*serve_s, *cfg, "--listen", "127.0.0.1:{busy}"),
          "cannot listen on 127.0.0.1:{busy}", exit=4),
        c("shuffler-bad-listen", (*serve_s, *cfg, "--listen", "nowhere"), "nowhere"),
        c("shuffler-metrics-port-in-use",
          (*serve_s, *cfg, "--listen", "127.0.0.1:0", "--metrics-port", "{busy}"), "{busy}",
          exit=4),
        c("shuffler-dead-redis",
          (*serve_s, *cfg, "--listen", "127.0.0.1:0", "--redis", "redis://127.0.0.1:{dead}"),
          ("store unavailable", "127.0.0.1:{dead}"), exit=5),
        c("shuffler-dead-cluster",
          (*serve_s, *cfg, "--listen", "127.0.0.1:0", "--redis",
           "redis+cluster://127.0.0.1:{dead}"), "127.0.0.1:{dead}"),
        c("shuffler-cluster-db", (*serve_s, *cfg, "--redis", "redis+cluster://h:1/3"),
          "only database 0"),
        c("shuffler-wait-negative",
          (*serve_s, *cfg, "--redis", "redis://h:1/0", "--min-replicas-ack", "-1"),
          "min_replicas_ack"),
        c("shuffler-missing-tokens", ("shuffler", "serve", *cfg, "--tokens", "{missing}"),
          "{missing}"),
        c("shuffler-unreadable-tokens", ("shuffler", "serve", *cfg, "--tokens", "{dir}"),
          "{dir}"),
        c("shuffler-no-tokens", ("shuffler", "serve", *cfg, "--listen", "127.0.0.1:0"),
          ("--tokens", "tokens_file", "--allow-unauthenticated", "allow_unauthenticated = true")),
        c("shuffler-placeholder-token",
          ("shuffler", "serve", *cfg, "--tokens", "{placeholder}", "--listen", "127.0.0.1:0"),
          ("placeholder", "--allow-unauthenticated", "allow_unauthenticated = true")),
        c("shuffler-missing-cert",
          (*serve_s, *cfg, "--tls-cert", "{missing}", "--tls-key", "{missing}"), "{missing}"),
        c("shuffler-processes-zero", (*serve_s, *cfg, "--processes", "0"), "--processes"),
        c("shuffler-processes-without-redis", (*serve_s, *cfg, "--processes", "2"), "--redis",
          exit=1),
        c("shuffler-rate-wrong-type", (*serve_s, *cfg, "--rate-limit", "fast"), "--rate-limit"),
        # the threaded server is gone: its setting is refused by name
        c("shuffler-unknown-setting", (*serve_s, "--config", "{syncconfig}"), "['server']"),
        c("shuffler-server-flag-gone", (*serve_s, *cfg, "--server", "sync"), "--server"),
        # a wrong type in the table, an empty URL: the field named, no "unexpected" error
        c("shuffler-listen-wrong-type", (*serve_s, "--config", "{intlisten}"),
          "listen must be a string"),
        c("shuffler-empty-redis", (*serve_s, *cfg, "--redis", ""), "redis must be a redis://"),
        # simulate
        c("simulate-dead-target",
          ("simulate", "--target", "127.0.0.1:{dead}", *cfg, "--metric", "pages", "--token",
           TOKEN, "--clients", "20"), "127.0.0.1:{dead}"),
        c("simulate-unary-dead-target",
          ("simulate", "--target", "127.0.0.1:{dead}", *cfg, "--metric", "pages", "--token",
           TOKEN, "--clients", "20", "--mode", "unary", "--concurrency", "2"),
          "127.0.0.1:{dead}"),
        c("simulate-missing-token-file",
          ("simulate", "--target", "127.0.0.1:{dead}", *cfg, "--metric", "pages",
           "--token-file", "{missing}"), "{missing}"),
        c("simulate-unreadable-token-file",
          ("simulate", "--target", "127.0.0.1:{dead}", *cfg, "--metric", "pages",
           "--token-file", "{dir}"), "{dir}"),
        c("simulate-missing-tls-ca",
          ("simulate", "--target", "127.0.0.1:{dead}", *cfg, "--metric", "pages", "--tls-ca",
           "{missing}"), "{missing}"),
        c("simulate-unknown-metric",
          ("simulate", "--target", "127.0.0.1:{dead}", *cfg, "--metric", "nope"),
          "metric 'nope' is not in", exit=1),
        c("simulate-garbage-config",
          ("simulate", "--target", "127.0.0.1:{dead}", "--config", "{garbage}", "--metric",
           "pages"), "{garbage}"),
        c("simulate-truth-out-under-a-file",
          ("simulate", "--target", "127.0.0.1:{dead}", *cfg, "--metric", "pages", "--token",
           TOKEN, "--truth-out", "{file}/x.csv", "--clients", "5"), "{file}"),
        # privacy, plan
        c("privacy-amplify-n-wrong-type", ("privacy", "amplify", "--n", "lots"), "--n"),
        c("privacy-amplify-bad-delta", ("privacy", "amplify", "--n", "1000", "--delta", "2"),
          "delta"),
        c("privacy-amplify-negative-eps",
          ("privacy", "amplify", "--n", "1000", "--epsilon0", "-1"), "psilon"),
        c("privacy-compose-bad-releases",
          ("privacy", "compose", "--epsilon", "1", "--releases", "0"), "releases"),
        c("privacy-rounds-zero",
          ("privacy", "rounds", "--epsilon0", "1", "--n", "1000", "--rounds", "0"), "rounds"),
        c("privacy-metric-missing-config",
          ("privacy", "metric", "--config", "{missing}", "--metric", "pages", "--n", "1000"),
          "{missing}"),
        c("privacy-metric-unknown-metric",
          ("privacy", "metric", *cfg, "--metric", "nope", "--n", "1000"), "nope"),
        c("privacy-ledger-unreadable", ("privacy", "ledger", "--file", "{dir}", "--metric", "a"),
          "{dir}"),
        c("privacy-ledger-garbage", ("privacy", "ledger", "--file", "{garbage}", "--metric", "a"),
          "{garbage}"),
        c("plan-negative-epsilon",
          ("plan", "--epsilon", "-1", "--n", "100000", "--candidates", "10"), "psilon"),
        c("plan-wrong-type", ("plan", "--epsilon", "one", "--n", "1", "--candidates", "1"),
          "--epsilon"),
        # report
        c("report-out-is-a-file", ("report", *rap, "--out", "{file}"), "{file}"),
        c("report-missing-rappor-counts",
          ("report", "--rappor-counts", "{missing}", "--rappor-map", "{rmap}",
           "--rappor-params", "{rparams}", "--out", "{outdir}"), "{missing}"),
        c("report-unreadable-map",
          ("report", "--rappor-counts", "{rcounts}", "--rappor-map", "{dir}",
           "--rappor-params", "{rparams}", "--out", "{outdir}"), "{dir}"),
        c("report-garbage-counts",
          ("report", "--counts", "{garbage}", *cfg, "--metric", "pages", "--out", "{outdir}"),
          "{garbage}"),
        c("report-unreadable-counts",
          ("report", "--counts", "{dir}", *cfg, "--metric", "pages", "--out", "{outdir}"),
          "{dir}"),
        c("report-missing-candidates",
          ("report", "--counts", "{counts}", *cfg, "--metric", "pages", "--rounds", "1",
           "--candidates", "{missing}", "--out", "{outdir}"), "{missing}"),
        c("report-dead-redis",
          ("report", "--redis", "redis://127.0.0.1:{dead}", "--metric", "pages", "--out",
           "{outdir}"), "127.0.0.1:{dead}"),
        c("report-bad-windows",
          ("report", "--redis", "redis://127.0.0.1:{dead}", "--metric", "pages", "--windows",
           "soon", "--out", "{outdir}"), "soon"),
        c("report-bad-alpha", ("report", *rap, "--alpha", "2", "--out", "{outdir}"), "alpha"),
        c("report-unreadable-ledger",
          ("report", *rap, "--ledger", "{dir}", "--out", "{outdir}"), "{dir}"),
        c("report-rappor-with-rounds", ("report", *rap, "--rounds", "3", "--out", "{outdir}"),
          "--rounds"),
        # cluster
        c("cluster-dir-is-a-file", ("cluster", "--dir", "{file}"), "{file}"),
        c("cluster-wait-without-cluster",
          ("cluster", "--dir", "{outdir}", "--min-replicas-ack", "1"), "--redis-cluster"),
        c("cluster-aggregators-zero", ("cluster", "--dir", "{outdir}", "--aggregators", "0"),
          "--aggregators"),
        c("cluster-shufflers-zero", ("cluster", "--dir", "{outdir}", "--shufflers", "0"),
          "--shufflers"),
        c("cluster-missing-config", ("cluster", "--dir", "{outdir}", "--config", "{missing}"),
          "{missing}"),
        # counts
        c("counts-list-dead-redis", ("counts", "list", "--redis", "redis://127.0.0.1:{dead}"),
          "127.0.0.1:{dead}"),
        c("counts-export-dead-redis",
          ("counts", "export", "--redis", "redis://127.0.0.1:{dead}", "--metric", "pages",
           "--out", "{outdir}/c.npz"), "127.0.0.1:{dead}"),
        c("counts-export-bad-windows",
          ("counts", "export", "--redis", "redis://127.0.0.1:{dead}", "--metric", "pages",
           "--windows", "x-y", "--out", "{outdir}/c.npz"), "x-y"),
    ]  # fmt: skip


CASES = _cases()


def _files(tmp: Path) -> dict[str, str]:
    import numpy as np

    from crowdmix.aggregator.counting import accumulator_for
    from crowdmix.aggregator.counting.files import save_counts
    from crowdmix.core.registry import load_registry

    (tmp / "metrics.toml").write_text(REGISTRY_TOML)
    (tmp / "zero-k.toml").write_text(REGISTRY_TOML.replace("k = 20", "k = 0"))
    (tmp / "zero-min-batch.toml").write_text(
        REGISTRY_TOML.replace("min_batch = 10", "min_batch = 0")
    )
    (tmp / "sync.toml").write_text(REGISTRY_TOML + '\n[shuffler]\nserver = "sync"\n')
    (tmp / "intlisten.toml").write_text(REGISTRY_TOML + "\n[shuffler]\nlisten = 7400\n")
    (tmp / "histogram.toml").write_text(
        '[metrics.screens]\nencoding = "shuffled-histogram"\ndomain_size = 12\nfake_slots = 3\n'
        "fake_probability = 0.5\n"
    )
    (tmp / "a-directory").mkdir()
    (tmp / "garbage").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe not [toml] = = ,,,\n")
    (tmp / "a-file").write_text("not a directory\n")
    (tmp / "tokens").write_text(f"app {TOKEN}\n")
    # google/rappor files: k=8, h=2, m=2
    (tmp / "params.csv").write_text("k,h,m,p,q,f\n8,2,2,0.5,0.75,0.5\n")
    (tmp / "counts.csv").write_text("100,50,50,50,50,50,50,50,50\n100,50,50,50,50,50,50,50,50\n")
    (tmp / "map.csv").write_text("a,1,2,9,10\nb,3,4,11,12\n")
    pages = load_registry(tmp / "metrics.toml")["pages"]
    assert pages.rappor is not None
    counts = accumulator_for(
        pages,
        totals=np.full(pages.rappor.m, 10, dtype=np.int64),
        ones=np.full((pages.rappor.m, pages.rappor.k), 5, dtype=np.int64),
    )
    save_counts(
        tmp / "counts.npz",
        counts,
        metric="pages",
        encoding=pages.encoding,
        fingerprint=pages.fingerprint,
        window=1,
    )
    return {
        "config": str(tmp / "metrics.toml"),
        "syncconfig": str(tmp / "sync.toml"),
        "histogram": str(tmp / "histogram.toml"),
        "zerok": str(tmp / "zero-k.toml"),
        "zerobatch": str(tmp / "zero-min-batch.toml"),
        "intlisten": str(tmp / "intlisten.toml"),
        "missing": str(tmp / "no-such-file"),
        "dir": str(tmp / "a-directory"),
        "garbage": str(tmp / "garbage"),
        "file": str(tmp / "a-file"),
        "tokens": str(tmp / "tokens"),
        "placeholder": str(ROOT / "deploy" / "tokens.example.txt"),
        "rparams": str(tmp / "params.csv"),
        "rcounts": str(tmp / "counts.csv"),
        "rmap": str(tmp / "map.csv"),
        "counts": str(tmp / "counts.npz"),
        "outdir": str(tmp / "out"),
    }


SUBPROCESS = {"shuffler", "aggregator", "cluster", "health", "simulate"}


def _in_process(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``crowdmix ARGS`` through ``main(argv)``: exit code, stdout and stderr."""
    import contextlib
    import io
    import os

    from crowdmix.cli import main

    out, err = io.StringIO(), io.StringIO()
    here = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # a traceback the user would see
                import traceback

                traceback.print_exc(file=err)
                code = 1
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def _crowdmix() -> str:
    """The installed console script next to this interpreter (as a user runs it)."""
    script = Path(sys.executable).parent / "crowdmix"
    return str(script) if script.exists() else (shutil.which("crowdmix") or "crowdmix")


@pytest.fixture(scope="module")
def outcomes(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[Case, subprocess.CompletedProcess[str], dict[str, str]]]]:
    tmp = tmp_path_factory.mktemp("bad-input")
    files = _files(tmp)
    # "dead": bound but not listening, so a connect is refused and no other process (a
    # test run beside this one) can start a server there while the table runs
    with socket.socket() as busy, socket.socket() as dead:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        files["busy"] = str(busy.getsockname()[1])
        dead.bind(("127.0.0.1", 0))
        files["dead"] = str(dead.getsockname()[1])

        def run(case: Case) -> tuple[Case, subprocess.CompletedProcess[str], dict[str, str]]:
            args = [a.format(**files) for a in case.args]
            try:
                proc = subprocess.run(
                    [_crowdmix(), *args],
                    capture_output=True,
                    text=True,
                    timeout=45,
                    cwd=tmp,
                    stdin=subprocess.DEVNULL,
                )
            except subprocess.TimeoutExpired as exc:  # a daemon that started: not refused
                out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
                err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
                proc = subprocess.CompletedProcess(args, 0, out, err + "\n(still running)")
            return case, proc, files

        with ThreadPoolExecutor(max_workers=4) as pool:
            done = list(pool.map(run, [c for c in CASES if c.args[0] in SUBPROCESS]))
        for case in CASES:
            if case.args[0] not in SUBPROCESS:
                args = [a.format(**files) for a in case.args]
                done.append((case, _in_process(args, tmp), files))
        yield {case.id: (case, proc, f) for case, proc, f in done}


@pytest.mark.parametrize("case_id", [c.id for c in CASES])
def test_bad_input_gives_one_clear_line_and_a_failing_exit(
    outcomes: dict[str, tuple[Case, subprocess.CompletedProcess[str], dict[str, str]]],
    case_id: str,
) -> None:
    case, proc, files = outcomes[case_id]
    shown = f"$ crowdmix {' '.join(case.args)}\nexit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    assert proc.returncode != 0, shown
    assert "Traceback" not in proc.stderr + proc.stdout, shown
    noise = [ln for ln in proc.stderr.splitlines() if C_CORE_LOG.match(ln)]
    assert not noise, shown
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines, shown
    last = lines[-1]
    assert re.match(r"^crowdmix( [a-z-]+)*: error: ", last), shown
    for fragment in (case.names,) if isinstance(case.names, str) else case.names:
        assert fragment.format(**files) in last, shown
    if case.exit is not None:
        assert proc.returncode == case.exit, shown
    assert sum("error:" in ln for ln in lines) == 1, shown


def test_python_m_crowdmix_exits_with_the_daemons_codes(
    outcomes: dict[str, tuple[Case, subprocess.CompletedProcess[str], dict[str, str]]],
) -> None:
    """``python -m crowdmix`` (crowdmix/__main__.py) exits with the code ``main()``
    returns, as the console script the table runs does: 4 for a busy port, 5 for a
    store that does not answer."""
    _, _, files = outcomes["shuffler-port-in-use"]
    shuffler = ("shuffler", "serve", "--tokens", files["tokens"], "--config", files["config"])
    dead = ("aggregator", "serve", "--config", files["config"], "--listen", "127.0.0.1:0")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        runs = {
            4: (*shuffler, "--listen", f"127.0.0.1:{busy.getsockname()[1]}"),
            5: (*dead, "--redis", f"redis://127.0.0.1:{files['dead']}"),
        }
        for code, args in runs.items():
            proc = subprocess.run(
                [sys.executable, "-m", "crowdmix", *args],
                capture_output=True,
                text=True,
                timeout=45,
                stdin=subprocess.DEVNULL,
            )
            assert proc.returncode == code, proc.stderr
