"""A round file never lets a device report twice in a discovery, nor serve a window twice.

Each device reports in the one round ``device_round`` picks, so a discovery's rounds
must sit one per window with consecutive indexes under one ``opened``; a new discovery
of the metric starts after every window already served; a round that does not fit
the metric's params is refused with a status at the shuffler, not an exception.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from crowdmix.aggregator.accounting import JsonFileLedgerStore, PrivacyLedger
from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.discovery.pipeline import (
    DiscoveryError,
    open_discovery,
    read_state,
    step_discovery,
)
from crowdmix.aggregator.store import load_batch_sizes
from crowdmix.aggregator.store.memory import MemoryCountStore
from crowdmix.client.device_config import from_proto
from crowdmix.core.errors import ParamsError
from crowdmix.core.registry import MetricConfig
from crowdmix.core.rounds import RoundBook, ServedRound, read_rounds, write_rounds
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.shuffler.config_service import ConfigService, RoundFile
from crowdmix.shuffler.errors import InvalidRequest
from crowdmix.shuffler.intake import Intake
from tests.discovery.test_round_config import HOUR, W, _prefix, _registry, _rows


def _two_rounds() -> RoundBook:
    second = ServedRound(
        round=1, window=W + 1, opened=W, epsilon=3.0, start=3, stop=7, seeds=16, buckets=23
    )
    return RoundBook().with_round("words", 1, _prefix(W)).with_round("words", 1, second)


def test_a_new_discovery_never_rewrites_a_served_window() -> None:
    book = _two_rounds()
    for window in (W, W + 1):  # served by the discovery opened in W
        with pytest.raises(ParamsError, match="later window"):
            book.with_round("words", 1, _prefix(window))
    with pytest.raises(ParamsError, match="later window"):  # other params: still served
        book.with_round("words", 2, _prefix(W + 1))
    assert book.with_round("words", 1, _prefix(W + 2)).rounds("words", 1) == (_prefix(W + 2),)


def _written(tmp_path: Path, edit: dict[str, object], at: int = 1) -> Path:
    data = _two_rounds().to_dict()
    data["metrics"]["words"]["rounds"][at].update(edit)
    path = tmp_path / "rounds.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("edit", "at", "match"),
    [
        ({"round": 0}, 1, "round 0"),  # round 0 in two windows: its group reports twice
        ({"round": 2}, 1, "round 2"),  # a gap
        ({"window": W}, 1, "later window"),  # one window, two rounds
        ({"opened": W + 1}, 1, "opened"),  # two discoveries' rounds mixed
        ({"opened": W - 1}, 0, "opened"),  # round 0 names another window
        ({"epsilon": float("nan")}, 0, "epsilon"),
        ({"epsilon": 0}, 0, "epsilon"),
    ],
)
def test_a_round_file_where_a_device_could_report_twice_is_refused(
    tmp_path: Path, edit: dict[str, object], at: int, match: str
) -> None:
    with pytest.raises(ParamsError, match=match):
        read_rounds(_written(tmp_path, edit, at))


def test_the_shuffler_refuses_with_a_status_a_round_that_does_not_fit_the_metric(
    tmp_path: Path,
) -> None:
    registry = _registry()
    fp = registry["words"].fingerprint
    bad = ServedRound(
        round=0, window=W, opened=W, epsilon=3.0, start=0, stop=3, seeds=16, buckets=24
    )
    path = tmp_path / "rounds.json"
    write_rounds(path, RoundBook().with_round("words", fp, bad))
    intake = Intake(registry, clock=lambda: W * HOUR + 60, rounds=RoundFile(path))
    with pytest.raises(InvalidRequest, match="buckets") as info:
        intake.admit([_rows(W, [0], fp)], connection="t")
    assert info.value.reason == "no_round"


def test_get_config_leaves_out_a_round_that_does_not_fit_the_metric(tmp_path: Path) -> None:
    registry = _registry()
    fp = registry["words"].fingerprint
    bad = ServedRound(
        round=0, window=W, opened=W, epsilon=3.0, start=0, stop=3, seeds=16, buckets=24
    )
    path = tmp_path / "rounds.json"
    write_rounds(path, RoundBook().with_round("words", fp, bad))
    service = ConfigService(registry, None, clock=lambda: W * HOUR, rounds=RoundFile(path))
    config = from_proto(service.answer(pb.GetConfigRequest().SerializeToString()))
    assert "words" in config.metrics and config.round_of("words", W) is None


def _batch(store: MemoryCountStore, metric: MetricConfig, window: int, n: int, tag: bytes) -> None:
    acc = accumulator_for(metric)
    bits = (np.arange(n, dtype="<u4") % 900).tobytes()  # within every round's range
    acc.add(np.zeros(n, dtype=np.int64), np.frombuffer(bits, dtype=np.uint8).reshape(n, -1))
    assert store.apply(metric.name, window, tag, metric.fingerprint, acc)


def _step_files(tmp_path: Path) -> dict[str, Any]:
    return {"rounds_file": tmp_path / "rounds.json", "state_file": tmp_path / "state.json"}


def test_every_batch_of_a_rounds_window_is_within_the_ledgers_crowd(tmp_path: Path) -> None:
    """Two shufflers release round 0's window; the job steps after the first one: the
    second, smaller batch reaches the aggregator afterwards. Every batch holds at least
    min_batch reports (the shuffler's release rule) and ε0 was planned over min_batch,
    so the round's ledger entry states a crowd no larger than the late batch, and the
    late batch's own ε is within the entry's, which is within the target."""
    from crowdmix.aggregator.accounting.amplification import amplify

    registry = _registry()
    metric = registry["words"]
    m = metric.shuffle.min_batch
    files = _step_files(tmp_path)
    open_discovery(registry, metric, now=W * HOUR - 10.0, window=W, **files)
    store = MemoryCountStore()
    ledger = PrivacyLedger(JsonFileLedgerStore(tmp_path / "ledger.json", create=True))
    _batch(store, metric, W, 3 * m, b"shuffler-a")
    step = step_discovery(registry, metric, store, now=(W + 1) * HOUR + 1.0, ledger=ledger, **files)
    _batch(store, metric, W, m, b"shuffler-b")  # released late: the fewest a shuffler sends
    (entry,) = [r for r in ledger.releases("words") if r.window == W]
    late = min(load_batch_sizes(store, "words", [W]))
    assert entry.extra["crowd"] <= late and entry.extra["min_batch"] == m
    assert f"min_batch = {m}" in entry.extra["statement"]
    assert amplify(step.cost.epsilon0, late, entry.delta).epsilon <= entry.epsilon
    assert step.epsilon <= step.stated_epsilon == entry.epsilon <= metric.heavy_hitters.epsilon  # type: ignore[union-attr]


def test_a_batch_under_min_batch_is_refused_or_recorded_with_its_true_figure(
    tmp_path: Path,
) -> None:
    """Only a shuffler that does not enforce min_batch can send a smaller batch: its round
    is above the target, refused unless accepted (then the ledger holds its figure)."""
    registry = _registry()
    metric = registry["words"]
    files = _step_files(tmp_path)
    open_discovery(registry, metric, now=W * HOUR - 10.0, window=W, **files)
    store = MemoryCountStore()
    ledger = PrivacyLedger(JsonFileLedgerStore(tmp_path / "ledger.json", create=True))
    _batch(store, metric, W, 2000, b"shuffler-a")
    _batch(store, metric, W, 300, b"shuffler-b")
    after = (W + 1) * HOUR + 1.0
    with pytest.raises(DiscoveryError, match=r"above its target.*300 reports, fewer than min_"):
        step_discovery(registry, metric, store, now=after, ledger=ledger, **files)
    assert ledger.releases("words") == [] and read_state(files["state_file"]).state.next_round == 0
    step = step_discovery(
        registry, metric, store, now=after, ledger=ledger, accept_over_target=True, **files
    )
    (entry,) = ledger.releases("words")
    assert entry.extra["crowd"] == step.cost.n_reports == 300
    assert entry.epsilon == step.stated_epsilon == step.epsilon > metric.heavy_hitters.epsilon  # type: ignore[union-attr]


def test_a_release_id_taken_by_other_counts_is_never_read_as_recorded(tmp_path: Path) -> None:
    """The job reads a duplicate release id as its own re-run only when the counts are
    the same; a discovery reopened in the same window (its files removed) decodes other
    counts under the same id, and skipping them would understate the ledger."""
    registry = _registry()
    metric = registry["words"]
    files: dict[str, Any] = {
        "rounds_file": tmp_path / "rounds.json",
        "state_file": tmp_path / "state.json",
    }
    store = MemoryCountStore()
    ledger = PrivacyLedger(JsonFileLedgerStore(tmp_path / "ledger.json", create=True))
    open_discovery(registry, metric, now=W * HOUR - 10.0, window=W, **files)
    _batch(store, metric, W, 1200, b"first")
    after = (W + 1) * HOUR + 1.0
    assert step_discovery(registry, metric, store, now=after, ledger=ledger, **files).ledger
    for f in files.values():
        f.unlink()
    open_discovery(registry, metric, now=W * HOUR - 10.0, window=W, **files)
    _batch(store, metric, W, 1100, b"second")
    with pytest.raises(DiscoveryError, match="other counts"):
        step_discovery(registry, metric, store, now=after, ledger=ledger, **files)


@pytest.mark.parametrize(("windows", "next_round"), [([], 0), ([W], 7), ([W], -1)])
def test_a_state_file_whose_windows_do_not_match_its_round_is_refused(
    tmp_path: Path, windows: list[int], next_round: int
) -> None:
    registry = _registry()
    files: dict[str, Any] = {"rounds_file": tmp_path / "r.json", "state_file": tmp_path / "s.json"}
    open_discovery(registry, registry["words"], now=W * HOUR - 10.0, window=W, **files)
    data = json.loads(files["state_file"].read_text())
    data["windows"], data["state"]["next_round"] = windows, next_round
    files["state_file"].write_text(json.dumps(data))
    with pytest.raises(DiscoveryError, match="not a discovery state"):
        read_state(files["state_file"])


def test_a_round_file_gone_between_the_look_and_the_read_keeps_its_rounds(
    tmp_path: Path,
) -> None:
    """The shuffler's and the aggregator's round files see a changed stamp, then find
    the file gone when they read it (a rename over it, an operator's rm): both keep
    serving the last good rounds, never an empty book that would refuse every report."""
    from crowdmix.aggregator.daemon.rounds import RoundFile as AggregatorRoundFile

    path = tmp_path / "rounds.json"
    write_rounds(path, _two_rounds())
    shuffler = RoundFile(path, check_seconds=0.0)
    aggregator = AggregatorRoundFile(path)
    assert shuffler.book.rounds("words", 1) == aggregator.book().rounds("words", 1)
    path.unlink()
    # the stat said "changed" just before the file went: simulate that interleaving
    for watched in (shuffler, aggregator):
        watched._stamp = (0, 0, 0)  # type: ignore[attr-defined]
        watched._stat = lambda: (1, 1, 1)  # type: ignore[method-assign]
    assert shuffler.book.rounds("words", 1) == _two_rounds().rounds("words", 1)
    assert aggregator.book().rounds("words", 1) == _two_rounds().rounds("words", 1)
    # a file that is simply not there yet at start-up is no round, as before
    assert RoundFile(tmp_path / "none.json").book == RoundBook()
    assert AggregatorRoundFile(tmp_path / "none.json").book() == RoundBook()
