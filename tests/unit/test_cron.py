"""Cron arithmetic: the ticks of a schedule in its zone, and what a worker does with a due one."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tether.cron import MISSED_LISTED, ON_TIME_MS, iso, next_tick, plan, tick_run_id
from tether.engine.graph import Workflow, compute, notify
from tether.engine.schedules import Schedule
from tether.errors import InvalidInput


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def test_next_tick__reads_the_cron_in_its_zone_across_daylight_saving() -> None:
    assert iso(next_tick("0 9 * * 1-5", "Europe/Paris", ms("2026-03-27T08:00:00"))) == "2026-03-30T07:00:00Z"
    assert iso(next_tick("0 9 * * 1-5", "Europe/Paris", ms("2026-03-26T09:00:00"))) == "2026-03-27T08:00:00Z"
    assert iso(next_tick("0 9 * * *", "UTC", ms("2026-03-27T09:00:00"))) == "2026-03-28T09:00:00Z"


def test_plan__an_on_time_tick_runs_under_either_policy() -> None:
    due = ms("2026-01-05T09:00:00")
    for policy in ("skip", "one"):
        fired = plan("0 9 * * *", "UTC", policy, due, due + ON_TIME_MS)
        assert (fired.tick, fired.missed, fired.missed_count) == (due, (), 0)
        assert fired.next_due == ms("2026-01-06T09:00:00")


def test_plan__skip_runs_nothing_for_missed_ticks() -> None:
    due = ms("2026-01-05T09:00:00")
    now = ms("2026-01-08T10:00:00")
    fired = plan("0 9 * * *", "UTC", "skip", due, now)
    assert fired.tick is None
    assert fired.missed_count == 4  # the 5th, 6th, 7th and 8th
    assert fired.next_due == ms("2026-01-09T09:00:00")


def test_plan__skip_still_runs_the_latest_tick_when_it_is_on_time() -> None:
    due = ms("2026-01-05T09:00:00")
    fired = plan("0 9 * * *", "UTC", "skip", due, ms("2026-01-08T09:00:30"))
    assert fired.tick == ms("2026-01-08T09:00:00")
    assert fired.missed_count == 3


def test_plan__one_runs_the_latest_tick_naming_the_missed_ones() -> None:
    due = ms("2026-01-05T09:00:00")
    fired = plan("0 9 * * *", "UTC", "one", due, ms("2026-01-08T10:00:00"))
    assert fired.tick == ms("2026-01-08T09:00:00")
    assert [iso(t) for t in fired.missed] == [
        "2026-01-05T09:00:00Z",
        "2026-01-06T09:00:00Z",
        "2026-01-07T09:00:00Z",
    ]
    assert fired.missed_count == 3
    assert fired.next_due == ms("2026-01-09T09:00:00")


def test_plan__lists_at_most_the_latest_missed_ticks() -> None:
    due = ms("2026-01-05T00:00:00")
    fired = plan("* * * * *", "UTC", "one", due, due + 500 * 60_000)
    assert fired.missed_count == 500
    assert len(fired.missed) == MISSED_LISTED
    assert fired.missed[-1] == due + 499 * 60_000


def test_tick_run_id__is_the_schedule_and_the_tick() -> None:
    tick = ms("2026-01-05T09:00:00")
    assert tick_run_id("report:weekday", tick) == "sched-report.weekday-20260105T090000Z"
    assert tick_run_id("nightly", tick) != tick_run_id("nightly", tick + 60_000)


def test_schedule__refuses_a_bad_declaration() -> None:
    with pytest.raises(InvalidInput, match="Invalid cron expression"):
        Schedule("0 25 * * *")
    with pytest.raises(InvalidInput, match="Unknown time zone"):
        Schedule("0 9 * * *", tz="Mars/Olympus")
    with pytest.raises(InvalidInput, match="catch-up policy"):
        Schedule("0 9 * * *", catch_up="every")


def test_workflow__checks_its_schedules() -> None:
    step = compute("a", lambda ctx: None)
    with pytest.raises(InvalidInput, match="declares two schedules named w:0"):
        Workflow(
            "w", start="a", nodes=[step], schedules=[Schedule("0 9 * * *"), Schedule("0 9 * * *", name="0")]
        )
    with pytest.raises(InvalidInput, match="must be Schedule objects"):
        Workflow("w", start="a", nodes=[step], schedules=["0 9 * * *"])  # type: ignore[list-item]
    with pytest.raises(InvalidInput, match="a scheduled run has no session"):
        Workflow("w", start="n", nodes=[notify("n", "hi")], schedules=[Schedule("0 9 * * *")])


def test_workflow__schedules_are_not_part_of_the_definition() -> None:
    step = compute("a", lambda ctx: None)
    plain = Workflow("w", start="a", nodes=[step])
    scheduled = Workflow("w", start="a", nodes=[step], schedules=[Schedule("0 9 * * *")])
    assert plain.digest == scheduled.digest
