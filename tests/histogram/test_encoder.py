"""client.histogram: exact draws with scripted bits, seeded statistics, the secure default."""

from __future__ import annotations

import subprocess
import sys

import pytest

from crowdmix.client.errors import ParamsError
from crowdmix.client.histogram import HistogramEncoder
from crowdmix.client.randomness import SecureBits, shared_secure_bits
from crowdmix.core.histogram import HistogramParams
from tests.client.bitsources import SeededBits, scripted_fields
from tests.client.stats import binomial_ok


class ConstBits:
    """Every bit 1 (or 0): decides a Bernoulli(p) lane at p's first 1 (or 0) digit."""

    def __init__(self, one: bool) -> None:
        self.one = one

    def random_bits(self, nbits: int) -> int:
        return (1 << nbits) - 1 if self.one else 0


def test_exact_draws_without_local_randomization() -> None:
    params = HistogramParams(domain_size=4, fake_slots=3, fake_probability=0.5)
    src = scripted_fields(
        [
            (0b101, 3),  # slot coins (q = 1/2: one word): slots 0 and 2 filled
            (3, 2),  # fake 1 = 3
            (1, 2),  # fake 2 = 1
            (3, 2),  # shuffle i=2: 3 rejected (>= 3) ...
            (0, 2),  # ... then j = 0: swap positions 2 and 0
            (1, 1),  # shuffle i=1: j = 1
        ]
    )
    enc = HistogramEncoder(params, metric="m", rand=src)
    assert enc.indexes(2) == [1, 3, 2]
    assert src.left == 0


def test_reports_are_the_krr_layout_and_indistinguishable() -> None:
    params = HistogramParams(domain_size=300, fake_slots=2, fake_probability=1.0)
    enc = HistogramEncoder(
        params, metric="m", domain=[f"v{i}" for i in range(300)], rand=SeededBits(1)
    )
    reports = enc.encode("v299")
    assert len(reports) == 3
    assert {len(r.bits) for r in reports} == {2}  # index_bytes(300) = 2, little-endian
    assert {r.cohort for r in reports} == {0}
    assert {r.params_fingerprint for r in reports} == {params.fingerprint()}
    assert 299 in [int.from_bytes(r.bits, "little") for r in reports]


def test_local_krr_keeps_or_moves_exactly() -> None:
    params = HistogramParams(domain_size=4, fake_slots=0, fake_probability=0.0, local_epsilon=1.0)
    assert HistogramEncoder(params, metric="m", rand=ConstBits(True)).real_index(2) == 2
    # all-zero bits: not kept; the replacement is other index 0, skipping the true one
    assert HistogramEncoder(params, metric="m", rand=ConstBits(False)).real_index(0) == 1
    assert HistogramEncoder(params, metric="m", rand=ConstBits(False)).real_index(2) == 0


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("domain_size", {"domain_size": 1, "fake_slots": 1, "fake_probability": 0.5}),
        ("fake_slots", {"domain_size": 4, "fake_slots": -1, "fake_probability": 0.5}),
        ("fake_probability", {"domain_size": 4, "fake_slots": 1, "fake_probability": 1.5}),
        ("local_epsilon", {"domain_size": 4, "fake_slots": 1, "fake_probability": 0.5,
                           "local_epsilon": 0.0}),
        ("local_epsilon", {"domain_size": 4, "fake_slots": 1, "fake_probability": 0.5,
                           "local_epsilon": float("inf")}),
    ],
)  # fmt: skip
def test_bad_params_name_the_field(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(ParamsError, match=field):
        HistogramParams(**kwargs)  # type: ignore[arg-type]


def test_fake_counts_values_and_krr_are_distributed_as_specified() -> None:
    # 4 checks at ALPHA = 1e-9 (per bucket: 4 + 1 + 1 in all, <= 6e-9 false failure)
    params = HistogramParams(domain_size=4, fake_slots=3, fake_probability=0.3, local_epsilon=1.0)
    enc = HistogramEncoder(params, metric="m", rand=SeededBits(18))
    devices = 20_000
    fakes = 0
    fake_values = [0] * 4
    kept = 0
    for _ in range(devices):
        real = enc.real_index(1)
        kept += real == 1
        f = enc.fake_indexes()
        fakes += len(f)
        for v in f:
            fake_values[v] += 1
    assert binomial_ok(fakes, devices * 3, 0.3)
    for v in range(4):
        assert binomial_ok(fake_values[v], fakes, 0.25)
    assert binomial_ok(kept, devices, params.keep_probability)


def test_default_randomness_is_the_shared_csprng() -> None:
    enc = HistogramEncoder(
        HistogramParams(domain_size=4, fake_slots=1, fake_probability=0.5), metric="m"
    )
    assert isinstance(enc._rand, SecureBits)
    assert enc._rand is shared_secure_bits()


def test_import_loads_no_numpy_grpc_or_redis() -> None:
    code = (
        "import sys, crowdmix.client.histogram; "
        "bad = [m for m in ('numpy', 'grpc', 'redis') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_report_fakes_included_gets_its_own_report_id() -> None:
    """An id shared by a device's reports would link its real report to its fakes."""
    params = HistogramParams(domain_size=10, fake_slots=8, fake_probability=1.0)
    counter = iter(range(1, 1000))
    enc = HistogramEncoder(
        params,
        metric="h",
        rand=SeededBits(3),
        random_bytes=lambda n: next(counter).to_bytes(n, "little"),
    )
    reports = enc.encode(4)
    assert len(reports) == 9
    assert [int.from_bytes(r.report_id, "little") for r in reports] == list(range(1, 10))
    # the default source is the OS CSPRNG: fresh ids, never zero (zero means "no id")
    ids = [r.report_id for r in HistogramEncoder(params, metric="h").encode(4)]
    assert len(set(ids)) == len(ids) and all(any(i) for i in ids)
