"""The default random source of every encoder is the OS CSPRNG."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from crowdmix import client
from crowdmix.client import BasicEncoder, BasicParams, RapporEncoder, RapporParams, SecureBits
from crowdmix.client.randomness import shared_secure_bits


class _CountingUrandom:
    def __init__(self, fill: int) -> None:
        self.calls = 0
        self.fill = fill

    def __call__(self, n: int) -> bytes:
        self.calls += 1
        return bytes([self.fill]) * n


@pytest.fixture
def fresh_shared_source() -> Iterator[None]:
    """Empty the shared default source's buffer so the next draw reads os.urandom, and
    again after the test: the fake stream it buffered must not serve later tests."""
    shared_secure_bits()._discard()
    yield
    shared_secure_bits()._discard()


def test_default_sources_are_secure_bits() -> None:
    enc = RapporEncoder(RapporParams(), secret=client.new_secret(), metric="m")
    assert type(enc._rand) is SecureBits
    basic = BasicEncoder(BasicParams(mechanism="krr", epsilon=1.0, domain_size=3), metric="m")
    assert type(basic._rand) is SecureBits
    # One process-wide source: many encoders do not each buffer 64 KiB.
    assert enc._rand is basic._rand is shared_secure_bits()


@pytest.mark.parametrize(("fill", "expected"), [(0x00, 0), (0xFF, (1 << 20) - 1)])
@pytest.mark.usefixtures("fresh_shared_source")
def test_rappor_irr_reads_os_urandom(
    monkeypatch: pytest.MonkeyPatch, fill: int, expected: int
) -> None:
    # With p = 1/4 (u0 & u1) and q = 3/4 (u2 | u3), an all-zero OS stream gives an
    # all-zero report and an all-one stream an all-one report, whatever the PRR.
    fake = _CountingUrandom(fill)
    monkeypatch.setattr(os, "urandom", fake)
    params = RapporParams(k=20, h=2, m=4, f=0.5, p=0.25, q=0.75)
    enc = RapporEncoder(params, secret=bytes(range(16)), metric="m")
    reports = [enc.encode(v) for v in ("a", "b", "c")]
    other = RapporEncoder(params, secret=bytes(range(1, 17)), metric="m")
    reports += [other.encode(v) for v in ("a", "b", "c")]
    assert fake.calls == 1  # one 64 KiB buffer serves many reports and encoders
    assert {int.from_bytes(r.bits, "little") for r in reports} == {expected}


@pytest.mark.usefixtures("fresh_shared_source")
def test_basic_encoder_reads_os_urandom(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _CountingUrandom(0xFF)
    monkeypatch.setattr(os, "urandom", fake)
    enc = BasicEncoder(BasicParams(mechanism="binary-rr", epsilon=1.0), metric="m")
    # An all-one stream decides "keep" at the first digit of e/(e+1) = 0.1...b.
    assert enc.randomize(1) == b"\x01"
    assert enc.randomize(0) == b"\x00"
    assert fake.calls == 1


def test_new_secret_reads_os_urandom(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _CountingUrandom(0x5A)
    monkeypatch.setattr(os, "urandom", fake)
    assert client.new_secret() == bytes([0x5A]) * 32
    assert fake.calls == 1


def test_secure_bits_buffer_is_dropped_in_a_forked_child() -> None:
    src = SecureBits()
    src.random_bits(8)  # fill the buffer in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must not replay the parent's buffered bytes
        os.close(read)
        os.write(write, b"1" if src._buf == b"" else b"0")
        os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
