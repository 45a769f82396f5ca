"""Runners fire schedules: one run per due tick, the catch-up policy after downtime, nothing for
a paused schedule or a workflow the runner did not load, and the schedules a workflow declares.

Downtime is a schedule added with an earlier ``now`` (the store's seam): its next tick lies in
the past when the runner first looks. The yearly cron's ticks (1 January, 00:00 UTC) are years
apart, so what was missed does not depend on when the test runs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from tether.engine.clock import FakeClock
from tether.engine.context import Context
from tether.engine.graph import Workflow, compute, notify
from tether.engine.schedules import Schedule
from tether.errors import Conflict, InvalidInput, NotFound
from tether.store import ScheduleRecord, ScheduleSpec

from .conftest import Engine, wait_until

YEARLY = "0 0 1 1 *"
LONG_AGO = "2020-06-01T00:00:00Z"


def report(ctx: Context) -> dict[str, Any]:
    return {"input": ctx.input, "schedule": ctx.schedule}


REPORT = Workflow("report", start="build", nodes=[compute("build", report)])


def yearly(name: str, catch_up: str, workflow: str = "report") -> ScheduleSpec:
    return ScheduleSpec(name, workflow, YEARLY, "UTC", {"team": name}, catch_up)


def moved_on(engine: Engine, name: str, now: datetime) -> ScheduleRecord:
    """Wait until a runner moved the schedule on past ``now``."""

    def found() -> ScheduleRecord | None:
        schedule = engine.store.schedule(name)
        return schedule if schedule is not None and schedule.next_due_at > now else None

    return wait_until(found, what=f"schedule {name} to move on")


def test_catch_up_one__starts_one_run_for_the_missed_ticks(engine: Engine) -> None:
    engine.register(REPORT)
    engine.store.schedule_add(yearly("catchup", "one"), now=LONG_AGO)
    now = engine.store.now()
    engine.runner()
    schedule = moved_on(engine, "catchup", now)
    latest = f"{now.year}-01-01T00:00:00Z"
    run_id = f"sched-catchup-{now.year}0101T000000Z"
    assert schedule.last_run_id == run_id
    assert schedule.next_due_at.isoformat() == f"{now.year + 1}-01-01T00:00:00+00:00"
    result = engine.wait(run_id)
    assert result.status == "done", result.error_message
    missed = [f"{year}-01-01T00:00:00Z" for year in range(2021, now.year)]
    assert result.output == {
        "input": {"team": "catchup"},
        "schedule": {"name": "catchup", "tick": latest, "missed": missed, "missed_count": len(missed)},
    }
    assert [r.run_id for r in engine.store.list_runs()] == [run_id]


def test_catch_up_skip__starts_nothing_for_missed_ticks(engine: Engine) -> None:
    engine.register(REPORT)
    engine.store.schedule_add(yearly("skipper", "skip"), now=LONG_AGO)
    engine.store.schedule_add(yearly("marker", "one"), now=LONG_AGO)
    now = engine.store.now()
    engine.runner()
    skipped = moved_on(engine, "skipper", now)
    engine.wait(moved_on(engine, "marker", now).last_run_id or "")
    assert skipped.next_due_at.isoformat() == f"{now.year + 1}-01-01T00:00:00+00:00"
    assert skipped.last_run_id is None
    assert [r.run_id for r in engine.store.list_runs()] == [f"sched-marker-{now.year}0101T000000Z"]


def test_paused_schedule__starts_nothing(engine: Engine) -> None:
    engine.register(REPORT)
    paused = engine.store.schedule_add(yearly("paused", "one"), now=LONG_AGO)
    engine.store.schedule_set_paused("paused", True, now=LONG_AGO)
    engine.store.schedule_add(yearly("marker", "one"), now=LONG_AGO)
    now = engine.store.now()
    engine.runner()
    marker = moved_on(engine, "marker", now)
    engine.wait(marker.last_run_id or "")
    # The runner's sweep that fired the marker passed the paused schedule by.
    still = engine.store.schedule("paused")
    assert still is not None and still.paused
    assert (still.next_due_at, still.last_run_id) == (paused.next_due_at, None)
    assert [r.run_id for r in engine.store.list_runs()] == [marker.last_run_id]


def test_runner__fires_only_the_workflows_it_loaded(engine: Engine) -> None:
    engine.register(REPORT)
    engine.store.schedule_add(yearly("elsewhere", "one", workflow="absent"), now=LONG_AGO)
    engine.store.schedule_add(yearly("marker", "one"), now=LONG_AGO)
    now = engine.store.now()
    engine.runner()
    engine.wait(moved_on(engine, "marker", now).last_run_id or "")
    untouched = engine.store.schedule("elsewhere")
    assert untouched is not None and untouched.next_due_at.year == 2021 and untouched.last_run_id is None


def test_two_runners__one_run_per_tick(engine: Engine) -> None:
    engine.register(REPORT)
    engine.store.schedule_add(yearly("shared", "one"), now=LONG_AGO)
    now = engine.store.now()
    engine.runner(runner_id="a")
    engine.runner(runner_id="b")
    schedule = moved_on(engine, "shared", now)
    engine.wait(schedule.last_run_id or "")
    assert [r.run_id for r in engine.store.list_runs()] == [schedule.last_run_id]


def test_declared_schedules__are_written_by_the_runner_that_loads_the_workflow(engine: Engine) -> None:
    declared = Workflow(
        "report",
        start="build",
        nodes=[compute("build", report)],
        schedules=[Schedule("0 9 * * 1-5", tz="Europe/Paris", name="weekday", input={"team": "ops"})],
    )
    engine.register(declared)
    engine.store.schedules_declare("report", [yearly("report:dropped", "skip")])
    engine.runner()
    found = wait_until(
        lambda: [s for s in engine.store.schedules() if s.name == "report:weekday"],
        what="the declared schedule to be written",
    )
    assert (found[0].origin, found[0].cron, found[0].timezone, found[0].input) == (
        "declared",
        "0 9 * * 1-5",
        "Europe/Paris",
        {"team": "ops"},
    )
    # A declared schedule the code no longer has is deleted in the same write.
    assert [s.name for s in engine.store.schedules()] == ["report:weekday"]


def test_runner__wakes_for_the_next_tick_on_its_clock(engine: Engine) -> None:
    """An idle runner polling every ten minutes cuts its idle wait short at the next tick of a
    schedule of every minute: however long it idles, no wait on its clock runs past a minute."""
    engine.register(REPORT)
    engine.store.schedule_add(ScheduleSpec("minutely", "report", "* * * * *", "UTC", None, "skip"))
    clock = FakeClock()
    engine.runner(clock=clock, poll_ms=600_000, lease_ms=3_000_000, renew_ms=1_500_000)

    def loop_wait() -> float | None:
        # The claim loop's wait (at most the poll interval; the heartbeat's is 1500 s).
        waits = [w for w in clock.waiters() if 0 < w < 1000]
        return min(waits) if waits else None

    longest = []
    # Idle waits double from 10 ms towards the poll interval: uncut, one passes a minute within
    # 30 advances of 5 s.
    for _ in range(60):
        clock.advance(5)
        longest.append(wait_until(loop_wait, what="the runner to wait again"))
    assert max(longest) <= 61


def test_add_schedule__refuses_what_cannot_be_scheduled_writing_nothing(engine: Engine) -> None:
    engine.register(REPORT, Workflow("chatty", start="say", nodes=[notify("say", "hello")]))
    client = engine.client
    with pytest.raises(InvalidInput, match="a scheduled run has none"):
        client.add_schedule("chatty", "0 9 * * *")
    with pytest.raises(NotFound, match="Unknown workflow 'absent'"):
        client.add_schedule("absent", "0 9 * * *")
    with pytest.raises(InvalidInput, match="Invalid cron expression"):
        client.add_schedule("report", "0 9 * * 8")
    with pytest.raises(InvalidInput, match="input"):
        client.add_schedule("report", "0 9 * * *", input={"bad": {1, 2}})  # type: ignore[dict-item]
    assert client.schedules() == []
    added = client.add_schedule("report", "0 9 * * *")
    assert added.name == "report"
    with pytest.raises(Conflict, match="A schedule named report exists already"):
        client.add_schedule("report", "0 10 * * *")
    assert client.schedules() == [added]


COUNTED = Workflow(
    "counted",
    start="count",
    nodes=[compute("count", report)],
    input_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
)


def test_add_schedule__refuses_input_the_workflow_schema_refuses(engine: Engine) -> None:
    engine.register(COUNTED)
    client = engine.client
    with pytest.raises(InvalidInput, match=r"^Input of workflow counted does not match its input schema: "):
        client.add_schedule("counted", "0 9 * * *", input={"n": "x"})
    with pytest.raises(InvalidInput, match=r"input schema \(no input was given\)"):
        client.add_schedule("counted", "0 9 * * *")
    assert client.schedules() == []
    assert client.add_schedule("counted", "0 9 * * *", input={"n": 1}).input == {"n": 1}


def test_declared_schedule__with_input_the_schema_refuses_is_refused_when_declared() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with pytest.raises(InvalidInput, match=r"^Workflow counted: schedule nightly: Input of workflow counted"):
        Workflow(
            "counted",
            start="count",
            nodes=[compute("count", report)],
            input_schema=schema,
            schedules=[Schedule(YEARLY, input={"n": 1}), Schedule(YEARLY, name="nightly", input={"n": "x"})],
        )
    with pytest.raises(InvalidInput, match=r"^Workflow counted: schedule 0: .*\(no input was given\)"):
        Workflow(
            "counted",
            start="count",
            nodes=[compute("count", report)],
            input_schema=schema,
            schedules=[Schedule(YEARLY)],
        )


def test_tick__input_the_schema_refuses_fails_its_run_before_any_step(engine: Engine) -> None:
    engine.register(COUNTED)
    # Stored as if added before the workflow declared its schema (the client would refuse it).
    engine.store.schedule_add(
        ScheduleSpec("stale", "counted", YEARLY, "UTC", {"n": "x"}, "one"), now=LONG_AGO
    )
    now = engine.store.now()
    engine.runner()
    schedule = moved_on(engine, "stale", now)
    run_id = f"sched-stale-{now.year}0101T000000Z"
    assert schedule.last_run_id == run_id
    result = engine.wait(run_id)
    assert (result.status, result.error_code) == ("failed", "scheduleInputInvalid")
    assert (result.error_message or "").startswith(
        "Schedule stale fired with input its workflow refuses: Input of workflow counted does not match"
    )
    assert engine.store.attempts(run_id) == []
    assert schedule.next_due_at.year == now.year + 1 and not schedule.paused
