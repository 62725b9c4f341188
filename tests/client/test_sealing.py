"""Sealing on the device (crowdmix.client.sealing): layout, lengths, context binding, randomness.

Opening here uses ``cryptography``'s HPKE directly, so these tests do not trust
our own opener (tests/aggregator/test_opening.py covers that).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric import mlkem, x25519

from crowdmix import client
from crowdmix.client.sealing import seal_report
from crowdmix.core import sealed
from crowdmix.core.registry import MetricConfig
from crowdmix.core.sealed import (
    MLKEM768_X25519_SUITE,
    PublicKeyConfig,
    PublicKeySet,
    SealedReport,
    SealingError,
    choose_key,
    report_info,
    sealed_length,
    sealed_length_for,
    unpack_plaintext,
)

WINDOW = 20_000
X25519 = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_128_GCM)


def _x25519_key(
    key_id: int = 7, not_before: int = 0
) -> tuple[x25519.X25519PrivateKey, PublicKeyConfig]:
    sk = x25519.X25519PrivateKey.generate()
    pub = PublicKeyConfig(
        key_id=key_id,
        suite=sealed.DEFAULT_SUITE,
        public_key=sk.public_key().public_bytes_raw(),
        not_before=not_before,
    )
    return sk, pub


def _seal(pub: PublicKeyConfig, metric: str = "m", bits: bytes = b"\x05\xa0") -> SealedReport:
    return seal_report(
        pub,
        metric=metric,
        window=WINDOW,
        bits=bits,
        cohort=3,
        fingerprint=2**64 - 5,
        report_id=b"R" * 16,
    )


def test_round_trip_with_raw_hpke() -> None:
    sk, pub = _x25519_key()
    r = _seal(pub)
    assert (r.metric, r.key_id, r.window) == ("m", 7, WINDOW)
    pt = X25519.decrypt(r.sealed, sk, info=report_info("m", 7, WINDOW))
    assert unpack_plaintext(pt, 2) == (b"\x05\xa0", 3, 2**64 - 5, b"R" * 16)


def test_plaintext_layout_is_pinned() -> None:
    # bits ‖ cohort u32 LE ‖ fingerprint u64 LE ‖ report id: the aggregator depends on it
    assert sealed.pack_plaintext(b"\xff", 1, 2, b"\x00" * 15 + b"\x09") == (
        b"\xff" + b"\x01\x00\x00\x00" + b"\x02" + b"\x00" * 7 + b"\x00" * 15 + b"\x09"
    )
    # label ‖ protocol 2 ‖ key id u32 ‖ window u32 ‖ len(metric) u16 ‖ metric
    assert report_info("ab", 258, 0x01020304) == (
        b"crowdmix/sealed-report\x00"
        + b"\x02"
        + b"\x02\x01\x00\x00"
        + b"\x04\x03\x02\x01"
        + b"\x02\x00"
        + b"ab"
    )


def test_a_report_id_is_required_and_never_all_zero() -> None:
    for bad in (b"", b"\x01" * 15, bytes(16)):
        with pytest.raises(client.ParamsError, match="report id"):
            sealed.pack_plaintext(b"\xff", 1, 2, bad)


def test_replay_under_another_metric_key_id_or_window_fails() -> None:
    sk, pub = _x25519_key()
    r = _seal(pub, metric="home")
    others = (
        report_info("away", 7, WINDOW),
        report_info("home", 8, WINDOW),
        report_info("home", 7, WINDOW - 1),
        report_info("home", 7, WINDOW + 1),
        b"",
    )
    for info in others:
        with pytest.raises(InvalidTag):
            X25519.decrypt(r.sealed, sk, info=info)


def test_every_ciphertext_of_a_metric_has_the_same_length() -> None:
    rappor = MetricConfig(name="r", rappor=client.RapporParams(k=100, h=2, m=8))
    oue = MetricConfig(
        name="o", basic=client.BasicParams(mechanism="oue", epsilon=1.0, domain_size=20)
    )
    _, pub = _x25519_key()
    for metric in (rappor, oue):
        n = metric.report_bytes
        lengths = {
            len(
                seal_report(
                    pub,
                    metric=metric.name,
                    window=WINDOW,
                    bits=bytes([v]) * n,
                    cohort=v,
                    fingerprint=metric.fingerprint,
                    report_id=os.urandom(16),
                    report_bytes=n,
                ).sealed
            )
            for v in (0, 1, 255)
        }
        # X25519 enc 32 + plaintext (bits + 4 + 8 + 16) + AES-GCM tag 16
        assert lengths == {sealed_length_for(metric)} == {32 + n + 28 + 16}
    with pytest.raises(client.ParamsError, match="bits must be 13 bytes"):
        seal_report(
            pub,
            metric="r",
            window=WINDOW,
            bits=b"x",
            cohort=0,
            fingerprint=0,
            report_id=b"R" * 16,
            report_bytes=13,
        )


def test_post_quantum_hybrid_suite_round_trip() -> None:
    mk, xk = mlkem.MLKEM768PrivateKey.generate(), x25519.X25519PrivateKey.generate()
    pub = PublicKeyConfig(
        key_id=1,
        suite=MLKEM768_X25519_SUITE.name,
        public_key=mk.public_key().public_bytes_raw() + xk.public_key().public_bytes_raw(),
        not_before=0,
    )
    r = _seal(pub)
    assert len(r.sealed) == sealed_length(2, MLKEM768_X25519_SUITE.name) == 1120 + 2 + 28 + 16
    suite = hpke.Suite(hpke.KEM.MLKEM768_X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_128_GCM)
    pt = suite.decrypt(
        r.sealed, hpke.MLKEM768X25519PrivateKey(mk, xk), info=report_info("m", 1, WINDOW)
    )
    assert unpack_plaintext(pt, 2)[0] == b"\x05\xa0"


def test_default_randomness_is_the_libraries_csprng(monkeypatch: pytest.MonkeyPatch) -> None:
    # HPKE's ephemeral key comes from OpenSSL's CSPRNG inside cryptography: sealing has no
    # randomness parameter to get wrong, and equal inputs never give equal encapsulations
    # (a repeat among 200 X25519 public keys has probability < 2^-230).
    assert "rand" not in " ".join(seal_report.__code__.co_varnames)
    _, pub = _x25519_key()
    encs = {_seal(pub).sealed[:32] for _ in range(200)}
    assert len(encs) == 200
    # report ids come from os.urandom
    calls: list[int] = []
    monkeypatch.setattr(sealed.os, "urandom", lambda n: calls.append(n) or b"\x01" * n)
    assert sealed.new_report_id() == b"\x01" * 16 and calls == [16]


def test_sealed_report_byte_layout_round_trips_and_rejects_garbage() -> None:
    r = SealedReport(metric="héllo", key_id=0x01020304, window=0x0A0B0C0D, sealed=b"\x00" * 78)
    data = r.to_bytes()
    assert data[:2] == (6).to_bytes(2, "little") and data[8:12] == b"\x04\x03\x02\x01"
    assert data[12:16] == b"\x0d\x0c\x0b\x0a"
    assert SealedReport.from_bytes(data) == r
    for bad in (b"", b"\x05\x00ab", b"\x01\x00a\x01\x00\x00\x00\x00\x00\x00\x00"):
        with pytest.raises(client.ParamsError, match="truncated"):
            SealedReport.from_bytes(bad)
    with pytest.raises(client.ParamsError, match="key id"):
        SealedReport(metric="m", key_id=2**32, window=0, sealed=b"x")
    with pytest.raises(client.ParamsError, match="window"):
        SealedReport(metric="m", key_id=1, window=-1, sealed=b"x")


def test_public_key_config_json_round_trip_and_key_choice() -> None:
    _, old = _x25519_key(key_id=1, not_before=100)
    sk2 = x25519.X25519PrivateKey.generate().public_key().public_bytes_raw()
    new = PublicKeyConfig(key_id=2, suite=sealed.DEFAULT_SUITE, public_key=sk2, not_before=200)
    ended = PublicKeyConfig(
        key_id=1, suite=old.suite, public_key=old.public_key, not_before=100, not_after=200
    )
    ks = PublicKeySet((ended, new))
    back = PublicKeySet.from_json(ks.to_json())
    assert back == ks and back.version == ks.version
    assert choose_key(back.keys, now=150).key_id == 1
    assert choose_key(back.keys, now=200).key_id == 2  # not_after is exclusive
    with pytest.raises(SealingError, match="refetch"):
        choose_key(back.keys, now=50)
    doc = json.loads(ks.to_json())
    doc["keys"][0]["public_key"] = "AAAA"
    with pytest.raises(client.ParamsError, match="32 bytes"):
        PublicKeySet.from_json(json.dumps(doc))
    for bad in ("{", "[]", '{"format": "crowdmix-public-keys", "protocol": 9, "keys": []}'):
        with pytest.raises(client.ParamsError):
            PublicKeySet.from_json(bad)


def test_import_client_and_the_format_load_no_cryptography_and_sealing_no_server_module() -> None:
    # the format is what a shuffler imports: it must not load cryptography at all
    code = (
        "import sys, json\nimport crowdmix.client, crowdmix.core.sealed\n"
        "before = sorted(sys.modules)\n"
        "import crowdmix.client.sealing\nprint(json.dumps([before, sorted(sys.modules)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = json.loads(out.stdout)
    assert not any(m.startswith("cryptography") for m in before)
    assert "cryptography.hazmat.primitives.hpke" in after
    heavy = ("grpc", "numpy", "redis", "crowdmix.shuffler", "crowdmix.aggregator")
    heavy += ("crowdmix.protos", "google.protobuf")
    assert [m for m in after if (m + ".").startswith(tuple(h + "." for h in heavy))] == []


def test_without_cryptography_sealing_names_the_extra_and_the_format_still_imports() -> None:
    code = (
        "import sys\nsys.modules['cryptography'] = None  # as if not installed\n"
        "import crowdmix.core.sealed\n"
        "try:\n    import crowdmix.client.sealing\nexcept ModuleNotFoundError as exc:\n"
        "    print(exc.name, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("cryptography ") and "crowdmix[transport]" in out.stdout


@pytest.mark.parametrize("n", [1, 20])  # rows, and columns past COLUMNAR_THRESHOLD
def test_a_heavy_hitters_report_names_its_round_beside_its_seal_and_nothing_else_does(
    n: int,
) -> None:
    """``round_bound`` metrics' sealed reports carry their (round) fingerprint in the clear
    too, for the shuffler to check; every other sealed report carries none."""
    from crowdmix.client.report import make_report
    from crowdmix.client.request import submit_request

    sk, pub = _x25519_key()
    items = [
        (make_report(m, 0, bytes(4), fp, bytes([i + 1, k]) * 8), WINDOW)
        for i in range(n)
        for k, (m, fp) in enumerate((("words", 0xABC), ("pages", 0xDEF)))
    ]
    request = submit_request(
        items, key=pub, report_bytes={"words": 4, "pages": 4}, round_bound=frozenset({"words"})
    )
    clear = {(r.metric, r.params_fingerprint) for r in request.reports} | {
        (c.metric, c.params_fingerprint) for c in request.columns
    }
    assert clear == {("words", 0xABC), ("pages", 0)}
    seals = [(r.metric, r.sealed) for r in request.reports] + [
        (c.metric, c.sealed[j : j + c.sealed_bytes])
        for c in request.columns
        for j in range(0, len(c.sealed), c.sealed_bytes)
    ]
    inside = {
        unpack_plaintext(X25519.decrypt(v, sk, info=report_info(m, 7, WINDOW)), 4)[2]
        for m, v in seals
    }
    assert inside == {0xABC, 0xDEF}  # the seal holds every report's own fingerprint
