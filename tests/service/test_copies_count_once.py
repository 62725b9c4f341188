"""Copies of a report count once whatever the clocks, retry delays or which shuffler takes them.

Three real in-process shufflers (gRPC on 127.0.0.1:0), each with its own clock
offset, in front of one real aggregator. A device learns the server time from
one of them (GetConfig), names the report's window by it, and sends copies of
the report (one report id, one window) to shufflers drawn per copy, after drawn
delays. Whatever is drawn, the aggregator counts the
report once if any shuffler took a copy, never otherwise, and only in the window
the report names.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from crowdmix.aggregator.daemon.server import AggregatorServer, start_aggregator
from crowdmix.aggregator.store.memory import MemoryCountStore
from crowdmix.core.registry import Registry, parse_registry
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.shuffler.helpers import submit_request

WS = 3600  # the collection window
METRIC = "pages"
SHUFFLERS = 3
# Each example lives in its own stretch of windows, before the aggregator's present
# (its clock is the real one: it refuses windows ahead of it) and within retention.
STRETCH = 6


def _registry() -> Registry:
    return parse_registry(
        {
            "collection": {"window_seconds": WS},
            "metrics": {
                METRIC: {
                    "encoding": "rappor", "k": 16, "h": 2, "m": 8,
                    "f": 0.5, "p": 0.5, "q": 0.75,
                    "shuffle": {
                        "min_batch": 1, "max_batch": 1000,
                        "max_delay_seconds": 0.01, "disposal_days": 30,
                    },
                }
            },
        }
    )  # fmt: skip


@dataclass
class Rig:
    registry: Registry
    aggregator: AggregatorServer
    shufflers: list[ShufflerHandle]
    stubs: list[crowdmix_pb2_grpc.ShufflerStub]
    now: list[float]  # the true time, shared by every shuffler clock
    offsets: list[float]  # each shuffler's clock minus the true time


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    registry = _registry()
    aggregator = start_aggregator(registry, MemoryCountStore())
    now = [time.time()]
    offsets = [0.0] * SHUFFLERS
    fast = ShufflerSettings(tick_seconds=0.005)
    shufflers = [
        start_shuffler(
            registry,
            MemoryStore(),
            aggregator.target,
            settings=fast,
            clock=lambda i=i: now[0] + offsets[i],  # type: ignore[misc]
        )
        for i in range(SHUFFLERS)
    ]
    channels = [grpc.insecure_channel(f"127.0.0.1:{h.port}") for h in shufflers]
    try:
        yield Rig(
            registry,
            aggregator,
            shufflers,
            [crowdmix_pb2_grpc.ShufflerStub(c) for c in channels],
            now,
            offsets,
        )
    finally:
        for c in channels:
            c.close()
        for h in shufflers:
            h.stop(grace=2)
        aggregator.stop()


def _settled(rig: Rig) -> None:
    """Wait until every shuffler has forwarded what it took and seen it acknowledged."""
    deadline = time.monotonic() + 20
    while any(h.store.pending(METRIC) or h.store.inflight_ids(METRIC) for h in rig.shufflers):
        assert time.monotonic() < deadline, "the shufflers did not forward everything"
        time.sleep(0.005)


# a clock offset: anything up to most of a window either way
offsets = st.floats(-0.95 * WS, 0.95 * WS, allow_nan=False)
copy = st.tuples(st.integers(0, SHUFFLERS - 1), st.floats(0, 2.5 * WS, allow_nan=False))
report = st.tuples(
    st.floats(0, WS, exclude_max=True, allow_nan=False),  # when it is made, in the window
    st.integers(0, SHUFFLERS - 1),  # the shuffler its device learned the time from
    st.lists(copy, min_size=1, max_size=4),  # each copy: which shuffler, how much later
)

_examples = [0]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(clock_offsets=st.lists(offsets, min_size=SHUFFLERS, max_size=SHUFFLERS),
       reports=st.lists(report, min_size=1, max_size=4))  # fmt: skip
def test_copies_of_a_report_count_once_whatever_the_clocks_delays_or_shuffler(
    rig: Rig,
    clock_offsets: list[float],
    reports: list[tuple[float, int, list[tuple[int, float]]]],
) -> None:
    _examples[0] += 1
    start = (int(time.time() // WS) - 2 * STRETCH - STRETCH * _examples[0]) * WS
    rig.offsets[:] = clock_offsets
    # report i: cohort i, a fresh id, the window its device names
    named: list[int] = []
    sends: list[tuple[float, int, pb.Report]] = []
    for i, (made, learned_from, copies) in enumerate(reports):
        rig.now[0] = start + made
        answer = rig.stubs[learned_from].GetConfig(pb.GetConfigRequest(), timeout=10)
        window = int(answer.server_time // answer.window_seconds)  # as the SDK takes it
        named.append(window)
        one = pb.Report(
            metric=METRIC,
            cohort=i,
            bits=os.urandom(2),
            params_fingerprint=rig.registry[METRIC].fingerprint,
            report_id=os.urandom(16),
            window=window,
        )
        sends += [(start + made + delay, s, one) for s, delay in copies]
    taken = [0] * len(reports)
    for at, s, one in sorted(sends, key=lambda x: x[0]):
        rig.now[0] = at
        try:
            rig.stubs[s].Submit(submit_request(reports=[one]), timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc.details()
            assert exc.details().startswith(("window_closed:", "window_ahead:")), exc.details()
            continue
        taken[one.cohort] += 1
    _settled(rig)
    event(f"reports taken more than once: {sum(t > 1 for t in taken)}")

    store = rig.aggregator.store
    windows = range(start // WS - 1, start // WS + 4)
    for i, window in enumerate(named):
        per_window = {
            w: int(counts.totals[i]) if (counts := store.load(METRIC, [w])) is not None else 0
            for w in windows
        }
        expected = {w: int(w == window and taken[i] > 0) for w in windows}
        assert per_window == expected, (i, window, taken[i])
    assert all(int(np.sum(store.load(METRIC, [w]).totals[len(reports) :])) == 0  # type: ignore[union-attr]
               for w in windows if store.load(METRIC, [w]) is not None)  # fmt: skip
