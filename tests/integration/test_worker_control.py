"""Operators controlling runs that real workers hold: cancel, pause, source changes."""

from __future__ import annotations

import json
import signal

import pytest

from tests.integration.support import Lab, wait_for

pytestmark = pytest.mark.slow


def test_cancel_during_an_applying_effect_leaves_it_ambiguous_and_the_run_cancelled(lab: Lab) -> None:
    run_id = lab.start("publishing", {"latch": "publish-latch"})
    worker = lab.worker("host-effects")
    effect = wait_for(
        lambda: next(iter(lab.client.store.effects(run_id=run_id, status="applying")), None),
        what="the effect to be applying",
    )

    cancel = lab.cli("cancel", run_id)
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.strip() == f"{run_id}: requested"
    result = lab.wait_finished(run_id)
    assert (result.status, result.run_state_status) == ("cancelled", "cancelled")
    [after_cancel] = lab.client.store.effects(run_id=run_id)
    assert (after_cancel.effect_id, after_cancel.status) == (effect.effect_id, "ambiguous")
    cancelled = [e for e in lab.events(run_id) if e.type == "run.queue_cancelled"]
    assert [(e.runner_id or "").partition("#")[0] for e in cancelled] == ["host-effects"], (
        "the holder cancels under its own claim"
    )
    before = lab.fingerprint()

    # The effect function returns after the cancel: its result must not be recorded.
    lab.release("publish-latch")
    wait_for(lambda: lab.executions(run_id, "pub", "end"), what="the effect function to return")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    assert lab.fingerprint() == before
    [final] = lab.client.store.effects(run_id=run_id)
    assert final.status == "ambiguous" and final.result is None
    assert lab.executions(run_id, "after") == []
    assert [(a.node_id, a.status) for a in lab.client.store.attempts(run_id)] == [
        ("prep", "completed"),
        ("pub", "cancelled"),
    ]
    listed = lab.cli("effects", "--run-id", run_id)
    assert listed.stdout.splitlines()[1].split()[:4] == [
        effect.effect_id,
        run_id,
        "workflow.pub",
        "ambiguous",
    ]


def test_pause_stops_an_input_wait_and_resume_lets_the_answer_through(lab: Lab) -> None:
    run_id = lab.start("form", session_id="session-pause")
    assert lab.cli("worker", "--until-idle", "--lease-ms", "1500", "--poll-ms", "50").returncode == 0
    view = lab.view(run_id)
    assert (view.status, view.run_state_status, view.paused) == ("parked", "waiting", False)

    paused = lab.cli("pause", run_id)
    assert (paused.returncode, paused.stdout.strip()) == (0, f"{run_id}: paused")
    assert lab.view(run_id).paused
    listed = lab.cli("runs")
    assert listed.stdout.splitlines()[1].split()[:3] == [run_id, "form", "paused"]
    # A paused run is not claimable: a worker leaves it alone.
    assert lab.cli("worker", "--until-idle", "--lease-ms", "1500", "--poll-ms", "50").returncode == 0
    assert lab.view(run_id).paused and lab.view(run_id).status == "parked"

    resumed = lab.cli("resume", run_id)
    assert (resumed.returncode, resumed.stdout.strip()) == (0, f"{run_id}: resumed")
    assert not lab.view(run_id).paused
    messages = json.loads(lab.cli("messages", "--session", "session-pause", "--json").stdout)
    [step] = [m for m in messages if m["kind"] == "step"]
    submitted = lab.cli(
        "submit", step["payload"]["requestId"], '{"name": "Ada"}', "--session", "session-pause"
    )
    assert submitted.returncode == 0 and submitted.stdout.strip().endswith(": validating")
    assert lab.cli("worker", "--until-idle", "--lease-ms", "1500", "--poll-ms", "50").returncode == 0

    result = lab.client.result(run_id)
    assert (result.status, result.run_state_status) == ("done", "completed")
    types = lab.event_types(run_id)
    assert types.index("run.paused") < types.index("run.resumed") < types.index("input.submitted")
    outputs = {a.node_id: a.output for a in lab.client.store.attempts(run_id) if a.status == "completed"}
    assert outputs["ask"] == {"value": {"name": "Ada"}, "provenance": "human"}
    notes = json.loads(lab.cli("messages", "--session", "session-pause", "--json").stdout)
    assert {"kind": "notification", "text": "hello Ada"} in [
        {"kind": m["kind"], "text": m["payload"].get("text")} for m in notes
    ]
