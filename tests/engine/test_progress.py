"""Progress from inside a step: ``ctx.progress(done, total, message)`` journals ``node.progress``
at most about once a second on the runner's clock (the first report and the last always), and
the client reads each step's latest report with the time left at the rate seen so far."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tether.engine.clock import FakeClock
from tether.engine.graph import Workflow, compute
from tether.errors import ClaimLost, InvalidInput
from tether.store import Progress
from tether.store.progress import check_progress

from .conftest import Engine, wait_until


def test_progress__reports_are_rate_limited_on_the_runners_clock(engine: Engine) -> None:
    clock = FakeClock()

    def work(ctx):  # type: ignore[no-untyped-def]
        for done in range(1, 6):
            ctx.progress(done, 5, f"item {done}")
            clock.advance(0.4)
        return {"items": 5}

    engine.register(Workflow("counted", start="work", nodes=[compute("work", work)]))
    engine.runner(clock=clock, lease_ms=60_000, renew_ms=20_000)
    run_id = engine.client.start("counted").run_id
    assert engine.wait(run_id).status == "done"

    reports = [e.payload for e in engine.store.events_after(0, run_id=run_id, event_type="node.progress")]
    # At 0 s (the first), 1.2 s (a second after it) and 1.6 s (the total reached); not 0.4 or 0.8.
    assert [(r["done"], r["message"]) for r in reports] == [(1, "item 1"), (4, "item 4"), (5, "item 5")]  # type: ignore[index]
    assert all(r["nodeId"] == "work" and r["total"] == 5 and r["attempt"] == 1 for r in reports)  # type: ignore[index]
    latest = engine.client.progress(run_id)["work"]
    assert (latest.done, latest.total, latest.fraction, latest.message) == (5, 5, 1.0, "item 5")
    assert latest.first_done == 1 and latest.seconds_left is None


def test_progress__a_running_step_has_a_time_left(engine: Engine) -> None:
    latch = engine.latch()

    def slow(ctx):  # type: ignore[no-untyped-def]
        ctx.progress(10, 100, "copying")
        latch.hold()
        return None

    engine.register(Workflow("slow", start="copy", nodes=[compute("copy", slow)]))
    engine.runner()
    run_id = engine.client.start("slow").run_id
    first = wait_until(lambda: engine.client.progress(run_id).get("copy"), what="the first report")
    assert (first.done, first.total, first.fraction) == (10, 100, 0.1)
    assert first.seconds_left is None  # one report: no rate yet
    [attempt] = engine.attempts(run_id)
    assert attempt.status == "running"
    latch.release.set()
    assert engine.wait(run_id).status == "done"


def test_progress__time_left_follows_the_rate_since_the_first_report() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    report = Progress("run-1", "copy", 1, 50, 100, None, start + timedelta(seconds=40), 10, start)
    assert report.seconds_left == pytest.approx(50.0)  # 40 done in 40 s: 50 more take 50 s
    assert report.fraction == 0.5
    unknown = Progress("run-1", "copy", 1, 50, None, None, start + timedelta(seconds=40), 10, start)
    assert unknown.fraction is None and unknown.seconds_left is None
    stalled = Progress("run-1", "copy", 1, 10, 100, None, start + timedelta(seconds=40), 10, start)
    assert stalled.seconds_left is None


def test_progress__a_report_without_the_claim_is_refused_and_writes_nothing(engine: Engine) -> None:
    engine.register(Workflow("idle", start="a", nodes=[compute("a", lambda ctx: None)]))
    run_id = engine.client.start("idle").run_id
    with pytest.raises(ClaimLost):
        engine.store.record_progress(run_id=run_id, claim_token="not-a-claim", node_id="a", attempt=1, done=1)
    assert engine.store.events_after(0, run_id=run_id, event_type="node.progress") == []
    with pytest.raises(Exception, match="not found"):
        engine.client.progress("run-unknown")


@pytest.mark.parametrize(
    ("done", "total", "message", "says"),
    [
        (-1, None, None, "done must be a number of at least 0"),
        (True, None, None, "done must be a number"),
        (5, 4, None, "total must be above 0 and at least done"),
        (0, 0, None, "total must be above 0"),
        (1, None, 7, "message must be text"),
    ],
)
def test_progress__bad_values_are_refused(done: object, total: object, message: object, says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        check_progress(done, total, message)
