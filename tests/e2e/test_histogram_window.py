"""Shuffled histograms from ``client.Reporter`` to the aggregator, one batch per window.

Real components: a redis-server (the shuffler's store), the shuffler and the
aggregator on real gRPC (in this process, so the test can move the *shuffler's*
clock to the end of its collection window instead of waiting an hour), the
aggregator opening sealed reports with its key set; devices are
``client.Reporter`` instances, and for the crash test separate Python processes
that this test SIGKILLs.

- A device's real report and its fakes are claimed in one outbox transaction,
  sent sealed in ONE Submit call, deleted together on the acknowledgement.
- The shuffler releases nothing of the histogram while its window can still receive
  reports, then the whole window in one batch once it is closed and its grace period
  is over; a
  RAPPOR metric on the same shuffler still goes out in batches of ``max_batch``.
- A shuffler shut down mid-window releases nothing of it; the next one started on
  the same Redis releases the window whole once it is over.
- The aggregator's count per bucket equals what the devices' outboxes held (real
  and fake reports alike), exactly.
- A device killed after the shuffler acknowledged its group, before its outbox
  deleted it, re-sends the whole group with the same report ids after its restart,
  in one call, and every report is counted once.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from crowdmix import client
from crowdmix.aggregator.daemon.server import AggregatorServer, start_aggregator
from crowdmix.aggregator.store import load_batch_sizes, load_counts, open_store
from crowdmix.aggregator.store.base import CountStore
from crowdmix.client.histogram import HistogramEncoder
from crowdmix.client.randomness import shared_secure_bits
from crowdmix.client.rappor import RapporEncoder
from crowdmix.client.transport import ShufflerClient
from crowdmix.core.params import RapporParams
from crowdmix.core.registry import Registry, parse_registry
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.redis_store import RedisStore
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.daemons import kill_at
from tests.shuffler.helpers import write_keys
from tests.waiting import eventually

pytestmark = pytest.mark.slow  # real processes or servers, seconds each

TOKEN = "app-token-hist"
HIST = "screens"
RAPPOR = "home_page"
D = 6
M = 3  # fake slots: at most 1 + 3 reports per device and window
HOUR = 3600
GRACE = 60.0
RAPPOR_PARAMS = {"k": 16, "h": 2, "m": 4, "f": 0.5, "p": 0.5, "q": 0.75}


def _registry() -> Registry:
    return parse_registry(
        {
            "metrics": {
                HIST: {  # released per window: a histogram's default in a registry file
                    "encoding": "shuffled-histogram",
                    "domain_size": D,
                    "fake_slots": M,
                    "fake_probability": 0.5,
                    "shuffle": {"min_batch": 5, "release_grace_seconds": GRACE},
                },
                RAPPOR: {
                    "encoding": "rappor",
                    **RAPPOR_PARAMS,
                    "shuffle": {"min_batch": 1, "max_batch": 100, "max_delay_seconds": 0.05},
                },
            },
            "collection": {"window_seconds": HOUR},
        }
    )


@dataclass
class System:
    registry: Registry
    shuffler: ShufflerHandle
    aggregator: AggregatorServer
    counts: CountStore
    store: RedisStore
    now: list[float]  # the shuffler's clock

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.shuffler.port}"

    def end_window(self) -> None:
        """Move the shuffler's clock past the moment its window closes (the end of the
        next window: it takes the window before the current one too) and the grace."""
        window = self.registry.window_of(self.now[0])
        self.now[0] = (window + 2) * HOUR + GRACE + 1.0

    def hist_counts(self) -> list[int]:
        counts = load_counts(self.counts, self.registry[HIST])
        return [int(x) for x in np.asarray(counts.ones).reshape(-1)[:D]]

    def counted(self, metric: str) -> int:
        """Reports counted (a repeated report id is not)."""
        try:
            counts = load_counts(self.counts, self.registry[metric])
        except LookupError:  # nothing counted yet
            return 0
        return int(np.asarray(counts.totals).sum())


@pytest.fixture
def system(tmp_path: Path, redis_url: str) -> Iterator[System]:
    registry = _registry()
    t = int(time.time())
    # valid from an hour back: the device judges a key on the shuffler's clock, which
    # this test holds in the middle of the current hour
    _, keys_file, public = write_keys(tmp_path, t, valid_from=t - HOUR)
    counts = open_store(None)
    aggregator = start_aggregator(registry, counts, listen="127.0.0.1:0", keys_file=str(keys_file))
    # the shuffler's clock stands still in the middle of a window until the test moves it
    window = registry.window_of(time.time())
    now = [window * HOUR + HOUR / 2]
    store = RedisStore(redis_url)
    shuffler = start_shuffler(
        registry,
        store,
        f"127.0.0.1:{aggregator.port}",
        settings=ShufflerSettings(public_keys=str(public)),
        tokens=frozenset({TOKEN}),
        clock=lambda: now[0],
    )
    try:
        yield System(registry, shuffler, aggregator, counts, store, now)
    finally:
        shuffler.stop()
        aggregator.stop()
        store.close()


def _sent(rows: list[Any]) -> np.ndarray:
    return np.bincount([int.from_bytes(r.report.bits, "little") for r in rows], minlength=D)


def _reporter(system: System, app: Path, **options: Any) -> client.Reporter:
    """A device of this system: plaintext gRPC, sends on flush, histograms allowed
    without a local ε (the registry sets none); it has fetched the config (and the
    shuffler's time: its windows are the shuffler's)."""
    r = client.Reporter(
        app,
        system.target,
        token=TOKEN,
        tls=False,
        background=False,
        allow_unrandomized_histograms=True,
        **options,
    )
    assert r.flush(timeout=20) == 0
    return r


def test_reporter_groups_are_counted_exactly_in_one_batch_per_window(
    system: System, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []  # reports per Submit call, in order (devices send one by one)
    original = client.Reporter._submit

    def submit(self: client.Reporter, request: Any, timeout: float) -> int:
        calls.append(len(request.reports))
        return original(self, request, timeout)

    monkeypatch.setattr(client.Reporter, "_submit", submit)

    devices = 12
    sent = np.zeros(D, dtype=np.int64)
    groups: list[int] = []
    for i in range(devices):
        with _reporter(system, tmp_path / f"dev{i}") as r:
            assert r.report(HIST, i % D)
            assert not r.report(HIST, (i + 1) % D)  # one claim per window
            rows = r._outbox.next_group()  # the group, as the outbox holds it
            assert 1 <= len(rows) <= 1 + M and len({x.window for x in rows}) == 1
            sent += _sent(rows)
            groups.append(len(rows))
            assert r.flush(timeout=20) == 0
            assert r.queued == 0 and r.counters()["delivered"] == len(rows)
    # one call per device, carrying its whole group
    assert calls == groups
    total = int(sent.sum())
    assert total == sum(groups) >= devices

    # RAPPOR on the same shuffler: 250 reports in one go leave in batches of max_batch
    enc = RapporEncoder(RapporParams(**RAPPOR_PARAMS), secret=b"s" * 32, metric=RAPPOR)
    with ShufflerClient(system.target, TOKEN, sealing="required") as bulk:
        bulk.submit_many([enc.encode(f"v{i % 7}") for i in range(250)])
        assert bulk.flush() == 250
    assert eventually(lambda: system.counted(RAPPOR) == 250)
    assert max(system.counts.batch_sizes(RAPPOR)) == 100  # cut at max_batch

    # the histogram's window is still open: nothing of it is released
    time.sleep(1.0)  # many release passes (tick) with every report stored
    assert system.counted(HIST) == 0
    assert sum(system.store.pending(HIST).values()) == total

    system.end_window()
    assert eventually(lambda: system.counted(HIST) == total)
    assert load_batch_sizes(system.counts, HIST) == [total]  # ONE batch: the window
    assert system.hist_counts() == sent.tolist()  # real + fake, exactly
    assert system.store.pending(HIST) == {}
    # the aggregator counts the batch before the shuffler deletes it (on the reply): wait
    # for the delete instead of racing it
    assert eventually(lambda: system.store.inflight_ids(HIST) == [])


def test_a_shutdown_mid_window_releases_nothing_and_the_next_start_releases_it_whole(
    system: System, tmp_path: Path
) -> None:
    """README: a window is not released when the shuffler shuts down; with Redis it
    waits for the next start."""
    sent = np.zeros(D, dtype=np.int64)
    for i in range(5):  # min_batch is 5: enough whatever the fakes
        with _reporter(system, tmp_path / f"dev{i}") as r:
            assert r.report(HIST, i)
            sent += _sent(r._outbox.next_group())
            assert r.flush(timeout=20) == 0
    total = int(sent.sum())
    system.shuffler.stop()  # SIGTERM's path: the final release pass runs
    assert system.counted(HIST) == 0
    assert sum(system.store.pending(HIST).values()) == total
    with start_shuffler(
        system.registry,
        RedisStore(system.store._url),
        f"127.0.0.1:{system.aggregator.port}",
        settings=ShufflerSettings(public_keys=str(tmp_path / "public.json")),
        tokens=frozenset({TOKEN}),
        clock=lambda: system.now[0],
        owns_store=True,
    ):
        system.end_window()
        assert eventually(lambda: system.counted(HIST) == total)
        assert load_batch_sizes(system.counts, HIST) == [total]
        assert system.hist_counts() == sent.tolist()


def test_sealing_off_is_refused_for_a_histogram_metric(system: System, tmp_path: Path) -> None:
    with _reporter(system, tmp_path / "clear", sealing="off") as r:
        refused = r.report(HIST, 1)
        assert refused.status is client.ReportStatus.REFUSED_UNSEALED
        assert "shuffled histogram: its reports are sent sealed or not at all" in refused.detail
        assert r.queued == 0


def test_a_full_outbox_counts_every_row_of_a_group(system: System, tmp_path: Path) -> None:
    """A group is claimed whole or not at all: with room for one row, a histogram's
    group (1 + Binomial(3, 1/2) rows: more than one w.p. 7/8) is refused unless it
    happens to be a lone real report; then the claim is made with exactly one row."""
    for i in range(8):
        app = tmp_path / f"full{i}"
        with _reporter(system, app, max_reports=1) as r:
            made = r.report(HIST, 2)
            # the coins of the real report and the fakes: the process's CSPRNG source
            (encoder,) = r._encoders.values()
            assert isinstance(encoder, HistogramEncoder)
            assert encoder._rand is shared_secure_bits()
            rows = r._outbox.next_group()
            assert (bool(made), len(rows)) in ((True, 1), (False, 0))
            if not made:
                assert made.status is client.ReportStatus.OUTBOX_FULL
                assert r._outbox.last_window(HIST) is None  # nothing claimed
                assert r.counters()["outbox_full"] == 1


# The child: one device. argv: app_dir target token kill_point ("" for none).
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from crowdmix import client
    from crowdmix.client import reporter as reporter_mod

    app_dir, target, token, point = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]

    def stop_here(name):
        if name == point:
            (app_dir / f"at-{name}").write_text("")
            time.sleep(600)  # the test SIGKILLs us now

    calls = []
    orig_submit = reporter_mod.Reporter._submit
    def submit(self, request, timeout):
        calls.append(len(request.reports))
        stop_here("before_send")
        accepted = orig_submit(self, request, timeout)
        stop_here("after_ack")
        return accepted
    reporter_mod.Reporter._submit = submit

    r = client.Reporter(
        app_dir, target, token=token, tls=False, background=False,
        allow_unrandomized_histograms=True,
    )
    r.flush(timeout=20)  # the config (report() never waits for the network), and what waits
    made = r.report("screens", 4)
    left = r.flush(timeout=20)
    print(f"made={bool(made)} left={left} calls={calls}")
    r.close()
    """
)


def _device(system: System, app: Path, point: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(app), system.target, TOKEN, point],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _outbox(app: Path) -> list[tuple[bytes, bytes]]:
    db = sqlite3.connect(app / "outbox.sqlite3")
    try:
        return [(bytes(a), bytes(b)) for a, b in db.execute("SELECT report_id, bits FROM outbox")]
    finally:
        db.close()


@pytest.mark.parametrize("point", ["after_ack", "before_send"])
def test_a_killed_device_resends_its_whole_group_with_the_same_ids_counted_once(
    system: System, tmp_path: Path, point: str
) -> None:
    app = tmp_path / point
    proc = _device(system, app, point)
    kill_at(proc, app / f"at-{point}")
    group = _outbox(app)
    assert 1 <= len(group) <= 1 + M
    stored_before = sum(system.store.pending(HIST).values())
    # after_ack: the shuffler has the group, the outbox still holds it
    assert stored_before == (len(group) if point == "after_ack" else 0)

    proc = _device(system, app, "")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    # nothing new is claimed; the old group leaves in ONE call, whole
    assert f"made=False left=0 calls=[{len(group)}]" in out, (out, err)
    assert _outbox(app) == []
    assert sum(system.store.pending(HIST).values()) == stored_before + len(group)

    # four more devices, so that the window reaches min_batch (5) in any case
    sent = np.bincount([int.from_bytes(bits, "little") for _, bits in group], minlength=D)
    for i in range(4):
        with _reporter(system, tmp_path / f"other{i}") as r:
            assert r.report(HIST, i)
            sent += _sent(r._outbox.next_group())
            assert r.flush(timeout=20) == 0
    total = int(sent.sum())

    system.end_window()
    assert eventually(lambda: system.counted(HIST) == total)
    # one batch (after_ack: it held the killed device's group twice; the repeat is
    # dropped by its report ids, so the batch applied each report once)
    assert load_batch_sizes(system.counts, HIST) == [total]
    time.sleep(0.5)
    assert system.hist_counts() == sent.tolist()
