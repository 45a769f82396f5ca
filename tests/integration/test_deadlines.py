"""Deadlines as a user meets them: a run waiting for a person past its ``Workflow(timeout_s=)``
ends ``timed_out`` in a real ``tether worker``, ``tether show`` says so and ``tether watch``
exits 8; an answer after a decision's deadline is refused by ``tether answer`` with one clear
line, writing nothing, and the default applies once a worker sweeps."""

from __future__ import annotations

import signal

from tests.integration.support import Lab, wait_for

DEADLINES = '''
"""Workflows with deadlines."""

import time

from tether.engine.graph import Workflow, compute, decision


def stall(ctx):
    while not ctx.cancelled:  # stops once abandoned at the run's deadline
        time.sleep(0.05)
    return "late"

stalled = Workflow(
    "stalled",
    description="A step that never finishes by itself, in a run bounded to a second",
    start="stall",
    nodes=[compute("stall", stall)],
    timeout_s=1,
)

bounded = Workflow(
    "bounded",
    description="A person must approve within 3 seconds, or the run times out",
    start="ask",
    nodes=[decision("ask", "Ship it?", options=["approve", "reject"]), compute("done", lambda ctx: 1)],
    edges={"ask.approve": "done"},
    timeout_s=3,
)

hurried = Workflow(
    "hurried",
    description="A decision whose default applies after a second",
    start="ask",
    nodes=[
        decision("ask", "Ship it?", options=["approve", "reject"], deadline_s=1, default="reject"),
        compute("shipped", lambda ctx: "shipped"),
        compute("dropped", lambda ctx: "dropped"),
    ],
    edges={"ask.approve": "shipped", "ask.reject": "dropped"},
)
'''


def _lab_with_deadlines(lab: Lab) -> Lab:
    (lab.folder / "deadlines.py").write_text(DEADLINES)
    return lab


def test_run_timeout__a_run_waiting_for_a_decision_times_out_in_a_worker(any_lab: Lab) -> None:
    lab = _lab_with_deadlines(any_lab)
    worker = lab.worker("host-deadline")
    run_id = lab.start("bounded")
    [opened] = wait_for(lambda: lab.client.decisions(run_id), what="the decision to open")
    assert lab.view(run_id).run_state_status == "waiting"
    result = lab.wait_finished(run_id)
    assert (result.status, result.run_state_status, result.error_code) == (
        "failed",
        "timed_out",
        "runTimedOut",
    )
    assert "passed its deadline (3 s)" in (result.error_message or "")

    shown = lab.cli("show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "timed out" in shown.stdout
    watched = lab.cli("watch", run_id)
    assert watched.returncode == 8, watched.stdout + watched.stderr
    listed = lab.cli("runs")
    assert any(run_id in line and "timed out" in line for line in listed.stdout.splitlines()), listed.stdout

    [closed] = lab.client.decisions(run_id, open_only=False)
    assert (closed.decision_id, closed.outcome, closed.provenance) == (
        opened.decision_id,
        "cancelled",
        "expired_no_default",
    )
    answered = lab.cli("answer", closed.decision_id, "approve")
    assert answered.returncode == 5
    assert answered.stderr.startswith(f"tether: Decision {closed.decision_id} closed at ")
    assert "Workflow run timed out" in answered.stderr
    assert "Traceback" not in answered.stderr
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0


def test_run_timeout__tether_run_exits_8_for_a_run_that_timed_out(any_lab: Lab) -> None:
    lab = _lab_with_deadlines(any_lab)
    ran = lab.cli("run", "stalled", timeout=30)
    assert ran.returncode == 8, ran.stdout + ran.stderr
    assert "timed out" in ran.stdout
    assert "runTimedOut" in ran.stdout
    assert "Traceback" not in ran.stderr
    [view] = lab.client.store.list_runs()
    assert (view.status, lab.view(view.run_id).run_state_status) == ("failed", "timed_out")
    assert [a.status for a in lab.client.store.attempts(view.run_id)] == ["timed_out"]


def test_decision_deadline__a_late_answer_is_refused_and_the_default_applies(any_lab: Lab) -> None:
    lab = _lab_with_deadlines(any_lab)
    run_id = lab.start("hurried")
    worker = lab.worker("host-first")
    [opened] = wait_for(lambda: lab.client.decisions(run_id), what="the decision to open")
    # No worker sweeps expired decisions while the answer comes in.
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    assert lab.client.decisions(run_id)[0].outcome is None, "the worker stopped before the deadline"
    assert opened.deadline_at is not None
    wait_for(lambda: lab.client.store.now() > opened.deadline_at, what="the deadline to pass")

    before = lab.client.store.last_event_seq()
    late = lab.cli("answer", opened.decision_id, "approve")
    assert late.returncode == 5
    assert late.stdout == ""
    [line] = late.stderr.splitlines()
    assert line.startswith(f"tether: Decision {opened.decision_id} closed at ")
    assert line.endswith('its deadline passed; the default "reject" applies')
    assert lab.client.store.last_event_seq() == before
    assert lab.client.decisions(run_id)[0].outcome is None

    worker = lab.worker("host-second")
    result = lab.wait_finished(run_id)
    assert (result.status, result.output) == ("done", "dropped")
    [resolved] = lab.client.decisions(run_id, open_only=False)
    assert (resolved.provenance, resolved.response) == ("timeout_policy", "reject")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
