"""GetConfig's per-window answer for a heavy-hitters metric, and the shuffler's round check.

The round file (``crowdmix.core.rounds``) is what the round job writes; the shuffler's
``ConfigService`` serves, for the window a device is in, the round of that window (and
the neighbours' rounds), re-reading the file when it changes; a report naming a window
without a round, or a clear index outside its round, is refused before it is stored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from crowdmix.client.device_config import from_proto
from crowdmix.client.discovery import WindowEncoder, device_round
from crowdmix.core.discovery import REPORT_BYTES, PrefixRound, ValueRound
from crowdmix.core.errors import ParamsError
from crowdmix.core.registry import Registry, parse_registry
from crowdmix.core.rounds import RoundBook, ServedRound, read_rounds, write_rounds
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.shuffler.config_service import ConfigService, RoundFile
from crowdmix.shuffler.errors import ConfigError, InvalidRequest
from crowdmix.shuffler.intake import Intake
from crowdmix.shuffler.validation import RowsIn
from tests.discovery.test_heavy_hitters_registry import ENTRY

HOUR = 3600
W = 500_000  # a window index (hours since 1970: the year 2027)


def _registry() -> Registry:
    return parse_registry(
        {"metrics": {"words": dict(ENTRY)}, "collection": {"window_seconds": HOUR}}
    )


def _prefix(window: int) -> ServedRound:
    return ServedRound(
        round=0, window=window, opened=window, epsilon=3.0, start=0, stop=3, seeds=16, buckets=23
    )


def _file(tmp_path: Path, registry: Registry, *rounds: ServedRound) -> Path:
    metric = registry["words"]
    book = RoundBook()
    for r in rounds:
        book = book.with_round("words", metric.fingerprint, r)
    path = tmp_path / "rounds.json"
    write_rounds(path, book)
    return path


def _answer(service: ConfigService) -> pb.ConfigResponse:
    return service.answer(pb.GetConfigRequest().SerializeToString())


def test_get_config_serves_the_round_of_the_devices_window(tmp_path: Path) -> None:
    registry = _registry()
    second = ServedRound(
        round=1, window=W + 1, opened=W, epsilon=3.0, start=3, stop=7, seeds=16, buckets=23
    )
    value = ServedRound(round=2, window=W + 3, opened=W, epsilon=3.0, candidates=("abc", "de"))
    path = _file(tmp_path, registry, _prefix(W), second, value)
    now = [W * HOUR + 10.0]
    service = ConfigService(
        registry, None, clock=lambda: now[0], rounds=RoundFile(path, check_seconds=0.0)
    )
    answer = _answer(service)
    assert answer.window == W
    (info,) = answer.metrics
    assert info.encoding == "heavy-hitters" and info.report_bytes == REPORT_BYTES
    served = [(r.round, r.window) for r in info.heavy_hitters.rounds]
    assert served == [(0, W), (1, W + 1)]  # window W + 3 is not a neighbour of W
    config = from_proto(answer)
    mine = config.round_of("words", W)
    assert mine == _prefix(W)
    hh = config.metrics["words"].heavy_hitters
    assert hh is not None
    params = mine.params(hh)
    assert isinstance(params, PrefixRound) and params.cells == 16 * 23
    assert config.round_of("words", W + 1) == second
    assert config.round_of("words", W - 1) is None  # no round: a device there waits

    now[0] = (W + 3) * HOUR + 5.0  # three windows on: the value round and its candidates
    later = from_proto(_answer(service))
    assert later.round_of("words", W + 2) is None
    got = later.round_of("words", W + 3)
    assert got == value and later.round_of("words", W) is None
    assert isinstance(got.params(hh), ValueRound)
    assert later.version != config.version


def test_the_file_is_reread_and_rounds_of_other_params_are_not_served(tmp_path: Path) -> None:
    registry = _registry()
    path = tmp_path / "rounds.json"
    service = ConfigService(
        registry, None, clock=lambda: W * HOUR, rounds=RoundFile(path, check_seconds=0.0)
    )
    assert list(_answer(service).metrics[0].heavy_hitters.rounds) == []  # no file yet
    _file(tmp_path, registry, _prefix(W))
    assert len(_answer(service).metrics[0].heavy_hitters.rounds) == 1
    # a round file planned for other params (the registry entry changed): not served
    write_rounds(path, RoundBook().with_round("words", 12345, _prefix(W)))
    assert list(_answer(service).metrics[0].heavy_hitters.rounds) == []
    path.write_text("{not json")  # a broken file: the last good one is kept
    assert list(_answer(service).metrics[0].heavy_hitters.rounds) == []
    with pytest.raises(ParamsError, match="is not JSON"):
        read_rounds(path)


def test_a_served_window_is_never_rewritten() -> None:
    book = RoundBook().with_round("words", 1, _prefix(W))
    late = ServedRound(round=1, window=W, opened=W, epsilon=3.0, candidates=("a",))
    with pytest.raises(ParamsError, match="later window"):
        book.with_round("words", 1, late)
    with pytest.raises(ParamsError, match="does not follow"):
        book.with_round("words", 1, ServedRound(round=2, window=W + 5, opened=W, epsilon=1.0,
                                                candidates=("a",)))  # fmt: skip
    assert RoundBook.from_dict(book.to_dict()) == book


def _rows(window: int, indexes: list[int], fingerprint: int) -> RowsIn:
    bits = b"".join(i.to_bytes(REPORT_BYTES, "little") for i in indexes)
    ids = b"".join(bytes([k + 1]) * 16 for k in range(len(indexes)))
    return RowsIn("words", fingerprint, REPORT_BYTES, [0] * len(indexes), bits, ids, window)


def test_the_shuffler_takes_reports_only_for_a_served_round_and_its_indexes(tmp_path: Path) -> None:
    registry = _registry()
    with pytest.raises(ConfigError, match="rounds_file"):
        Intake(registry, clock=lambda: W * HOUR)
    path = _file(tmp_path, registry, _prefix(W))
    intake = Intake(registry, clock=lambda: W * HOUR + 60, rounds=RoundFile(path))
    fp = registry["words"].fingerprint
    _, n = intake.admit([_rows(W, [0, 5, 16 * 23 - 1], fp)], connection="t")
    assert n == 3
    with pytest.raises(InvalidRequest, match="index out of range") as info:
        intake.admit([_rows(W, [16 * 23], fp)], connection="t")
    assert info.value.reason == "value_range"
    with pytest.raises(InvalidRequest, match="serves no discovery round") as info:
        intake.admit([_rows(W - 1, [1], fp)], connection="t")
    assert info.value.reason == "no_round"


def test_the_sdk_encodes_one_wire_length_and_one_round_per_device() -> None:
    hh = _registry()["words"].heavy_hitters
    assert hh is not None
    enc = WindowEncoder(_prefix(W).params(hh), metric="words", fingerprint=7, window=W)
    report = enc.encode("apple")
    assert len(report.bits) == REPORT_BYTES and report.params_fingerprint == 7
    assert int.from_bytes(report.bits, "little") < 16 * 23
    # each device draws one round of a discovery, with the plan's shares
    rounds = [device_round(bytes([i % 256, i // 256]) * 16, "words", 7, W, hh.weights)
              for i in range(3000)]  # fmt: skip
    share = np.bincount(rounds, minlength=3) / 3000
    # deterministic (HMAC of fixed secrets); the tolerance is 3 sd of a share at n = 3000
    assert np.allclose(share, hh.weights, atol=0.03)
    again = device_round(b"\x01\x00" * 16, "words", 7, W, hh.weights)
    assert again == rounds[1]  # the same device, the same round
