"""The human status of a run waiting for an event: its name, and its deadline when it has one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tether.clioutput import run_status
from tether.store import EventWait, RunView

NOW = datetime(2026, 12, 3, 20, 0, tzinfo=UTC)


def parked_waiting(run_id: str = "r-1") -> RunView:
    return RunView(
        run_id=run_id,
        workflow_name="delivery",
        workflow_source_ref="",
        workflow_source=None,
        initialized=True,
        definition_digest="sha256:0",
        run_state_status="waiting",
        paused=False,
        status="parked",
        origin_session_id=None,
        execution_mode="headless",
        parent_run_id=None,
        root_run_id=run_id,
        lineage_kind=None,
        restart_number=0,
        parent_run_revision=None,
        error_code=None,
        error_message=None,
        created_at=NOW,
        updated_at=NOW,
        started_at=NOW,
        finished_at=None,
    )


def test_run_status__names_the_event_and_its_timeout() -> None:
    wait = EventWait("r-1", "attempt-1", "delivered", NOW + timedelta(hours=2))
    status = run_status(parked_waiting(), event=wait, now=NOW)
    assert status.text == "waiting for event delivered (times out at 2026-12-03 22:00:00 UTC, in 2 h 0 min)"
    assert status.kind == "later"  # a system sends it: not shown as a task for a person
    assert status.action == "tether event send r-1 delivered --payload JSON"


def test_run_status__an_event_without_a_timeout_has_no_deadline() -> None:
    wait = EventWait("r-1", "attempt-1", "approved", None)
    assert run_status(parked_waiting(), event=wait, now=NOW).text == "waiting for event approved"


def test_run_status__a_paused_run_says_paused_before_its_event() -> None:
    view = parked_waiting()
    paused = RunView(**{**view.__dict__, "paused": True})
    wait = EventWait("r-1", "attempt-1", "approved", None)
    assert run_status(paused, event=wait, now=NOW).text == "paused"
