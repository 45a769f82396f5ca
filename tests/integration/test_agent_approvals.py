"""Tool calls that need a person's approval, in real worker processes: the call waits as a
decision, answered through ``tether answer``; a worker stopped or killed meanwhile hands the run
over without the model being asked again or the tool running twice."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from tests.integration.support import Lab, wait_for

FLOW = '''
"""An agent that pays a bill with a tool a person approves; every model turn and every payment
is written to a log, so the test sees what each process did."""

import json
import os
import time
from pathlib import Path

from tether.engine.graph import Workflow, agent
from tether.engine.providers import ToolCall, Turn
from tether.engine.tools import tool

LOG = Path(__LOG__)
# While this file exists, the model's turn after a tool result waits (the worker is killed then).
HOLD = LOG.with_suffix(".hold")


def note(kind, **fields):
    with open(LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps({"kind": kind, "pid": os.getpid(), **fields}) + "\\n")


@tool(needs_approval=True, effect=True)
def pay(account: str, amount: int) -> dict:
    """Pay an amount to an account."""
    note("pay", account=account, amount=amount)
    return {"paid": amount, "account": account}


class Model:
    """Calls ``pay`` first; answers with what the tool returned once it has a result."""

    def complete(self, prompt, schema):
        raise NotImplementedError

    def turn(self, messages, tools, schema):
        note("turn", messages=len(messages))
        results = [m for m in messages if m["role"] == "tool"]
        if not results:
            return Turn(calls=[ToolCall("pay", {"account": "acme", "amount": 40}, "call-1")])
        while HOLD.exists():
            time.sleep(0.02)
        return Turn(answer={"outcome": json.dumps(results[-1]["content"], sort_keys=True)})


billing = Workflow(
    "billing",
    start="settle",
    nodes=[
        agent(
            "settle",
            Model(),
            "Settle the acme invoice",
            schema={"type": "object", "properties": {"outcome": {"type": "string"}}, "required": ["outcome"]},
            tools=[pay],
        )
    ],
)
'''


def _install(lab: Lab) -> Path:
    log = lab.base / "billing.jsonl"
    (lab.folder / "billing.py").write_text(FLOW.replace("__LOG__", repr(str(log))))
    return log


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _decision(lab: Lab, run_id: str) -> str:
    found = wait_for(lambda: lab.client.decisions(run_id), what="the approval decision")
    assert isinstance(found, list)
    return str(found[0].decision_id)


def test_approval__answered_through_the_cli_with_a_real_worker(any_lab: Lab) -> None:
    lab = any_lab
    log = _install(lab)
    run_id = lab.start("billing")
    worker = lab.worker("approval-one")
    decision_id = _decision(lab, run_id)

    shown = lab.cli("inbox")
    assert shown.returncode == 0, shown.stderr
    assert "Approve the call of tool pay" in shown.stdout and '"account":"acme"' in shown.stdout
    assert f"tether answer {decision_id} approve|reject" in shown.stdout
    wait_for(lambda: lab.view(run_id).status == "parked", what="the run to park")
    assert [e["kind"] for e in _log(log)] == ["turn"], "nothing is paid before the answer"

    refused = lab.cli("answer", decision_id, "maybe")
    assert refused.returncode != 0 and "approve, reject" in refused.stderr
    assert "Traceback" not in refused.stderr
    answered = lab.cli("answer", decision_id, "approve", "--actor", "maria")
    assert answered.returncode == 0, answered.stderr
    result = lab.wait_finished(run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"outcome": '{"account": "acme", "paid": 40}'}
    events = _log(log)
    assert [e["kind"] for e in events] == ["turn", "pay", "turn"]
    assert {e["pid"] for e in events} == {worker.pid}
    (effect,) = lab.client.store.effects(run_id=run_id)
    assert effect.status == "applied" and effect.effect_type == "tool.pay"


def test_approval__a_worker_killed_while_the_approval_is_open_hands_over(any_lab: Lab) -> None:
    lab = any_lab
    log = _install(lab)
    run_id = lab.start("billing")
    first = lab.worker("approval-first")
    decision_id = _decision(lab, run_id)
    wait_for(lambda: lab.view(run_id).status == "parked", what="the run to park")
    os.kill(first.pid, signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL

    answered = lab.cli("answer", decision_id, "reject", "--actor", "maria")
    assert answered.returncode == 0, answered.stderr
    second = lab.worker("approval-second")
    result = lab.wait_finished(run_id)
    assert result.status == "done", result.error_message
    assert result.output == {
        "outcome": json.dumps({"error": "the call was rejected by maria: no reason given"})
    }
    # The first turn was asked once (by the killed worker); the new worker asked only the next.
    events = _log(log)
    assert [(e["kind"], e["pid"]) for e in events] == [("turn", first.pid), ("turn", second.pid)]
    assert lab.client.store.effects(run_id=run_id) == []
    roles = [m.role for m in lab.client.conversation(run_id)]
    assert roles == ["user", "assistant", "tool", "assistant"]


def test_approval__a_worker_killed_after_the_answer_neither_asks_nor_pays_again(any_lab: Lab) -> None:
    lab = any_lab
    log = _install(lab)
    hold = log.with_suffix(".hold")
    hold.touch()
    run_id = lab.start("billing")
    first = lab.worker("approval-first")
    decision_id = _decision(lab, run_id)
    answered = lab.cli("answer", decision_id, "approve")
    assert answered.returncode == 0, answered.stderr
    # The first worker takes the step up, pays, records the result, and asks the model again:
    # it dies while that turn is under way.
    wait_for(lambda: len(_log(log)) == 3, what="the turn after the payment to begin")
    os.kill(first.pid, signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    hold.unlink()
    second = lab.worker("approval-second")
    result = lab.wait_finished(run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"outcome": '{"account": "acme", "paid": 40}'}
    events = [(e["kind"], e["pid"], e.get("messages")) for e in _log(log)]
    # The recorded first turn and the payment are not done again; only the unrecorded turn is.
    assert events == [
        ("turn", first.pid, 1),
        ("pay", first.pid, None),
        ("turn", first.pid, 3),
        ("turn", second.pid, 3),
    ]
    (effect,) = lab.client.store.effects(run_id=run_id)
    assert effect.status == "applied"
    (decision,) = lab.client.store.decisions(run_id=run_id)
    assert decision.response == "approve"
    assert [a.status for a in lab.client.store.attempts(run_id)] == ["interrupted", "completed"]
