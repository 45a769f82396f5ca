"""Events into a running run as a user sends them: ``tether event send`` to a run a real
``tether worker`` holds parked at its wait, on both backends."""

from __future__ import annotations

import json

from tests.integration.support import Lab, wait_for

APPROVALS = '''
"""A workflow that waits for an approval event."""

from tether import Workflow, compute, wait_for_event

SCHEMA = {"type": "object", "properties": {"by": {"type": "string"}}, "required": ["by"]}

approval = Workflow(
    "sign_off",
    start="wait",
    nodes=[
        wait_for_event("wait", "approved", schema=SCHEMA),
        compute("ship", lambda ctx: {"approved_by": ctx.outputs["wait"]["payload"]["by"]}),
    ],
    edges={"wait": "ship"},
)
'''


def test_event_send__a_waiting_run_takes_it_and_a_bad_payload_is_refused(any_lab: Lab) -> None:
    lab = any_lab
    (lab.folder / "approvals.py").write_text(APPROVALS)
    lab.worker("w1")
    run_id = lab.start("sign_off")
    wait_for(
        lambda: lab.view(run_id).run_state_status == "waiting",
        timeout=30,
        what="the run to wait for its event",
    )

    listed = lab.cli("runs", "--json")
    [row] = [r for r in json.loads(listed.stdout)["runs"] if r["run_id"] == run_id]
    assert row["summary"] == "waiting for event approved"
    assert row["action"] == f"tether event send {run_id} approved --payload JSON"

    bad = lab.cli("event", "send", run_id, "approved", "--payload", '{"by": 7}')
    assert bad.returncode == 4 and "Traceback" not in bad.stderr
    assert "Event approved does not match its schema" in bad.stderr
    unknown = lab.cli("event", "send", run_id, "shipped")
    assert unknown.returncode == 4 and "waits for no event named 'shipped'" in unknown.stderr
    assert lab.client.store.inbox(run_id) == []

    sent = lab.cli("event", "send", run_id, "approved", "--payload", '{"by": "ann"}', "--json")
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["name"] == "approved"
    result = lab.wait_finished(run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"approved_by": "ann"}
    late = lab.cli("event", "send", run_id, "approved", "--payload", '{"by": "bob"}')
    assert late.returncode == 5 and "takes no more events" in late.stderr


DELIVERIES = '''
"""A workflow that waits for a delivery event, at most two hours, and one that sleeps."""

from tether import Workflow, compute, sleep, wait_for_event

delivery = Workflow(
    "delivery",
    start="wait",
    nodes=[
        wait_for_event("wait", "delivered", timeout_s=7200),
        compute("done", lambda ctx: {"late": ctx.outputs["wait"].get("timedOut", False)}),
    ],
    edges={"wait.ok": "done", "wait.timeout": "done"},
)
nap = Workflow("nap", start="z", nodes=[sleep("z", 3600)])
'''


def test_runs_and_show__say_a_run_waits_for_an_event_with_its_timeout_and_filter_it(any_lab: Lab) -> None:
    lab = any_lab
    (lab.folder / "deliveries.py").write_text(DELIVERIES)
    lab.worker("w1")
    waiting = lab.start("delivery")
    napping = lab.start("nap")
    wait_for(
        lambda: lab.view(waiting).run_state_status == "waiting" and lab.view(napping).status == "parked",
        timeout=30,
        what="one run to wait for its event and one to sleep",
    )
    wait = lab.client.store.event_wait(waiting)
    assert wait is not None and wait.deadline_at is not None
    until = f"times out at {wait.deadline_at:%Y-%m-%d %H:%M:%S} UTC, in "

    listed = lab.cli("runs")
    assert listed.returncode == 0, listed.stderr
    assert f"waiting for event delivered ({until}" in listed.stdout
    as_json = {r["run_id"]: r for r in json.loads(lab.cli("runs", "--json").stdout)["runs"]}
    assert as_json[waiting]["summary"].startswith(f"waiting for event delivered ({until}")
    assert as_json[napping]["summary"].startswith("sleeping until")

    only = json.loads(lab.cli("runs", "--waiting-for-event", "--json").stdout)
    assert [r["run_id"] for r in only["runs"]] == [waiting] and only["total"] == 1
    plain = lab.cli("runs", "--waiting-for-event")
    assert waiting in plain.stdout and napping not in plain.stdout

    shown = lab.cli("show", waiting)
    assert shown.returncode == 0, shown.stderr
    assert f"waiting: waiting for event delivered ({until}" in shown.stdout
    assert f"next: tether event send {waiting} delivered --payload JSON" in shown.stdout

    # It waits for a system, not a person: not in the inbox.
    inbox = lab.cli("inbox", "--json")
    assert inbox.returncode == 0, inbox.stderr
    assert [item for item in json.loads(inbox.stdout) if item["run_id"] == waiting] == []

    assert lab.cli("event", "send", waiting, "delivered").returncode == 0
    assert lab.wait_finished(waiting).status == "done"
    after = lab.cli("runs", "--waiting-for-event")
    assert after.returncode == 0 and "no runs waiting for an event" in after.stdout
