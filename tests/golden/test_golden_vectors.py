"""The golden vectors: the file is what the Python SDK computes, and the reports sealed
by either SDK open in the aggregator (the TypeScript suite checks its side)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crowdmix.aggregator.sealing.keys import AggregatorKey, KeySet
from crowdmix.aggregator.sealing.opening import open_batch
from tests.golden import make_vectors

HERE = Path(__file__).parent
VECTORS = json.loads((HERE / "vectors.json").read_text(encoding="utf-8"))
FROM_TYPESCRIPT = json.loads((HERE / "sealed_by_typescript.json").read_text(encoding="utf-8"))


def test_vectors_file_is_what_the_python_sdk_computes() -> None:
    assert make_vectors.deterministic_part(VECTORS) == make_vectors.deterministic_part(
        make_vectors.vectors()
    )


def test_vectors_cover_every_params_family() -> None:
    assert len(VECTORS["rappor"]) >= 50
    assert {c["mechanism"] for c in VECTORS["basic"]} == {"binary-rr", "krr", "oue", "olh"}
    assert VECTORS["histogram"] and VECTORS["sealed"]["cases"]
    hh = VECTORS["heavy_hitters"]
    assert {c["served"].get("candidates") is None for c in hh["rounds"]} == {True, False}
    assert len({d["round"] for d in hh["devices"]}) >= 3 and hh["config"]["answer"]


def _keys() -> KeySet:
    s = VECTORS["sealed"]
    return KeySet(
        (
            AggregatorKey(
                key_id=s["key_id"],
                suite=s["suite"],
                public_key=bytes.fromhex(s["public_key"]),
                private_key=bytes.fromhex(s["private_key"]),
                not_before=0,
            ),
        )
    )


def _open(case: dict[str, Any], sealed_hex: str, window: int) -> bytes | None:
    plaintext = bytes.fromhex(case["plaintext"])
    report_bytes = len(plaintext) - 28
    opened = open_batch(
        _keys(),
        metric=case["metric"],
        window=window,
        report_bytes=report_bytes,
        fingerprint=int.from_bytes(plaintext[report_bytes + 4 : report_bytes + 12], "little"),
        key_ids=[VECTORS["sealed"]["key_id"]],
        sealed=[bytes.fromhex(sealed_hex)],
        now=1.0,
    )
    if opened.opened != 1 or not opened.fingerprints_ok[0]:
        return None
    return (
        opened.bits[0].tobytes()
        + opened.cohorts[0].tobytes()
        + plaintext[report_bytes + 4 : report_bytes + 12]
        + opened.report_ids[0].tobytes()
    )


def _case_of(ts: dict[str, Any]) -> dict[str, Any]:
    """The vector a report sealed by the TypeScript SDK was made from."""
    return next(
        c
        for c in VECTORS["sealed"]["cases"]
        if (c["metric"], c["window"], c["plaintext"])
        == (ts["metric"], ts["window"], ts["plaintext"])
    )


def test_reports_sealed_by_python_open_in_the_aggregator() -> None:
    for case in VECTORS["sealed"]["cases"]:
        assert _open(case, case["sealed_by_python"], case["window"]) == bytes.fromhex(
            case["plaintext"]
        )


def test_reports_sealed_by_typescript_open_in_the_aggregator() -> None:
    # the TypeScript SDK's own HPKE seal (sdk/typescript/src/hpke.ts), a fresh ephemeral
    # key each: several seals of every vector, all distinct, every one opens
    sealed = [ts["sealed"] for ts in FROM_TYPESCRIPT["cases"]]
    assert len(sealed) >= 20 * len(VECTORS["sealed"]["cases"])
    assert len(set(sealed)) == len(sealed)
    for ts in FROM_TYPESCRIPT["cases"]:
        case = _case_of(ts)
        assert _open(case, ts["sealed"], case["window"]) == bytes.fromhex(case["plaintext"])


def test_a_sealed_report_does_not_open_under_another_window() -> None:
    for ts in FROM_TYPESCRIPT["cases"]:
        case = _case_of(ts)
        other = (case["window"] + 1) % 2**32
        assert _open(case, ts["sealed"], other) is None
