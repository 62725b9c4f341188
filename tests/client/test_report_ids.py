"""Report ids: 16 bytes from the CSPRNG per report, drawn at encode time,
injectable for tests; the id links nothing (fresh per report, not part of equality)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from crowdmix import client
from crowdmix.client import BasicEncoder, BasicParams, RapporEncoder, RapporParams
from crowdmix.client.batch import BatchEncoder
from crowdmix.client.report import REPORT_ID_BYTES, Report, new_report_id


def counter_source() -> tuple[list[bytes], object]:
    drawn: list[bytes] = []

    def source(n: int) -> bytes:
        rid = len(drawn).to_bytes(n, "little")
        drawn.append(rid)
        return rid

    return drawn, source


@pytest.mark.parametrize("hashing", ["mmh3", "rappor-md5"])
def test_every_rappor_report_gets_a_fresh_injected_id(hashing: str) -> None:
    drawn, source = counter_source()
    params = RapporParams(k=16, h=2, m=4) if hashing == "rappor-md5" else RapporParams()
    enc = RapporEncoder(
        params, secret=bytes(range(16)), metric="m", hashing=hashing,  # type: ignore[arg-type]
        random_bytes=source,  # type: ignore[arg-type]
    )  # fmt: skip
    reports = [enc.encode("same value") for _ in range(5)]
    assert [r.report_id for r in reports] == drawn and len(set(drawn)) == 5
    assert all(len(r.report_id) == REPORT_ID_BYTES for r in reports)


def test_basic_reports_get_injected_ids() -> None:
    drawn, source = counter_source()
    enc = BasicEncoder(
        BasicParams(mechanism="krr", epsilon=1.0, domain_size=3),
        metric="m",
        random_bytes=source,  # type: ignore[arg-type]
    )
    reports = [enc.encode(1) for _ in range(3)]
    assert [r.report_id for r in reports] == drawn


def test_the_default_id_source_is_the_os_csprng() -> None:
    enc = RapporEncoder(RapporParams(), secret=client.new_secret(), metric="m")
    assert enc._new_id is os.urandom
    basic = BasicEncoder(BasicParams(mechanism="binary-rr", epsilon=1.0), metric="m")
    assert basic._new_id is os.urandom
    # and a Report built by hand draws one too
    a = Report(metric="m", cohort=0, bits=b"\x00", params_fingerprint=1)
    b = Report(metric="m", cohort=0, bits=b"\x00", params_fingerprint=1)
    assert len(a.report_id) == 16 and a.report_id != b.report_id


def test_ids_are_independent_of_the_value_and_do_not_change_equality() -> None:
    """Two reports of one client and one value carry unrelated ids: the id links nothing
    (and equal contents compare equal whatever the ids)."""
    enc = RapporEncoder(RapporParams(f=0.0, p=0.0, q=1.0), secret=bytes(16), metric="m")
    r1, r2 = enc.encode("x"), enc.encode("x")
    assert r1 == r2 and r1.report_id != r2.report_id
    # 2000 ids: no repeat, and every byte value roughly uniform in every position
    ids = np.frombuffer(b"".join(enc.encode("x").report_id for _ in range(2000)), np.uint8)
    assert len({bytes(r) for r in ids.reshape(-1, 16)}) == 2000
    # mean of 32000 uniform bytes: sd 0.41; |mean - 127.5| > 3 has probability < 1e-12
    assert abs(float(ids.mean()) - 127.5) < 3


def test_new_report_id_checks_the_source() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        new_report_id(lambda n: b"short")


def test_batch_encoder_draws_ids_from_its_byte_source() -> None:
    params = RapporParams(k=16, h=2, m=4)
    enc = BatchEncoder(params, metric="m")
    table = enc.bloom_table(["a", "b"])
    batch = enc.encode_indices(table, np.array([0, 1, 1]), np.array([0, 1, 2]))
    assert batch.report_ids is not None and batch.report_ids.shape == (3, 16)
    reports = batch.reports()
    assert b"".join(r.report_id for r in reports) == batch.report_ids_bytes()
    assert len({r.report_id for r in reports}) == 3
