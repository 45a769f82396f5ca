"""A workflow edited while a run waits for a person or an event, as a user meets it: the answer
comes after the workers restarted on the new definition. The run says why it waits, the inbox
lists it, ``tether resume`` does not pretend, and ``--accept-changes`` moves it on. Real
``tether worker`` processes on both backends."""

from __future__ import annotations

import json
import signal
from subprocess import Popen

import pytest

from tests.integration.support import Lab, wait_for

pytestmark = pytest.mark.slow

GATED = '''
"""A release gated by a person, and a shipment that waits for its delivery event."""

from tether import Workflow, compute, decision, wait_for_event


def build(ctx):
    return {"built": True}


def publish(ctx):
    return {"published": ctx.outputs["approve"]["response"], "edition": 1}


def close(ctx):
    return {"signed_by": ctx.outputs["wait"]["payload"]["by"], "edition": 1}


release = Workflow(
    "release",
    start="build",
    nodes=[
        compute("build", build),
        decision("approve", "Publish?", options=["yes", "no"]),
        compute("publish", publish),
        compute("drop", build),
    ],
    edges={"build": "approve", "approve.yes": "publish", "approve.no": "drop"},
)

shipment = Workflow(
    "shipment",
    start="pack",
    nodes=[compute("pack", build), wait_for_event("wait", "delivered"), compute("close", close)],
    edges={"pack": "wait", "wait": "close"},
)
'''


def _stop(worker: Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0


def _edit(lab: Lab) -> None:
    """Edit one step of each workflow: their definitions change, their graphs do not."""
    path = lab.folder / "gated.py"
    path.write_text(path.read_text().replace('"edition": 1', '"edition": 2'))


def _row(lab: Lab, run_id: str) -> dict[str, object]:
    listed = lab.cli("runs", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = [r for r in json.loads(listed.stdout)["runs"] if r["run_id"] == run_id]
    return dict(row)


def _stranded(lab: Lab, run_id: str) -> None:
    """What a user sees of a run answered on a definition no live worker has any more."""
    row = wait_for(
        lambda: "no live worker" in str((r := _row(lab, run_id))["summary"]) and r,
        what="runs to say no live worker has the run's definition",
    )
    assert str(row["summary"]).startswith(
        f"no live worker has workflow {row['workflow_name']} at this definition"
    )
    assert row["action"] == f"tether resume {run_id} --accept-changes"
    assert "waiting for a person" not in lab.cli("show", run_id).stdout
    inbox = json.loads(lab.cli("inbox", "--json").stdout)
    [item] = [i for i in inbox if i["run_id"] == run_id]
    assert item["kind"] == "stranded" and item["action"] == f"tether resume {run_id} --accept-changes"

    before = lab.client.store.events_after(0, run_id=run_id, limit=10_000)
    resumed = lab.cli("resume", run_id)
    assert resumed.returncode == 5, resumed.stdout
    assert "was not resumed: it is queued already, and no live worker has workflow" in resumed.stderr
    assert "tether resume" in resumed.stderr and "Traceback" not in resumed.stderr
    assert lab.client.store.events_after(0, run_id=run_id, limit=10_000) == before, "a refusal writes nothing"


def test_a_decision_answered_after_the_workflow_changed_moves_on_when_accepted(any_lab: Lab) -> None:
    lab = any_lab
    (lab.folder / "gated.py").write_text(GATED)
    first = lab.worker("w-before")
    run_id = lab.start("release")
    [decision] = wait_for(lambda: lab.client.decisions(run_id), what="the decision to open")
    old_digest = lab.view(run_id).definition_digest

    unanswered = lab.cli("resume", run_id)
    assert unanswered.returncode == 5
    assert f"it waits for decision {decision.decision_id} (tether answer {decision.decision_id} ANSWER)" in (
        unanswered.stderr
    )
    refused = lab.cli("resume", run_id, "--accept-changes")
    assert refused.returncode == 5 and "already uses the definition" in refused.stderr

    _stop(first)
    _edit(lab)
    lab.worker("w-after")
    answered = lab.cli("answer", decision.decision_id, "yes")
    assert answered.returncode == 0, answered.stderr
    _stranded(lab, run_id)
    assert lab.view(run_id).definition_digest == old_digest

    accepted = lab.cli("resume", run_id, "--accept-changes")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.startswith(f"{run_id}: resumed on the new definition (sha256:")
    result = lab.wait_finished(run_id)
    assert (result.status, result.error_code) == ("done", None), result.error_message
    assert result.output == {"published": "yes", "edition": 2}
    [moved] = [e for e in lab.events(run_id) if e.type == "run.definition_accepted"]
    assert moved.payload["continueAfter"] == "approve" and moved.payload["from"] == old_digest
    steps = [(a.node_id, a.status) for a in lab.client.store.attempts(run_id)]
    assert steps == [("build", "completed"), ("approve", "completed"), ("publish", "completed")]


def test_an_event_sent_after_the_workflow_changed_moves_on_when_accepted(any_lab: Lab) -> None:
    lab = any_lab
    (lab.folder / "gated.py").write_text(GATED)
    first = lab.worker("w-before")
    run_id = lab.start("shipment")
    wait_for(lambda: lab.client.store.event_wait(run_id), what="the run to wait for its event")
    not_yet = lab.cli("resume", run_id)
    assert not_yet.returncode == 5
    assert f"it waits for event delivered (tether event send {run_id} delivered)" in not_yet.stderr

    _stop(first)
    _edit(lab)
    lab.worker("w-after")
    sent = lab.cli("event", "send", run_id, "delivered", "--payload", '{"by": "R. Diaz"}')
    assert sent.returncode == 0, sent.stderr
    _stranded(lab, run_id)

    accepted = lab.cli("resume", run_id, "--accept-changes")
    assert accepted.returncode == 0, accepted.stderr
    result = lab.wait_finished(run_id)
    assert (result.status, result.error_code) == ("done", None), result.error_message
    assert result.output == {"signed_by": "R. Diaz", "edition": 2}


def test_an_answer_the_new_definition_cannot_route_is_refused_and_changes_nothing(any_lab: Lab) -> None:
    lab = any_lab
    (lab.folder / "gated.py").write_text(GATED)
    first = lab.worker("w-before")
    run_id = lab.start("release")
    [decision] = wait_for(lambda: lab.client.decisions(run_id), what="the decision to open")
    _stop(first)
    path = lab.folder / "gated.py"
    # The new definition no longer offers the answer given.
    path.write_text(
        path.read_text()
        .replace('options=["yes", "no"]', 'options=["ship", "no"]')
        .replace('"approve.yes": "publish"', '"approve.ship": "publish"')
    )
    assert lab.cli("answer", decision.decision_id, "yes").returncode == 0
    before = lab.client.store.events_after(0, run_id=run_id, limit=10_000)
    refused = lab.cli("resume", run_id, "--accept-changes")
    assert refused.returncode == 5, refused.stdout
    assert 'the answer "yes" to approve is not one of its options there (ship, no)' in refused.stderr
    assert lab.client.store.events_after(0, run_id=run_id, limit=10_000) == before
    assert lab.view(run_id).status == "queued"
