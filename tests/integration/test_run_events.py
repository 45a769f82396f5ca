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
