"""GetConfig's per-window answer for a heavy-hitters metric, and the shuffler's round check.

The round file (``crowdmix.core.rounds``) is what the round job writes; the shuffler's
``ConfigService`` serves, for the window a device is in, the round of that window (and
the neighbours' rounds), re-reading the file when it changes; a report naming a window
without a round, another round of its window, or a clear index outside its round, is
refused before it is stored.
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
    fp = _prefix(W).fingerprint(registry["words"].fingerprint)  # the round's
    chunks, n = intake.admit([_rows(W, [0, 5, 16 * 23 - 1], fp)], connection="t")
    assert n == 3 and list(chunks) == [("words", fp, W)]  # queued (and forwarded) under it
    with pytest.raises(InvalidRequest, match="index out of range") as info:
        intake.admit([_rows(W, [16 * 23], fp)], connection="t")
    assert info.value.reason == "value_range"
    with pytest.raises(InvalidRequest, match="serves no discovery round") as info:
        intake.admit([_rows(W - 1, [1], fp)], connection="t")
    assert info.value.reason == "no_round"


def test_the_shuffler_refuses_a_report_of_another_round_of_its_window(tmp_path: Path) -> None:
    """Encoded against another round file's round of the window (or the metric's own
    fingerprint, as before rounds were fingerprinted), clear or sealed: FAILED_PRECONDITION
    ``round_mismatch``, which the SDKs answer by fetching the config again."""
    from crowdmix.core.sealed import sealed_length
    from crowdmix.shuffler.errors import RoundMismatch
    from crowdmix.shuffler.validation import SealedIn, check_rounds

    registry = _registry()
    metric_fp = registry["words"].fingerprint
    path = _file(tmp_path, registry, _prefix(W))
    intake = Intake(registry, clock=lambda: W * HOUR + 60, rounds=RoundFile(path))
    other = ServedRound(round=0, window=W, opened=W, epsilon=4.0, start=0, stop=3, seeds=16,
                        buckets=59)  # fmt: skip
    for fp in (other.fingerprint(metric_fp), metric_fp, 0):
        with pytest.raises(RoundMismatch, match="fetch the config again") as info:
            intake.admit([_rows(W, [1], fp)], connection="t")
        assert info.value.reason == "round_mismatch"
    n = sealed_length(REPORT_BYTES)
    for fp in (other.fingerprint(metric_fp), 0):  # named beside the seal, or not at all
        sealed = SealedIn("words", [1], bytes(n), n, W, fingerprint=fp)
        with pytest.raises(RoundMismatch):
            check_rounds(registry, [sealed], RoundFile(path).round_of)
    ours = SealedIn("words", [1], bytes(n), n, W, fingerprint=_prefix(W).fingerprint(metric_fp))
    check_rounds(registry, [ours], RoundFile(path).round_of)


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


def test_the_aggregator_counts_a_window_only_against_its_rounds_fingerprint(
    tmp_path: Path,
) -> None:
    """Ingest reads the round file: a clear batch naming another round of its window, or a
    window without one, is refused (``round``); a sealed report naming another round is
    dropped and counted under ``round``, the window's own are counted. Without the round
    file a heavy-hitters metric refuses to start."""
    from crowdmix.aggregator.daemon.ingest import IngestBatch, Ingestor
    from crowdmix.aggregator.daemon.rounds import RoundFile as AggregatorRounds
    from crowdmix.aggregator.errors import ConfigError as AggregatorConfigError
    from crowdmix.aggregator.errors import InvalidBatch
    from crowdmix.aggregator.sealing.ingest import KeyFile, SealedBatch
    from crowdmix.aggregator.sealing.keys import KeySet, save_keyset
    from crowdmix.aggregator.store.memory import MemoryCountStore
    from crowdmix.client.sealing import seal_many

    registry = _registry()
    metric = registry["words"]
    ours = _prefix(W).fingerprint(metric.fingerprint)
    other = ServedRound(round=0, window=W, opened=W, epsilon=4.0, start=0, stop=3, seeds=16,
                        buckets=59).fingerprint(metric.fingerprint)  # fmt: skip
    path = _file(tmp_path, registry, _prefix(W))
    with pytest.raises(AggregatorConfigError, match="rounds-file"):
        Ingestor(registry, MemoryCountStore(), clock=lambda: W * HOUR)
    now = W * HOUR + 60
    keys, key = KeySet().with_new_key(int(now) - 60)
    save_keyset(tmp_path / "keys.json", keys, now=int(now), create=True)
    store = MemoryCountStore()
    ingest = Ingestor(registry, store, clock=lambda: now, rounds=AggregatorRounds(path),
                      keys=KeyFile(tmp_path / "keys.json"))  # fmt: skip

    def clear(fp: int, window: int, tag: int) -> IngestBatch:
        return IngestBatch(
            batch_id=bytes([tag]) * 16, window=window, metric="words", fingerprint=fp, count=2,
            report_bytes=REPORT_BYTES, cohorts=np.zeros(2, dtype=np.int64),
            bits=(3).to_bytes(4, "little") * 2,
            report_ids=bytes([tag, 1]) * 8 + bytes([tag, 2]) * 8,
        )  # fmt: skip

    for fp, window in ((other, W), (metric.fingerprint, W), (ours, W + 1)):
        with pytest.raises(InvalidBatch) as info:
            ingest.ingest(clear(fp, window, 1))
        assert info.value.reason == "round"
    assert ingest.ingest(clear(ours, W, 2)).applied == 2

    rows = [((5).to_bytes(4, "little"), 0, fp, bytes([9, i]) * 8)
            for i, fp in enumerate((ours, other, ours, metric.fingerprint))]  # fmt: skip
    sealed = seal_many(key.public(), "words", W, rows)
    batch = SealedBatch(
        batch_id=bytes([3]) * 16, window=W, metric="words", count=4,
        key_ids=np.full(4, key.key_id, dtype=np.int64), sealed=b"".join(sealed),
        sealed_bytes=len(sealed[0]),
    )  # fmt: skip
    result = ingest.ingest(batch)
    assert result.applied == 2 and result.dropped == {"round": 2}
