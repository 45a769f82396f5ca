"""Cancel as a store operation, the cancellation signal steps see, and accepting a changed
definition for a run (on both backends)."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from typing import Any

import pytest

from tests.engine.conftest import Engine, wait_until
from tether.engine.graph import Workflow, compute, decision, effect, input, shell
from tether.engine.runner import Context
from tether.errors import CancelRequested, Conflict, NotFound


def _noop(ctx):  # type: ignore[no-untyped-def]
    return {"node": ctx.node_id}


def _flow(*node_ids: str, name: str = "flow") -> Workflow:
    return Workflow(
        name,
        start=node_ids[0],
        nodes=[compute(node_id, _noop) for node_id in node_ids],
        edges=dict(itertools.pairwise(node_ids)),
    )


# -- cancel ------------------------------------------------------------------------------------
def test_cancel__once_committed_no_node_and_no_effect_of_the_run_begins(engine: Engine) -> None:
    engine.register(_flow("a", "b"))
    store = engine.store
    run_id = engine.client.start("flow").run_id
    assert store.claim(run_id=run_id, runner_id="host-holder", claim_token="t-holder", lease_ms=60_000)
    first = store.attempt_start(run_id=run_id, claim_token="t-holder", node_id="a")
    pending = store.effect_enqueue(
        run_id=run_id, claim_token="t-holder", effect_type="pay", idempotency_key=f"{run_id}:pay"
    )

    assert engine.client.cancel(run_id) == "requested"
    assert store.cancel_requested(run_id)
    with pytest.raises(CancelRequested):
        store.effect_begin(run_id=run_id, claim_token="t-holder", effect_id=pending.effect_id)
    # What already ran may still be recorded; nothing more begins.
    store.attempt_finish(
        run_id=run_id, claim_token="t-holder", attempt_id=first.attempt_id, status="completed", output={}
    )
    with pytest.raises(CancelRequested):
        store.attempt_start(run_id=run_id, claim_token="t-holder", node_id="b")
    assert [e.status for e in store.effects(run_id=run_id)] == ["pending"]
    assert engine.event_types(run_id).count("run.cancel_requested") == 1
    assert engine.client.cancel(run_id) == "requested", "asking twice records one request"
    assert engine.event_types(run_id).count("run.cancel_requested") == 1

    assert store.cancel(run_id=run_id, claim_token="t-holder")
    assert engine.statuses(run_id) == ("cancelled", "cancelled")
    assert not store.cancel_requested(run_id), "a finished run has no request outstanding"
    with pytest.raises(Conflict, match="already cancelled"):
        engine.client.cancel(run_id)


def test_cancel__a_run_no_runner_holds_is_cancelled_at_once(engine: Engine) -> None:
    engine.register(_flow("a"))
    run_id = engine.client.start("flow").run_id
    assert engine.client.cancel(run_id) == "cancelled"
    assert engine.statuses(run_id) == ("cancelled", "cancelled")
    with pytest.raises(NotFound):
        engine.client.cancel("run-missing")


def test_cancel__compute_and_effect_steps_see_the_signal(engine: Engine) -> None:
    seen: dict[str, bool] = {}
    inside = threading.Event()

    def wait_for_cancel(ctx: Context) -> None:
        inside.set()
        wait_until(lambda: ctx.cancelled, what="the step to see the cancel")
        seen["cancelled"] = ctx.cancelled
        ctx.raise_if_cancelled()

    def pay(ctx: Context, key: str) -> dict[str, bool]:
        seen["paid"] = True
        return {"paid": True}

    wf = Workflow(
        "cooperating",
        start="wait",
        nodes=[compute("wait", wait_for_cancel), effect("pay", pay)],
        edges={"wait": "pay"},
    )
    engine.register(wf)
    engine.runner(lease_ms=30_000, renew_ms=10_000)
    run_id = engine.client.start("cooperating").run_id
    assert inside.wait(10)
    assert engine.client.cancel(run_id) == "requested"
    assert engine.wait(run_id).status == "cancelled"
    wait_until(lambda: "cancelled" in seen, what="the step to return")
    assert seen == {"cancelled": True}
    assert engine.store.effects(run_id=run_id) == []
    assert [(a.node_id, a.status) for a in engine.attempts(run_id)] == [("wait", "cancelled")]


def test_cancel__a_killed_command_is_not_read_as_its_own_failure(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel watcher kills the command, then commits the cancel. The store's cancel is held
    back here so the step thread always sees the command dead first: its exit status is the
    kill's, and the run must end cancelled, not failed."""
    started = engine.tmp_path / "started"
    script = "import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(60)"
    wf = Workflow(
        "killed",
        start="wait",
        nodes=[shell("wait", [sys.executable, "-c", script, str(started)]), compute("after", _noop)],
        edges={"wait": "after"},
    )
    engine.register(wf)
    store_cancel = engine.store.cancel

    def slow_cancel(**kwargs: Any) -> bool:
        if kwargs.get("claim_token") is not None:
            time.sleep(0.5)  # long past the step thread's next look at the command (20 ms)
        return store_cancel(**kwargs)

    monkeypatch.setattr(engine.store, "cancel", slow_cancel)
    engine.runner(lease_ms=30_000, renew_ms=10_000)
    run_id = engine.client.start("killed").run_id
    wait_until(started.exists, what="the command to start")
    assert engine.client.cancel(run_id) == "requested"
    result = engine.wait(run_id)
    assert result.status == "cancelled", result.error_message
    assert [(a.node_id, a.status) for a in engine.attempts(run_id)] == [("wait", "cancelled")]


# -- accepting a changed definition ---------------------------------------------------------------
def _completed_then_parked(engine: Engine, run_id: str, node_id: str) -> None:
    """What a runner leaves when it completes ``node_id`` and hands the run back."""
    store = engine.store
    assert store.claim(run_id=run_id, runner_id="host-gone", claim_token="t-gone", lease_ms=60_000)
    attempt = store.attempt_start(run_id=run_id, claim_token="t-gone", node_id=node_id)
    store.attempt_finish(
        run_id=run_id, claim_token="t-gone", attempt_id=attempt.attempt_id, status="completed", output={}
    )
    assert store.park(run_id=run_id, claim_token="t-gone")


def test_accept_changes__refused_unless_the_last_node_and_the_next_exist(engine: Engine) -> None:
    engine.register(_flow("a", "b"))
    run_id = engine.client.start("flow").run_id
    _completed_then_parked(engine, run_id, "a")
    before = engine.store.get_run(run_id)
    assert before is not None

    engine.register(_flow("x", "b"))
    with pytest.raises(Conflict, match="its last completed node a no longer exists"):
        engine.client.resume(run_id, accept_changes=True)
    engine.register(_flow("a"))
    with pytest.raises(Conflict, match="no node follows its last completed node a"):
        engine.client.resume(run_id, accept_changes=True)
    assert engine.store.get_run(run_id) == before, "a refused move writes nothing"
    assert "run.definition_accepted" not in engine.event_types(run_id)

    changed = _flow("a", "c", "d")
    engine.register(changed)
    engine.client.resume(run_id, accept_changes=True)
    moved = engine.store.get_run(run_id)
    assert moved is not None and moved.definition_digest == changed.digest
    with pytest.raises(Conflict, match="nothing to accept"):
        engine.client.resume(run_id, accept_changes=True)
    engine.runner()
    assert engine.wait(run_id).status == "done"
    assert [a.node_id for a in engine.attempts(run_id)] == ["a", "c", "d"]
    [accepted] = [
        e
        for e in engine.store.events_after(0, run_id=run_id, limit=1000)
        if e.type == "run.definition_accepted"
    ]
    assert accepted.payload == {"from": before.definition_digest, "to": changed.digest, "continueAfter": "a"}


def test_accept_changes__refused_for_a_run_a_runner_holds(engine: Engine) -> None:
    engine.register(_flow("a", "b"))
    run_id = engine.client.start("flow").run_id
    assert engine.store.claim(run_id=run_id, runner_id="host-live", claim_token="t-live", lease_ms=60_000)
    engine.register(_flow("a", "c"))
    with pytest.raises(Conflict, match="held by a runner"):
        engine.client.resume(run_id, accept_changes=True)
    assert engine.store.get_run(run_id).definition_digest == _flow("a", "b").digest  # type: ignore[union-attr]


def _gated(then: str = "b", first_then: str = "ask") -> Workflow:
    """``a``, a decision ``ask`` (yes/no), and ``then`` after its yes; with ``first_then``, a
    node between ``a`` and ``ask``."""
    nodes = [compute("a", _noop), decision("ask", "Go?", options=["yes", "no"]), compute(then, _noop)]
    if first_then != "ask":
        nodes.append(compute(first_then, _noop))
    edges = {"a": first_then, "ask.yes": then}
    if first_then != "ask":
        edges[first_then] = "ask"
    return Workflow("gated", start="a", nodes=nodes, edges=edges)


def _waiting_at_ask(engine: Engine, run_id: str) -> str:
    """What a runner leaves when it completes ``a`` and opens the decision at ``ask``: the
    waiting attempt's id."""
    store = engine.store
    assert store.claim(run_id=run_id, runner_id="host-gone", claim_token="t-gone", lease_ms=60_000)
    store.set_run_status(run_id=run_id, claim_token="t-gone", status="running")
    done = store.attempt_start(run_id=run_id, claim_token="t-gone", node_id="a")
    store.attempt_finish(run_id=run_id, claim_token="t-gone", attempt_id=done.attempt_id, status="completed")
    asking = store.attempt_start(run_id=run_id, claim_token="t-gone", node_id="ask")
    request = {"question": "Go?", "options": ["yes", "no"], "schema": None, "default": None, "nodeId": "ask"}
    store.decision_open(run_id=run_id, claim_token="t-gone", node_id="ask", request=request, deadline_at=None)
    store.set_run_status(run_id=run_id, claim_token="t-gone", status="waiting", detail="waiting for decision")
    assert store.park(run_id=run_id, claim_token="t-gone")
    return asking.attempt_id


def test_accept_changes__an_answered_decision_continues_on_the_new_definition(engine: Engine) -> None:
    engine.register(_gated())
    run_id = engine.client.start("gated").run_id
    asking = _waiting_at_ask(engine, run_id)
    changed = _gated("c")
    engine.register(changed)
    with pytest.raises(Conflict, match="node ask is waiting and not answered yet"):
        engine.client.resume(run_id, accept_changes=True)
    # The store checks the answer itself, whatever its caller says.
    with pytest.raises(Conflict, match="only a run waiting for a worker can move"):
        engine.store.accept_definition(
            run_id=run_id,
            definition_digest=changed.digest,
            definition_snapshot=changed.snapshot(),
            workflow_source=engine.client.registry.source("gated"),
            continue_after="ask",
            answered_attempt_id=asking,
        )
    [open_decision] = engine.client.decisions(run_id)
    engine.client.answer(open_decision.decision_id, "yes")
    before = engine.store.get_run(run_id)

    engine.register(_gated("c", first_then="elsewhere"))
    with pytest.raises(Conflict, match="it does not lead after a to ask, where the run waited"):
        engine.client.resume(run_id, accept_changes=True)
    engine.register(
        Workflow("gated", start="a", nodes=[compute("a", _noop), compute("ask", _noop)], edges={"a": "ask"})
    )
    with pytest.raises(Conflict, match="its answered decision ask is no decision node there"):
        engine.client.resume(run_id, accept_changes=True)
    assert engine.store.get_run(run_id) == before, "a refused move writes nothing"

    engine.register(changed)
    engine.client.resume(run_id, accept_changes=True)
    engine.runner()
    result = engine.wait(run_id)
    assert result.status == "done", result.error_message
    assert [(a.node_id, a.status) for a in engine.attempts(run_id)] == [
        ("a", "completed"),
        ("ask", "completed"),
        ("c", "completed"),
    ]


# -- failures keep their story -------------------------------------------------------------------
def _parse(text: str) -> int:
    raise ValueError(f"not a number: {text}")


def test_failure__an_attempt_keeps_its_exception_message_and_traceback(engine: Engine) -> None:
    def convert(ctx: Context) -> int:
        return _parse("first line\nsecond line")

    engine.register(Workflow("converting", start="convert", nodes=[compute("convert", convert)]))
    engine.runner()
    run_id = engine.client.start("converting").run_id
    result = engine.wait(run_id)
    assert result.status == "failed"
    assert result.error_message == (
        "Node convert failed after 1 attempt(s): ValueError: not a number: first line"
    )
    [attempt] = engine.attempts(run_id)
    story = attempt.error_message or ""
    assert story.startswith("ValueError: not a number: first line\nTraceback (most recent call last):")
    assert story.rstrip().endswith("ValueError: not a number: first line\nsecond line")
    assert "in convert" in story and "in _parse" in story


# -- work waits for a worker that can do it ------------------------------------------------------
def test_a_session_answer_waits_for_a_runner_with_the_runs_definition(engine: Engine) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    asking = Workflow(
        "asking",
        start="ask",
        nodes=[input("ask", "Why?", schema=schema), compute("use", _noop)],
        edges={"ask": "use"},
    )
    engine.register(asking)
    first = engine.runner()
    session = engine.client.session("session-asking")
    run_id = session.start("asking").run_id
    (request,) = wait_until(session.pending_inputs, what="a pending input request")
    engine.stop(first)
    claims = engine.event_types(run_id).count("lease.claimed")

    other = engine.runner(workflows=[_flow("a", name="other")])
    session.submit(request.request_id, {"answer": "because"})
    time.sleep(0.3)  # several claim rounds of the runner without the workflow
    assert engine.event_types(run_id).count("lease.claimed") == claims, "it never claimed the run"
    assert [s.outcome for s in engine.store.submissions(request.request_id)] == ["validating"]

    engine.stop(other)
    engine.runner(workflows=[asking])
    assert engine.wait(run_id).status == "done"
