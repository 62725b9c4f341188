"""A report the shuffler acknowledged reaches the aggregator: it is never disposed of
unforwarded because its window was accepted past the disposal age.

The accept rule takes the current window and ``window_tolerance`` before it; the
releaser discards a window once it ended ``disposal_days`` ago (and the aggregator
refuses it one window later). When the accept rule reaches further back than the
disposal age, an acknowledged report is discarded: the shuffler must either refuse
it (``window_closed``, the device counts the drop) or forward it. Real shuffler and
real aggregator on loopback, both on the real clock.
"""

from __future__ import annotations

import time

import grpc

from crowdmix.aggregator.daemon.server import start_aggregator
from crowdmix.aggregator.store.memory import MemoryCountStore
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.shuffler.config import ShufflerSettings
from tests.shuffler.helpers import RAPPOR, current_window, make_registry, serving, submit_request
from tests.waiting import eventually

DAY = 86400


def _counted_or_refused(disposal_days: float, tolerance: int, window: int) -> None:
    registry = make_registry(min_batch=1, max_delay=0.01, disposal_days=disposal_days)
    counts = MemoryCountStore()
    aggregator = start_aggregator(registry, counts)
    settings = ShufflerSettings(tick_seconds=0.01, window_tolerance=tolerance)
    report = pb.Report(
        metric=RAPPOR,
        cohort=0,
        bits=b"\x01\x00",
        params_fingerprint=registry[RAPPOR].fingerprint,
    )
    target = f"127.0.0.1:{aggregator.port}"
    try:
        with serving(registry, None, target, grace=2, settings=settings) as (_, stub):
            try:
                stub.Submit(submit_request(reports=[report], window=window), timeout=10)
            except grpc.RpcError as exc:  # refused: the device hears of it and counts it
                assert exc.code() is grpc.StatusCode.FAILED_PRECONDITION
                assert (exc.details() or "").startswith("window_closed:")
                return

            def counted_once() -> bool:
                stored = counts.load(RAPPOR)
                return stored is not None and int(stored.totals.sum()) == 1

            counted = eventually(counted_once, 10, 0.02)
    finally:
        aggregator.stop()
    assert counted, (
        f"window {window} was acknowledged (tolerance {tolerance}, disposal_days "
        f"{disposal_days}) and never counted: the shuffler disposed of it unforwarded"
    )


def test_a_tolerance_reaching_past_the_disposal_age_never_acknowledges_what_it_discards() -> None:
    _counted_or_refused(disposal_days=1.0, tolerance=3, window=current_window() - 3)


def test_a_disposal_age_shorter_than_the_window_never_acknowledges_what_it_discards() -> None:
    into_day = time.time() % DAY
    if into_day < 20:  # just after the window turned: wait until some of it has passed
        time.sleep(20 - into_day)
        into_day = time.time() % DAY
    # the previous day ended `into_day` seconds ago: a disposal age of half that is past
    _counted_or_refused(disposal_days=into_day / 2 / DAY, tolerance=1, window=current_window() - 1)
