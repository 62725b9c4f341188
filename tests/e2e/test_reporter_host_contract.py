"""What an app can count on from ``client.Reporter``, as telemetry SDKs promise their hosts.

Construction raises for a programmer's error (a target without a port, an unreadable
bundled config). After it, nothing raises into the app and ``report`` never waits for
the network (tests/e2e/test_reporter.py: not even on an expired cached config): it
returns a result saying what it did. A config exported at build time
(``crowdmix config export``) lets the first report be made offline, encoded. A
refusal that retrying cannot fix (a wrong token, TLS against a plaintext port) is
logged at WARNING once and named in ``last_error``. Real shufflers on loopback.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from crowdmix import client
from crowdmix.cli import main
from crowdmix.cluster import free_port
from crowdmix.shuffler.server import ShufflerHandle
from tests.e2e.config_server import TOKEN
from tests.shuffler.helpers import OUE, RAPPOR

pytestmark = pytest.mark.slow  # real servers, seconds each

ReportStatus = client.ReportStatus


def test_a_bundled_config_makes_the_first_report_offline_encoded(
    sealed_shuffler: ShufflerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = f"127.0.0.1:{sealed_shuffler.port}"
    bundled = tmp_path / "crowdmix-config.pb"
    token_file = tmp_path / "token.txt"
    token_file.write_text(f"my-app {TOKEN}\n")
    argv = ["config", "export", "--shuffler", target, "--token-file", str(token_file)]
    assert main([*argv, "--out", str(bundled), "--insecure"]) == 0
    assert f"wrote {bundled}: metrics {OUE}, {RAPPOR}; 1 public key" in capsys.readouterr().out
    offline = f"127.0.0.1:{free_port()}"  # the first launch: no network
    app = tmp_path / "app"
    with client.Reporter(
        app, offline, token=TOKEN, tls=False, background=False, bundled_config=bundled
    ) as r:
        made = r.report(RAPPOR, "example.com")
        assert made.status is ReportStatus.CLAIMED, made
        assert r.flush(timeout=1) == 1  # waits for the network
    for f in app.iterdir():  # what waits is the encoded report, never the value
        assert b"example.com" not in f.read_bytes(), f
    with client.Reporter(
        app, target, token=TOKEN, tls=False, background=False, bundled_config=bundled
    ) as r:
        assert r.flush(timeout=10) == 0  # a fresh config fetched, the report sealed and sent
        assert r.counters() == {"delivered": 1}
        assert r.report(RAPPOR, "example.com").status is ReportStatus.ALREADY_REPORTED_THIS_WINDOW
    assert sum(sealed_shuffler.store.pending(RAPPOR).values()) == 1


def test_config_export_says_what_is_wrong_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "c.pb")
    assert main(["config", "export", "--shuffler", "localhost", "--out", out]) == 1
    assert "'localhost' has no port" in capsys.readouterr().err
    dead = f"127.0.0.1:{free_port()}"
    assert main(["config", "export", "--shuffler", dead, "--out", out, "--insecure"]) == 1
    err = capsys.readouterr().err
    assert "cannot fetch the config" in err and "Traceback" not in err
    assert not (tmp_path / "c.pb").exists()


def test_programmer_errors_raise_at_construction_naming_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="without a scheme"):
        client.Reporter(tmp_path / "a", "http://shuffler.example:7400")
    with pytest.raises(ValueError, match=r"'shuffler\.example' has no port"):
        client.Reporter(tmp_path / "a", "shuffler.example")
    with pytest.raises(ValueError, match=r"bundled_config '.*nope\.pb'"):
        client.Reporter(tmp_path / "a", "127.0.0.1:1", bundled_config=tmp_path / "nope.pb")
    (tmp_path / "junk.pb").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError, match=r"junk\.pb' is not a config .*`crowdmix config export`"):
        client.Reporter(tmp_path / "a", "127.0.0.1:1", bundled_config=tmp_path / "junk.pb")
    with pytest.raises(ValueError, match="sealing"):
        client.Reporter(tmp_path / "a", "127.0.0.1:1", sealing="auto")  # type: ignore[arg-type]


def test_after_construction_nothing_raises_into_the_app(
    sealed_shuffler: ShufflerHandle, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = f"127.0.0.1:{sealed_shuffler.port}"
    r = client.Reporter(tmp_path / "app", target, token=TOKEN, tls=False, background=False)
    assert r.flush(timeout=10) == 0  # the config
    odd: list[object] = [None, 3.5, {"a": 1}, True, b"\xff" * 10_000]
    for value in odd:
        result = r.report(OUE, value)  # type: ignore[arg-type]
        assert result.status is ReportStatus.INVALID_VALUE and not result, value
    assert r.report(RAPPOR, 7).status is ReportStatus.INVALID_VALUE  # RAPPOR: str or bytes

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug in the encoder")

    r._encoder = broken  # type: ignore[assignment,method-assign]
    with caplog.at_level(logging.WARNING, logger="crowdmix.client"):
        result = r.report(RAPPOR, "x")
    assert result.status is ReportStatus.INTERNAL_ERROR and "a bug" in result.detail
    assert any("a bug in the encoder" in m for m in caplog.messages)
    del r._encoder

    def unwritable(*args: object, **kwargs: object) -> object:
        from crowdmix.client.outbox import OutboxError

        raise OutboxError("outbox app/outbox.sqlite3: database or disk is full")

    r._outbox.claim = unwritable  # type: ignore[method-assign]
    full_disk = r.report(RAPPOR, "x")
    assert full_disk.status is ReportStatus.OUTBOX_UNUSABLE and "disk is full" in full_disk.detail
    r.close()
    assert r.report(RAPPOR, "x").status is ReportStatus.CLOSED
    assert r.flush(timeout=1) == 0 and r.queued == 0 and r.counters()["invalid_value"] == 6
    r.close()  # twice: nothing happens


def _refusal_said_once(r: client.Reporter, caplog: pytest.LogCaptureFixture, words: str) -> None:
    with caplog.at_level(logging.WARNING, logger="crowdmix.client"):
        for _ in range(3):
            r.flush(timeout=5)
    said = [m for m in caplog.messages if words in m]
    assert len(said) == 1, caplog.messages
    assert r.last_error is not None and words in r.last_error


def test_a_wrong_token_is_said_once_not_taken_for_being_offline(
    sealed_shuffler: ShufflerHandle, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = f"127.0.0.1:{sealed_shuffler.port}"
    with client.Reporter(
        tmp_path / "app", target, token="not-the-token", tls=False, background=False
    ) as r:
        _refusal_said_once(r, caplog, "refused the app's token")
        assert r.report(OUE, "a").status is ReportStatus.NO_CONFIG


def test_tls_against_a_plaintext_port_is_said_once(
    sealed_shuffler: ShufflerHandle, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = f"127.0.0.1:{sealed_shuffler.port}"
    with client.Reporter(tmp_path / "app", target, token=TOKEN, background=False) as r:
        _refusal_said_once(r, caplog, "TLS handshake failed")
        assert "tls=False" in (r.last_error or "")
