"""RapporParams: validation names the field, the fingerprint is stable."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from crowdmix.client import ParamsError, RapporEncoder, RapporParams, new_secret
from crowdmix.client.report import unpack_bits

BAD_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"k": 0}, "k"),
    ({"k": 65537}, "k"),
    ({"k": 16.0}, "k"),
    ({"k": True}, "k"),
    ({"h": 0}, "h"),
    ({"h": 17}, "h"),
    ({"k": 2, "h": 3}, "h"),
    ({"m": 0}, "m"),
    ({"m": "4"}, "m"),
    ({"f": -0.1}, "f"),
    ({"f": 1.0}, "f"),
    ({"f": float("nan")}, "f"),
    ({"f": "0.5"}, "f"),
    ({"p": 1.5}, "p"),
    ({"p": float("inf")}, "p"),
    ({"q": -1}, "q"),
    ({"q": None}, "q"),
    ({"p": 0.75, "q": 0.75}, "p must be below q"),
    ({"p": 0.8, "q": 0.25}, "p must be below q"),
]


@pytest.mark.parametrize(("kwargs", "field"), BAD_FIELDS)
def test_bad_field_raises_valueerror_naming_it(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}\b") as info:
        RapporParams(**kwargs)
    assert isinstance(info.value, ParamsError)


def test_params_are_frozen_and_equal_by_value() -> None:
    a = RapporParams(k=32, f=0, p=0, q=1)
    b = RapporParams(k=32, f=0.0, p=0.0, q=1.0)
    assert a == b and hash(a) == hash(b)
    assert a.fingerprint() == b.fingerprint()
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.k = 64  # type: ignore[misc]


def test_fingerprint_is_pinned() -> None:
    # Computed once; a change here means every deployed report is rejected.
    params = RapporParams(k=128, h=2, m=64, f=0.5, p=0.5, q=0.75)
    assert params.fingerprint() == 9267178879015093250
    assert params.fingerprint("mmh3") == 9267178879015093250


def test_fingerprint_changes_with_every_field_and_hashing() -> None:
    base = RapporParams(k=16, h=2, m=64, f=0.5, p=0.5, q=0.75)
    changes: dict[str, Any] = {"k": 32, "h": 1, "m": 32, "f": 0.25, "p": 0.25, "q": 0.875}
    seen = {base.fingerprint("mmh3"), base.fingerprint("rappor-md5")}
    assert len(seen) == 2
    for name, value in changes.items():
        other = dataclasses.replace(base, **{name: value})
        for hashing in ("mmh3", "rappor-md5"):
            fp = other.fingerprint(hashing)
            assert fp not in seen, name
            seen.add(fp)
    assert 0 <= base.fingerprint() < 2**64


def test_report_bytes() -> None:
    assert [RapporParams(k=k, h=1).report_bytes for k in (1, 8, 9, 128, 4096)] == [
        1,
        1,
        2,
        16,
        512,
    ]


@pytest.mark.parametrize("k", [1, 7, 13, 128, 4096, 65536])
def test_any_k_encodes_end_to_end(k: int) -> None:
    params = RapporParams(k=k, h=1, m=8, f=0.25, p=0.25, q=0.75)
    enc = RapporEncoder(params, secret=new_secret(), metric="m")
    report = enc.encode("value")
    assert len(report.bits) == params.report_bytes
    # Padding bits above k stay zero (the aggregator rejects them otherwise).
    assert int.from_bytes(report.bits, "little") >> k == 0
    assert all(0 <= i < k for i in unpack_bits(report.bits, 8 * len(report.bits)))
    bloom = enc.bloom("value")
    prr = enc.permanent_response(bloom)
    assert prr == enc.permanent_response(bloom)
    assert prr.bits >> k == 0
