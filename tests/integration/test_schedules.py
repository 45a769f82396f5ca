"""Schedules as a user drives them: ``tether schedule`` commands, and real ``tether worker``
processes that fire due ticks, on both backends."""

from __future__ import annotations

import json
from typing import Any

from tests.integration.support import Lab, wait_for
from tether.store import ScheduleSpec

REPORTS = '''
"""A workflow with a declared schedule, for the schedule tests."""

from tether import Schedule, Workflow, compute


def build(ctx):
    return {"input": ctx.input, "schedule": ctx.schedule}


report = Workflow(
    "report",
    start="build",
    nodes=[compute("build", build)],
    schedules=[Schedule("0 9 * * 1-5", tz="Europe/Paris", name="weekday", input={"team": "ops"})],
)
'''


def with_reports(lab: Lab) -> Lab:
    (lab.folder / "reports.py").write_text(REPORTS)
    return lab


def listed(lab: Lab) -> list[dict[str, Any]]:
    done = lab.cli("schedule", "list", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert isinstance(found, list)
    return found


def test_schedule_commands__add_list_pause_resume_remove(any_lab: Lab) -> None:
    lab = with_reports(any_lab)
    assert listed(lab) == []
    # What a worker does when it starts: the declared schedule is written.
    assert lab.client.declare_schedules() == ["report:weekday"]
    added = lab.cli(
        "schedule", "add", "report", "*/15 * * * *", "--tz", "Asia/Tokyo", "--name", "quarterly",
        "--input", '{"team": "web"}', "--catch-up", "one", "--json",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["name"] == "quarterly"
    schedules = {s["name"]: s for s in listed(lab)}
    # The declared schedule shows up beside the added one.
    assert set(schedules) == {"quarterly", "report:weekday"}
    assert {
        k: schedules["quarterly"][k] for k in ("workflow_name", "cron", "timezone", "input", "catch_up")
    } == {
        "workflow_name": "report",
        "cron": "*/15 * * * *",
        "timezone": "Asia/Tokyo",
        "input": {"team": "web"},
        "catch_up": "one",
    }
    assert schedules["report:weekday"]["origin"] == "declared"
    assert schedules["quarterly"]["next_due_at"].endswith(("00:00Z", "15:00Z", "30:00Z", "45:00Z"))

    paused = lab.cli("schedule", "pause", "quarterly", "--json")
    assert json.loads(paused.stdout) == {"name": "quarterly", "paused": True, "changed": True}
    assert {s["name"]: s["paused"] for s in listed(lab)} == {"quarterly": True, "report:weekday": False}
    again = lab.cli("schedule", "pause", "quarterly")
    assert again.returncode == 0 and "paused already" in again.stdout
    resumed = lab.cli("schedule", "resume", "quarterly", "--json")
    assert json.loads(resumed.stdout)["changed"] is True

    declared = lab.cli("schedule", "remove", "report:weekday")
    assert declared.returncode == 5
    assert "declared by workflow report's code" in declared.stderr and "Traceback" not in declared.stderr
    removed = lab.cli("schedule", "remove", "quarterly", "--json")
    assert json.loads(removed.stdout) == {"name": "quarterly", "removed": True}
    assert [s["name"] for s in listed(lab)] == ["report:weekday"]
    unknown = lab.cli("schedule", "pause", "quarterly")
    assert unknown.returncode == 3 and "Schedule not found: quarterly" in unknown.stderr


def test_schedule_add__a_bad_cron_or_zone_is_refused_and_nothing_stored(any_lab: Lab) -> None:
    lab = with_reports(any_lab)
    for args, message in (
        (("61 * * * *",), "Invalid cron expression '61 * * * *'"),
        (("0 9 * *",), "give five fields"),
        (("0 9 * * *", "--tz", "Europe/Pariss"), "Unknown time zone 'Europe/Pariss'"),
        (("0 9 * * *", "--input", "{oops"), "--input is not valid JSON"),
        (("0 9 * * *", "--name", "a:b"), "Invalid schedule name 'a:b'"),
    ):
        done = lab.cli("schedule", "add", "report", *args)
        assert done.returncode == 4, (args, done.stderr)
        assert done.stderr.startswith("tether: ") and message in done.stderr
        assert "Traceback" not in done.stderr
    missing = lab.cli("schedule", "add", "nope", "0 9 * * *")
    assert missing.returncode == 3 and "Unknown workflow 'nope'" in missing.stderr
    assert listed(lab) == []


def test_two_workers__racing_due_ticks_start_one_run_each(any_lab: Lab) -> None:
    """Two real worker processes sweep the same due schedules: each tick starts exactly one run."""
    lab = with_reports(any_lab)
    lab.worker("w1")
    lab.worker("w2")
    wait_for(lambda: len(lab.client.store.live_workers()) == 2, timeout=30, what="both workers up")
    store = lab.client.store
    names = [f"race-{n}" for n in range(5)]
    for name in names:
        # Added as of long ago: its tick of this year is overdue, and catch-up "one" runs it.
        spec = ScheduleSpec(name, "report", "0 0 1 1 *", "UTC", {"n": name}, "one")
        store.schedule_add(spec, now="2020-06-01T00:00:00Z")
    year = store.now().year

    def fired() -> bool:
        return all((s := store.schedule(name)) is not None and s.last_run_id is not None for name in names)

    wait_for(fired, timeout=30, what="every schedule to fire")
    runs = [r.run_id for r in store.list_runs()]
    assert sorted(runs) == sorted(f"sched-{name}-{year}0101T000000Z" for name in names)
    for run_id in runs:
        result = lab.wait_finished(run_id)
        assert result.status == "done", result.error_message
        assert result.output["schedule"]["tick"] == f"{year}-01-01T00:00:00Z"
    # Both workers swept the schedules meanwhile, and still one run each.
    assert len(store.list_runs()) == len(names)


TYPED = '''
"""A workflow whose input must carry an integer n."""

from tether import Workflow, compute

typed = Workflow(
    "typed",
    start="count",
    nodes=[compute("count", lambda ctx: {"n": ctx.input["n"]})],
    input_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
)
'''


def test_schedule_add__input_the_workflow_schema_refuses_is_refused_as_start_refuses_it(any_lab: Lab) -> None:
    lab = any_lab
    (lab.folder / "typed.py").write_text(TYPED)
    started = lab.cli("start", "typed", "--input", '{"n": "x"}')
    assert started.returncode == 4
    for extra, given in (
        (("--input", '{"n": "x"}'), ""),
        ((), " (no input was given)"),
    ):
        done = lab.cli("schedule", "add", "typed", "*/2 * * * *", *extra)
        assert done.returncode == 4, done.stdout
        assert done.stderr.startswith(
            "tether: Input of workflow typed does not match its input schema" + given
        )
        assert "Traceback" not in done.stderr
    assert (
        started.stderr.splitlines()[0]
        in lab.cli("schedule", "add", "typed", "* * * * *", "--input", '{"n": "x"}').stderr
    )
    assert listed(lab) == []
    ok = lab.cli("schedule", "add", "typed", "*/2 * * * *", "--input", '{"n": 3}')
    assert ok.returncode == 0, ok.stderr
    assert [s["input"] for s in listed(lab)] == [{"n": 3}]


def test_a_tick_whose_input_the_schema_now_refuses_starts_no_step(any_lab: Lab) -> None:
    """A schedule stored before its workflow's schema changed: the tick's run is failed before any
    step, shown as the schedule's last run, and the worker logs why."""
    lab = any_lab
    (lab.folder / "typed.py").write_text(TYPED)
    store = lab.client.store
    store.schedule_add(
        ScheduleSpec("stale", "typed", "0 0 1 1 *", "UTC", {"n": "x"}, "one"), now="2020-06-01T00:00:00Z"
    )
    store.schedule_add(
        ScheduleSpec("good", "typed", "0 0 1 1 *", "UTC", {"n": 2}, "one"), now="2020-06-01T00:00:00Z"
    )
    lab.worker("w1")
    wait_for(
        lambda: all((s := store.schedule(n)) is not None and s.last_run_id for n in ("stale", "good")),
        timeout=30,
        what="both schedules to fire",
    )
    year = store.now().year
    bad_run = f"sched-stale-{year}0101T000000Z"
    good = lab.wait_finished(f"sched-good-{year}0101T000000Z")
    assert (good.status, good.output) == ("done", {"n": 2})
    refused = lab.client.result(bad_run)
    assert (refused.status, refused.error_code) == ("failed", "scheduleInputInvalid")
    assert "Schedule stale fired with input its workflow refuses: Input of workflow typed" in (
        refused.error_message or ""
    )
    assert store.attempts(bad_run) == []
    assert {s["name"]: s["last_run_id"] for s in listed(lab)}["stale"] == bad_run
    shown = lab.cli("runs", "--json")
    [row] = [r for r in json.loads(shown.stdout)["runs"] if r["run_id"] == bad_run]
    assert row["summary"] == "failed: scheduleInputInvalid"
    log = wait_for(lambda: "did not start run" in (t := lab.worker_log("w1")) and t, what="the warning")
    assert f"schedule stale did not start run {bad_run}" in log
    # The schedule stays, due at its next tick.
    stale = store.schedule("stale")
    assert stale is not None and stale.next_due_at.year == year + 1
