"""The runner's promises where users break them, through real ``tether worker`` processes on both
backends: cancel stops the next step, two processes with one ``--runner-id`` never run a step
twice, work waits for a worker that has its workflow, and a workflow's identity is its content."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest

from tests.integration.support import Lab, wait_for

pytestmark = pytest.mark.slow

#: A lease whose renewal (every third of it) comes long after the cancel must have taken effect:
#: what ends the run is the change notice, not the renewal.
LONG_LEASE_MS = "30000"


def test_cancel_during_a_step_stops_the_effect_after_it(any_lab: Lab) -> None:
    lab = any_lab
    run_id = lab.start("cooperative")
    worker = lab.worker("host-cancel", "--lease-ms", LONG_LEASE_MS)
    wait_for(lambda: lab.executions(run_id, "nap"), what="the napping step to start")

    cancel = lab.cli("cancel", run_id)
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.strip() == f"{run_id}: requested"
    result = lab.wait_finished(run_id)
    assert (result.status, result.run_state_status) == ("cancelled", "cancelled")

    events = lab.events(run_id)
    [requested] = [e for e in events if e.type == "run.cancel_requested"]
    [ended] = [e for e in events if e.type == "run.queue_cancelled"]
    # Well inside the first lease renewal (10 s): the worker heard the cancel by notice.
    assert ended.recorded_at - requested.recorded_at < timedelta(seconds=5)
    assert (ended.runner_id or "").startswith("host-cancel#"), "the holder ends it under its claim"
    wait_for(lambda: lab.executions(run_id, "nap", "cancelled"), what="the step to see ctx.cancelled")

    assert lab.executions(run_id, "pay") == [], "the effect after the cancelled step never ran"
    assert lab.client.store.effects(run_id=run_id) == []
    assert [(a.node_id, a.status) for a in lab.client.store.attempts(run_id)] == [("nap", "cancelled")]
    assert worker.poll() is None, "the worker keeps running"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0


def test_cancel_kills_a_running_command_at_once(any_lab: Lab) -> None:
    lab = any_lab
    run_id = lab.start("slowshell")
    worker = lab.worker("host-shell", "--lease-ms", LONG_LEASE_MS)
    wait_for(lambda: [x for x in lab.sink_lines() if x["node_id"] == "wait"], what="the command to start")
    assert lab.cli("cancel", run_id).stdout.strip() == f"{run_id}: requested"
    result = lab.wait_finished(run_id, timeout=8)
    assert result.status == "cancelled"
    [command] = [x for x in lab.sink_lines() if x["node_id"] == "wait"]
    wait_for(lambda: not _alive(command["pid"]), timeout=5, what="the command to be killed")
    assert lab.executions(run_id, "after") == []
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_two_workers_with_one_runner_id_never_run_a_step_twice(any_lab: Lab) -> None:
    lab = any_lab
    runs = [lab.start("healthy", run_id=f"twin-{n}") for n in range(10)]
    lab.worker("twin")
    lab.worker("twin")
    for run_id in runs:
        result = lab.wait_finished(run_id, timeout=60)
        assert (result.status, result.error_code) == ("done", None), result.error_message
    for run_id in runs:
        assert sorted(x["node_id"] for x in lab.sink_lines(run_id)) == ["one", "two"], run_id
        assert [a.status for a in lab.client.store.attempts(run_id)] == ["completed", "completed"]
    # Each process has an identity of its own under the one label.
    owners = {e.runner_id for run_id in runs for e in lab.events(run_id) if e.type == "run.queue_done"}
    assert all((owner or "").startswith("twin#") for owner in owners)


def test_a_worker_without_workflows_refuses_to_start(any_lab: Lab) -> None:
    lab = any_lab
    empty = lab.base / "empty"
    empty.mkdir()
    refused = lab.cli("worker", "--until-idle", folder=empty)
    assert refused.returncode != 0
    assert "No workflows found in" in refused.stderr and "Traceback" not in refused.stderr


def test_a_run_waits_for_a_worker_that_has_its_workflow(any_lab: Lab) -> None:
    lab = any_lab
    run_id = lab.start("healthy")
    other = lab.base / "other"
    other.mkdir()
    (other / "other.py").write_text(
        "from tether.engine.graph import Workflow, compute\n"
        "other = Workflow('other', start='a', nodes=[compute('a', lambda ctx: None)])\n"
    )
    lab.worker("host-other", folder=other)
    shown = wait_for(lambda: _shown_waiting(lab, run_id), what="show to say why the run waits")
    assert "waiting: no live worker has workflow healthy at this definition" in shown
    assert lab.view(run_id).status == "queued", "the worker without the workflow left the run alone"
    assert lab.sink_lines(run_id) == []

    lab.worker("host-right")
    assert lab.wait_finished(run_id).status == "done"
    assert "waiting:" not in lab.cli("show", run_id).stdout


def _shown_waiting(lab: Lab, run_id: str) -> str | None:
    """``tether show RUN``'s text once it says why the run waits."""
    shown = lab.cli("show", run_id).stdout
    return shown if "waiting: no live worker" in shown else None


def test_the_same_folder_spelled_two_ways_is_the_same_workflow(any_lab: Lab) -> None:
    lab = any_lab
    # Started through the relative spelling (the command runs in the lab folder) ...
    started = lab.cli("start", "healthy", folder=lab.folder.name)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    # ... executed by a worker that loaded the absolute one.
    lab.worker("host-absolute", folder=lab.folder.resolve())
    result = lab.wait_finished(run_id)
    assert (result.status, result.error_code) == ("done", None), result.error_message
    assert [x["node_id"] for x in lab.sink_lines(run_id)] == ["one", "two"]


def test_a_comment_edited_under_a_queued_run_does_not_strand_it(any_lab: Lab) -> None:
    lab = any_lab
    run_id = lab.start("healthy")
    lab.flows.write_text("# edited after the run was reserved\n" + lab.flows.read_text() + "\n# and here\n")
    assert lab.cli("worker", "--until-idle", "--lease-ms", "1500", "--poll-ms", "50").returncode == 0
    result = lab.client.result(run_id)
    assert (result.status, result.error_code) == ("done", None), result.error_message


STEPS_NODES = 'nodes=[compute("a", step), compute("b", step), compute("gate", gate), compute("d", step)],'
STEPS_EDGES = 'edges={"a": "b", "b": "gate", "gate": "d"},'


def test_a_changed_workflow_continues_on_the_new_definition_when_accepted(any_lab: Lab) -> None:
    lab = any_lab
    run_id = lab.start("steps", {"latch": "edit-latch"})
    first = lab.worker("host-before")
    wait_for(lambda: lab.executions(run_id, "gate"), what="the gate node to start")
    # A graceful stop hands the run back once the running node finished.
    first.send_signal(signal.SIGTERM)
    code = lab.flows.read_text()
    assert STEPS_NODES in code and STEPS_EDGES in code
    lab.flows.write_text(
        code.replace(STEPS_NODES, STEPS_NODES[:-2] + ', compute("e", step)],').replace(
            STEPS_EDGES, STEPS_EDGES[:-2] + ', "d": "e"},'
        )
    )
    lab.release("edit-latch")
    assert first.wait(timeout=15) == 0
    assert lab.view(run_id).status == "parked"

    lab.worker("host-after")
    shown = wait_for(lambda: _shown_waiting(lab, run_id), what="show to say the run waits for its definition")
    assert "no live worker has workflow steps at this definition" in shown
    assert lab.executions(run_id, "d") == []

    accepted = lab.cli("resume", run_id, "--accept-changes")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.startswith(f"{run_id}: resumed on the new definition (sha256:")
    result = lab.wait_finished(run_id)
    assert (result.status, result.error_code) == ("done", None), result.error_message
    assert [x["node_id"] for x in lab.sink_lines(run_id) if x["phase"] == "run"] == [
        "a",
        "b",
        "gate",
        "d",
        "e",
    ]
    [event] = [e for e in lab.events(run_id) if e.type == "run.definition_accepted"]
    assert event.payload["continueAfter"] == "gate"
    assert event.payload["to"] == lab.view(run_id).definition_digest != event.payload["from"]
    again = lab.cli("resume", run_id, "--accept-changes")
    assert again.returncode != 0 and "Traceback" not in again.stderr


def test_sigint_twice_hands_the_run_back_at_once_and_exits_130(any_lab: Lab) -> None:
    lab = any_lab
    run_id = lab.start("steps", {"latch": "sigint-latch"})
    worker = lab.worker("host-sigint", "--lease-ms", LONG_LEASE_MS)
    wait_for(lambda: lab.executions(run_id, "gate"), what="the gate node to start")

    worker.send_signal(signal.SIGINT)
    said = wait_for(
        lambda: "waiting for" in (log := lab.worker_log("host-sigint")) and log,
        what="the worker to say what it waits for",
    )
    assert f"{run_id} (node gate)" in said
    assert worker.poll() is None, "the first signal waits for the running step"

    worker.send_signal(signal.SIGINT)
    assert worker.wait(timeout=10) == 130
    view = lab.view(run_id)
    assert (view.status, view.error_code) == ("parked", None), "handed back at once, not left to its lease"
    assert [(a.node_id, a.status) for a in lab.client.store.attempts(run_id)][-1] == ("gate", "interrupted")
    assert "Traceback" not in lab.worker_log("host-sigint")

    lab.release("sigint-latch")
    lab.worker("host-next")
    result = lab.wait_finished(run_id)
    assert result.status == "done"
    assert len(lab.executions(run_id, "d")) == 1


def test_until_idle_waits_for_retries_and_sleeps_but_not_for_people(any_lab: Lab) -> None:
    lab = any_lab
    run_id = lab.start("patient")
    person = lab.start("approval")
    finished = lab.cli("worker", "--until-idle", "--lease-ms", "1500", "--poll-ms", "50")
    assert finished.returncode == 0, finished.stderr
    result = lab.client.result(run_id)
    assert (result.status, result.error_code) == ("done", None), result.error_message
    assert [x["attempt"] for x in lab.executions(run_id, "flaky")] == [1, 2]
    # The run waiting for a person's decision did not keep the worker alive.
    assert (lab.view(person).status, lab.view(person).run_state_status) == ("parked", "waiting")
    # The retried try's failure keeps its story, shown by `show`.
    shown = lab.cli("show", run_id).stdout
    assert "      ConnectionError: the first try fails" in shown
    assert "      Traceback (most recent call last):" in shown and "in flaky" in shown
