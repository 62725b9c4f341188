"""The aggregator's key set: lifecycle, files (mode 0600), public config, and the CLI."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from crowdmix.aggregator.sealing.keys import (
    KeyFileError,
    KeySet,
    KeySetError,
    load_keyset,
    save_keyset,
    write_public_config,
)
from crowdmix.core.sealed import MLKEM768_X25519_SUITE, PublicKeySet

T0 = 1_800_000_000


def test_states_follow_time_pending_active_grace_expired() -> None:
    ks, k1 = KeySet().with_new_key(T0, grace_seconds=50)
    ks, k2 = ks.rotate(T0 + 100, pending_seconds=10)
    k1 = ks.get(1)
    assert k1 is not None and k1.not_after == T0 + 110 and k1.grace_seconds == 50
    assert [k1.state(t) for t in (T0 + 109, T0 + 110, T0 + 159, T0 + 160)] == [
        "active",
        "grace",
        "grace",
        "expired",
    ]
    assert [k2.state(t) for t in (T0 + 109, T0 + 110)] == ["pending", "active"]
    assert [k1.opens_at(T0 + 159), k1.opens_at(T0 + 160)] == [True, False]
    # published: pending and active keys only, never a grace or expired one
    assert [k.key_id for k in ks.public_config(T0 + 105).keys] == [1, 2]
    assert [k.key_id for k in ks.public_config(T0 + 120).keys] == [2]


def test_rotate_overrides_grace_and_keeps_the_suite() -> None:
    ks, _ = KeySet().with_new_key(T0, suite=MLKEM768_X25519_SUITE.name)
    ks, k2 = ks.rotate(T0 + 5, grace_seconds=7)
    assert k2.suite == MLKEM768_X25519_SUITE.name and k2.key_id == 2
    old = ks.get(1)
    assert old is not None and (old.not_after, old.expires_at) == (T0 + 5, T0 + 12)


def test_retire_rules() -> None:
    ks, _ = KeySet().with_new_key(T0)
    with pytest.raises(KeySetError, match="only active key"):
        ks.retire(1, T0 + 1)
    with pytest.raises(KeySetError, match="no key with id 9"):
        ks.retire(9, T0 + 1)
    ks, _ = ks.rotate(T0 + 10, pending_seconds=100)  # key 2 pending until T0+110
    ks = ks.retire(2, T0 + 20)
    assert ks.get(2).state(T0 + 200) == "expired"  # type: ignore[union-attr]
    assert ks.get(2).private_key is None  # type: ignore[union-attr]
    ks, _ = ks.rotate(T0 + 30, grace_seconds=1000)  # key 3 from T0+30; key 1 enters grace
    assert ks.get(1).state(T0 + 40) == "grace"  # type: ignore[union-attr]
    with pytest.raises(KeySetError, match="already retired"):
        ks.retire(1, T0 + 40)
    with pytest.raises(KeySetError, match="key 3 is the only active key"):
        ks.retire(3, T0 + 40)
    killed = ks.retire(1, T0 + 40, immediately=True)
    k1 = killed.get(1)
    assert k1 is not None and k1.private_key is None and k1.state(T0 + 40) == "expired"
    with pytest.raises(KeySetError, match=r"key 3 is the only active key.*--force"):
        ks.retire(3, T0 + 40, immediately=True)  # at once or not, devices would have no key
    killed = ks.retire(3, T0 + 40, immediately=True, force=True)  # a compromised last key
    assert killed.get(3).state(T0 + 40) == "expired"  # type: ignore[union-attr]


def test_the_only_active_key_with_a_pending_replacement_is_kept_until_that_one_is_active() -> None:
    ks, _ = KeySet().with_new_key(T0)
    ks, _ = ks.rotate(T0 + 10, pending_seconds=100)  # key 2 pending until T0+110
    with pytest.raises(KeySetError, match="key 2 is pending until"):
        ks.retire(1, T0 + 20, immediately=True)


def test_keys_retire_of_the_only_active_key_is_refused_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from crowdmix.cli import main

    keys, public = str(tmp_path / "k.json"), str(tmp_path / "pub.json")
    assert main(["keys", "new", "--file", keys, "--public", public]) == 0
    before = ((tmp_path / "k.json").read_text(), (tmp_path / "pub.json").read_text())
    capsys.readouterr()
    for extra in ([], ["--now"]):
        code = main(["keys", "retire", "--file", keys, "--id", "1", "--public", public, *extra])
        err = capsys.readouterr().err
        assert code == 1 and "only active key" in err and "--force" in err, err
    assert ((tmp_path / "k.json").read_text(), (tmp_path / "pub.json").read_text()) == before
    # with a replacement active the old key retires; --force retires the last one anyway
    assert main(["keys", "rotate", "--file", keys, "--public", public]) == 0
    assert main(["keys", "retire", "--file", keys, "--id", "1", "--now", "--public", public]) == 0
    assert [k.key_id for k in PublicKeySet.from_json(Path(public).read_text()).keys] == [2]
    code = main(
        ["keys", "retire", "--file", keys, "--id", "2", "--now", "--force", "--public", public]
    )
    assert code == 0
    assert PublicKeySet.from_json(Path(public).read_text()).keys == ()


def test_key_file_is_0600_round_trips_and_erases_expired_private_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    ks, _ = KeySet().with_new_key(T0, grace_seconds=10)
    ks, _ = ks.rotate(T0 + 100)
    save_keyset(path, ks, now=T0 + 105, create=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_keyset(path) == ks
    with pytest.raises(KeyFileError, match="already exists"):
        save_keyset(path, ks, now=T0, create=True)
    save_keyset(path, ks, now=T0 + 200, create=False)  # key 1 expired at T0+110
    loaded = load_keyset(path)
    k1 = loaded.get(1)
    assert k1 is not None and k1.private_key is None and k1.state(T0) == "expired"
    assert json.loads(path.read_text())["keys"][0]["private_key"] is None


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_key_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "keys.json"
    save_keyset(path, KeySet().with_new_key(T0)[0], now=T0)
    os.chmod(path, mode)
    with pytest.raises(KeyFileError, match=f"mode {mode:04o}.*chmod 600"):
        load_keyset(path)


def test_a_corrupted_key_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    save_keyset(path, KeySet().with_new_key(T0)[0], now=T0)
    doc = json.loads(path.read_text())
    doc["keys"][0]["public_key"] = base64.b64encode(b"\x01" * 32).decode()
    path.write_text(json.dumps(doc))
    with pytest.raises(KeyFileError, match="public key does not match"):
        load_keyset(path)
    path.write_text('{"format": "crowdmix-private-keys", "version": 1, "keys": [{"id": 1}]}')
    with pytest.raises(KeyFileError, match="malformed key entry"):
        load_keyset(path)


def test_public_config_holds_no_private_key(tmp_path: Path) -> None:
    ks, _ = KeySet().with_new_key(T0, suite=MLKEM768_X25519_SUITE.name)
    ks, _ = ks.rotate(T0 + 1, pending_seconds=60)
    out = tmp_path / "public.json"
    config = write_public_config(out, ks, now=T0 + 2)
    text = out.read_text()
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert PublicKeySet.from_json(text) == config and len(config.keys) == 2
    for k in ks.keys:
        assert k.private_key is not None
        assert base64.b64encode(k.private_key).decode() not in text
        assert base64.b64encode(k.private_key[:32]).decode()[:40] not in text
    assert "private" not in text


# -- the CLI, driven as a subprocess ----------------------------------------------


@dataclass(frozen=True)
class _Ran:
    returncode: int
    stdout: str
    stderr: str


def _crowdmix(*args: str, cwd: Path) -> _Ran:
    """``crowdmix keys ARGS`` in ``cwd`` through ``crowdmix.cli.main``: exit code (argparse's
    usage errors included), stdout and stderr, without a new interpreter per command
    (the test without cryptography below starts one)."""
    import contextlib
    import io

    from crowdmix.cli import main

    out, err = io.StringIO(), io.StringIO()
    here = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["keys", *args])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(here)
    return _Ran(code, out.getvalue(), err.getvalue())


def test_keys_cli_new_list_rotate_retire_export(tmp_path: Path) -> None:
    r = _crowdmix("new", "--file", "k.json", "--public", "pub.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((tmp_path / "k.json").stat().st_mode) == 0o600
    r = _crowdmix("rotate", "--file", "k.json", "--grace", "2h", cwd=tmp_path)
    assert r.returncode == 0 and "added key 2" in r.stdout, r.stderr
    r = _crowdmix("list", "--file", "k.json", "--json", cwd=tmp_path)
    rows = json.loads(r.stdout)
    assert [(x["id"], x["grace_seconds"]) for x in rows] == [(1, 7200), (2, 31 * 86400)]
    assert rows[1]["state"] == "active" and rows[0]["not_after"] is not None
    r = _crowdmix("retire", "--file", "k.json", "--id", "1", "--now", cwd=tmp_path)
    assert r.returncode == 0 and "expired" in r.stdout, r.stderr
    r = _crowdmix("export", "--file", "k.json", "--public", "pub.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    published = PublicKeySet.from_json((tmp_path / "pub.json").read_text())
    assert [k.key_id for k in published.keys] == [2]
    r = _crowdmix("list", "--file", "k.json", cwd=tmp_path)
    assert r.returncode == 0 and "expired" in r.stdout and "active" in r.stdout


def test_keys_cli_bad_input_is_one_line_and_non_zero(tmp_path: Path) -> None:
    assert _crowdmix("new", "--file", "k.json", cwd=tmp_path).returncode == 0
    (tmp_path / "junk.json").write_text("not json")
    os.chmod(tmp_path / "junk.json", 0o600)
    (tmp_path / "open.json").write_text((tmp_path / "k.json").read_text())
    os.chmod(tmp_path / "open.json", 0o644)
    cases = [
        (("new", "--file", "k.json"), "already exists"),
        (("list", "--file", "missing.json"), "does not exist"),
        (("list", "--file", "junk.json"), "is not JSON"),
        (("list", "--file", "open.json"), "mode 0644"),
        (("retire", "--file", "k.json", "--id", "1"), "only active key"),
        (("retire", "--file", "k.json", "--id", "5"), "no key with id 5"),
        (("new", "--file", "nodir/k.json"), "does not exist"),
    ]
    for args, message in cases:
        r = _crowdmix(*args, cwd=tmp_path)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("crowdmix: error: "), (args, r.stderr)
        assert message in lines[0], (args, lines)
    # argparse-level errors: exit 2 with argparse's usage line and one error line
    for args in (
        ("rotate", "--file", "k.json", "--grace", "3x"),
        ("retire", "--file", "k.json", "--id", "x"),
    ):
        r = _crowdmix(*args, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("crowdmix keys ")


@pytest.mark.slow  # heavy: the full check runs it, scripts/check --fast does not
def test_keys_cli_without_cryptography_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys\nsys.modules['cryptography'] = None  # as if not installed\n"
        "from crowdmix.cli import main\nsys.exit(main(['keys', 'list', '--file', 'k.json']))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert r.returncode == 3
    assert r.stderr.strip().splitlines() == [
        "crowdmix: error: crowdmix keys needs crowdmix[transport] (the 'cryptography' "
        "package is missing): pip install 'crowdmix[transport]'"
    ]


def test_keys_list_of_the_public_config_says_what_it_is_without_chmod_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from crowdmix.cli import main

    keys, public = tmp_path / "k.json", tmp_path / "pub.json"
    assert main(["keys", "new", "--file", str(keys), "--public", str(public)]) == 0
    capsys.readouterr()
    for mode in (0o644, 0o600):
        os.chmod(public, mode)
        assert main(["keys", "list", "--file", str(public)]) == 1
        err = capsys.readouterr().err
        assert "is the public key config" in err and "chmod" not in err, err
