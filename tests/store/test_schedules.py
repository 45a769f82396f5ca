"""The schedules table: adding, declaring, pausing and removing schedules, and the
compare-and-set that fires a tick once however many workers race for it."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from tests.store.conftest import at, reserve_args, row_dicts
from tether.errors import Conflict, InvalidInput, NotFound
from tether.store import ScheduleSpec, Store

#: 09:00 on weekdays in Paris; at(0) is Thursday 2026-01-01 00:00 UTC, so the first tick after it
#: is Thursday 08:00 UTC (winter time, UTC+1).
WEEKDAYS = ScheduleSpec("morning", "demo", "0 9 * * 1-5", "Europe/Paris", {"team": "ops"}, "skip")
HOUR_MS = 3_600_000


def stored(store: Store) -> list[dict[str, Any]]:
    return row_dicts(store, "SELECT * FROM schedules ORDER BY name")


def test_schedule_add__is_due_at_its_first_tick_in_its_zone(store: Store) -> None:
    added = store.schedule_add(WEEKDAYS, now=at(0))
    assert added.next_due_at == at(8 * HOUR_MS)
    assert (added.origin, added.paused, added.input, added.last_run_id) == (
        "added",
        False,
        {"team": "ops"},
        None,
    )
    assert store.schedules() == [added]
    assert store.schedule("morning") == added


def test_schedule_add__follows_daylight_saving(store: Store) -> None:
    # 2026-03-30 is the first weekday of Paris summer time (UTC+2): 09:00 there is 07:00 UTC.
    added = store.schedule_add(WEEKDAYS, now="2026-03-28T12:00:00Z")
    assert added.next_due_at.isoformat() == "2026-03-30T07:00:00+00:00"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cron": "61 * * * *"}, "Invalid cron expression '61 * * * *'"),
        ({"cron": "* * * *"}, "give five fields"),
        ({"cron": "0 0 31 2 *"}, "matches no date"),
        ({"timezone": "Europe/Pariss"}, "Unknown time zone 'Europe/Pariss'"),
        ({"timezone": "europe/paris"}, "did you mean Europe/Paris"),
        ({"catch_up": "all"}, "Invalid catch-up policy 'all'"),
        ({"name": "has:colon"}, "Invalid schedule name"),
        ({"name": ""}, "schedule name"),
        ({"input": {"x": float("nan")}}, "schedule input"),
    ],
)
def test_schedule_add__refuses_a_bad_spec_writing_nothing(
    store: Store, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=re.escape(message)):
        store.schedule_add(replace(WEEKDAYS, **change), now=at(0))
    assert stored(store) == []


def test_schedule_add__refuses_a_name_taken(store: Store) -> None:
    store.schedule_add(WEEKDAYS, now=at(0))
    before = stored(store)
    with pytest.raises(Conflict, match="A schedule named morning exists already"):
        store.schedule_add(replace(WEEKDAYS, cron="*/5 * * * *"), now=at(1000))
    assert stored(store) == before


def test_schedules_declare__inserts_keeps_redeclares_and_deletes(store: Store) -> None:
    first = ScheduleSpec("demo:0", "demo", "0 * * * *", "UTC", None, "skip")
    second = ScheduleSpec("demo:nightly", "demo", "0 2 * * *", "UTC", {"n": 1}, "one")
    assert store.schedules_declare("demo", [first, second], now=at(0)) == ["demo:0", "demo:nightly"]
    assert store.schedule_set_paused("demo:0", True, now=at(1))
    # The same declaration again writes nothing: ticks and pauses stay.
    assert store.schedules_declare("demo", [first, second], now=at(30 * 60_000)) == []
    kept = store.schedule("demo:0")
    assert kept is not None and kept.paused and kept.next_due_at == at(HOUR_MS)
    # A changed one starts over from its next tick; one the code dropped is deleted.
    changed = replace(first, cron="30 * * * *")
    assert store.schedules_declare("demo", [changed], now=at(40 * 60_000)) == ["demo:0", "demo:nightly"]
    assert [s.name for s in store.schedules()] == ["demo:0"]
    redeclared = store.schedule("demo:0")
    assert redeclared is not None and redeclared.cron == "30 * * * *"
    assert redeclared.next_due_at == at(90 * 60_000) and redeclared.origin == "declared"


def test_schedules_declare__leaves_added_schedules_and_other_workflows_alone(store: Store) -> None:
    store.schedule_add(WEEKDAYS, now=at(0))
    store.schedules_declare("other", [ScheduleSpec("other:0", "other", "0 * * * *", "UTC", None, "skip")])
    store.schedules_declare("demo", [], now=at(0))
    assert [s.name for s in store.schedules()] == ["morning", "other:0"]


def test_schedules_declare__refuses_a_name_not_of_the_workflow(store: Store) -> None:
    with pytest.raises(InvalidInput, match="<workflow>:<name>"):
        store.schedules_declare("demo", [ScheduleSpec("other:0", "demo", "0 * * * *", "UTC", None, "skip")])
    assert stored(store) == []


def test_schedule_set_paused__pauses_and_resumes_from_the_next_tick(store: Store) -> None:
    store.schedule_add(WEEKDAYS, now=at(0))
    assert store.schedule_set_paused("morning", True, now=at(1))
    assert not store.schedule_set_paused("morning", True, now=at(2))
    assert store.schedules_due(workflow_names=["demo"], now=at(9 * HOUR_MS)) == []
    # Resumed a week later: due at the next tick, not at the ones that passed meanwhile.
    assert store.schedule_set_paused("morning", False, now=at(7 * 24 * HOUR_MS))
    resumed = store.schedule("morning")
    assert resumed is not None and not resumed.paused
    assert resumed.next_due_at == at(7 * 24 * HOUR_MS + 8 * HOUR_MS)
    with pytest.raises(NotFound, match="Schedule not found: nope"):
        store.schedule_set_paused("nope", True)


def test_schedule_remove__deletes_an_added_one_and_refuses_a_declared_one(store: Store) -> None:
    store.schedule_add(WEEKDAYS, now=at(0))
    store.schedules_declare("demo", [ScheduleSpec("demo:0", "demo", "0 * * * *", "UTC", None, "skip")])
    with pytest.raises(Conflict, match="declared by workflow demo's code"):
        store.schedule_remove("demo:0")
    store.schedule_remove("morning")
    assert [s.name for s in store.schedules()] == ["demo:0"]
    with pytest.raises(NotFound):
        store.schedule_remove("morning")


def test_schedules_due__only_the_named_workflows_due_and_not_paused(store: Store) -> None:
    store.schedule_add(WEEKDAYS, now=at(0))
    store.schedule_add(replace(WEEKDAYS, name="other", workflow_name="other"), now=at(0))
    assert store.schedules_due(workflow_names=["demo"], now=at(8 * HOUR_MS - 1)) == []
    assert [s.name for s in store.schedules_due(workflow_names=["demo"], now=at(8 * HOUR_MS))] == ["morning"]
    assert store.schedules_next_due(workflow_names=["demo", "other"]) == at(8 * HOUR_MS)
    assert store.schedules_next_due(workflow_names=["absent"]) is None


def test_schedules__another_project_sees_none(store: Store, open_at: Callable[..., Store]) -> None:
    store.schedule_add(WEEKDAYS, now=at(0))
    other = open_at("elsewhere")
    assert other.schedules() == []
    assert other.schedules_due(workflow_names=["demo"], now=at(9 * HOUR_MS)) == []
    assert [s.name for s in open_at(None).schedules()] == ["morning"]


def test_schedule_advance__moves_on_once_and_records_the_run(store: Store) -> None:
    added = store.schedule_add(WEEKDAYS, now=at(0))
    due = added.next_due_at
    assert store.schedule_advance(
        name="morning",
        expected_due=due,
        next_due=at(32 * HOUR_MS),
        tick=due,
        run_id="run-1",
        now=at(8 * HOUR_MS),
    )
    # The same tick again (a worker that read the row before): refused, nothing written.
    assert not store.schedule_advance(name="morning", expected_due=due, next_due=at(32 * HOUR_MS))
    moved = store.schedule("morning")
    assert moved is not None
    assert (moved.next_due_at, moved.last_tick_at, moved.last_run_id) == (at(32 * HOUR_MS), due, "run-1")


def test_schedule_advance__a_paused_schedule_does_not_move(store: Store) -> None:
    added = store.schedule_add(WEEKDAYS, now=at(0))
    store.schedule_set_paused("morning", True, now=at(1))
    assert not store.schedule_advance(
        name="morning", expected_due=added.next_due_at, next_due=at(32 * HOUR_MS)
    )


def test_schedule_advance__two_racing_workers_reserve_one_run(
    store: Store, open_at: Callable[..., Store]
) -> None:
    """What a worker does per tick, from two stores at once behind a barrier: advance by
    compare-and-set, then reserve the tick's run in the same transaction. One wins."""
    added = store.schedule_add(WEEKDAYS, now=at(0))
    stores = [open_at(), open_at()]
    barrier = threading.Barrier(2)
    outcomes: list[bool] = []
    errors: list[BaseException] = []

    def fire(racer: Store) -> None:
        try:
            barrier.wait(10)
            with racer.transaction():
                moved = racer.schedule_advance(
                    name="morning", expected_due=added.next_due_at, next_due=at(32 * HOUR_MS), run_id="run-1"
                )
                if moved:
                    racer.reserve(**reserve_args("run-1", execution_mode="headless", now=None))
            outcomes.append(moved)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=fire, args=(racer,)) for racer in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert sorted(outcomes) == [False, True]
    assert [r.run_id for r in store.list_runs()] == ["run-1"]
