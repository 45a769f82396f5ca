"""The client API: idempotent start, restart lineage, cancel, resume, wait, events and sessions."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from tether.client import Tether, WaitTimeout
from tether.engine.graph import Workflow, compute, input
from tether.errors import Conflict, InvalidInput, NotFound, SessionBusy

from .conftest import Engine, wait_until


def _simple(calls: Counter[str] | None = None, name: str = "simple") -> Workflow:
    def work(ctx):  # type: ignore[no-untyped-def]
        if calls is not None:
            calls[ctx.run_id] += 1
        return {"doubled": (ctx.input or {}).get("n", 0) * 2}

    return Workflow(name, start="work", nodes=[compute("work", work)])


# -- start -----------------------------------------------------------------------------------
def test_start__same_run_id_twice_adopts_the_same_run(engine: Engine) -> None:
    engine.register(_simple())
    first = engine.client.start("simple", {"n": 1}, run_id="run-fixed")
    again = engine.client.start("simple", {"n": 1}, run_id="run-fixed")
    assert again == first
    assert [r.run_id for r in engine.store.list_runs()] == ["run-fixed"]
    assert engine.event_types("run-fixed") == ["run.queued"]


def test_start__same_run_id_with_different_input_conflicts(engine: Engine) -> None:
    engine.register(_simple())
    engine.client.start("simple", {"n": 1}, run_id="run-fixed")
    with pytest.raises(Conflict, match="preparation conflicts: run-fixed"):
        engine.client.start("simple", {"n": 2}, run_id="run-fixed")
    with pytest.raises(Conflict, match="preparation conflicts"):
        engine.client.start("simple", {"n": 1}, run_id="run-fixed", session_id="session-x")
    assert engine.store.get_run("run-fixed").input == {"n": 1}  # type: ignore[union-attr]


def test_start__refuses_bad_run_ids_and_unknown_workflows(engine: Engine) -> None:
    engine.register(_simple())
    with pytest.raises(InvalidInput, match="Invalid workflow run id"):
        engine.client.start("simple", run_id="bad id")
    with pytest.raises(NotFound, match="Unknown workflow 'nope'"):
        engine.client.start("nope")


def test_start__with_a_workflow_object_registers_it(engine: Engine) -> None:
    wf = _simple(name="adhoc")
    run = engine.client.start(wf, {"n": 4})
    assert "adhoc" in engine.client.registry
    assert run.definition_digest == wf.digest
    assert run.execution_mode == "headless"
    assert run.origin_session_id is None
    engine.runner()
    assert engine.wait(run.run_id).output == {"doubled": 8}


def test_start__an_interactive_session_holds_one_active_run(engine: Engine) -> None:
    engine.register(_simple())
    session = engine.client.session("session-busy")
    run = session.start("simple")
    assert (run.execution_mode, run.origin_session_id) == ("interactive", "session-busy")
    with pytest.raises(SessionBusy):
        session.start("simple")


# -- restart ---------------------------------------------------------------------------------
def test_restart__links_a_new_run_to_the_terminal_parent_at_its_revision(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    engine.register(_simple(calls))
    engine.runner()
    parent = engine.client.start("simple", {"n": 3}, run_id="run-parent")
    assert engine.wait(parent.run_id).status == "done"
    revision = engine.store.run_revision(parent.run_id)

    child = engine.client.restart(parent.run_id)
    assert child.run_id == "run-parent-r1"
    assert child.parent_run_id == parent.run_id
    assert child.root_run_id == parent.run_id
    assert child.lineage_kind == "restart"
    assert child.restart_number == 1
    assert child.parent_run_revision == revision
    assert child.input == {"n": 3}
    assert engine.wait(child.run_id).output == {"doubled": 6}

    grandchild = engine.client.restart(child.run_id, input={"n": 10})
    assert grandchild.run_id == "run-parent-r2"
    assert (grandchild.parent_run_id, grandchild.root_run_id) == (child.run_id, parent.run_id)
    assert grandchild.restart_number == 2
    assert grandchild.parent_run_revision == engine.store.run_revision(child.run_id)
    assert engine.wait(grandchild.run_id).output == {"doubled": 20}
    assert calls == Counter({"run-parent": 1, "run-parent-r1": 1, "run-parent-r2": 1})


def test_restart__of_a_failed_interactive_run_keeps_its_session(engine: Engine) -> None:
    engine.register(Workflow("ask", start="ask", nodes=[input("ask", "Name?", timeout_s=0.2)]))
    engine.runner()
    session = engine.client.session("session-restart")
    parent = session.start("ask")
    assert engine.wait(parent.run_id).error_code == "inputExpired"
    child = engine.client.restart(parent.run_id, new_run_id="run-retry-ask")
    assert child.run_id == "run-retry-ask"
    assert (child.execution_mode, child.origin_session_id) == ("interactive", "session-restart")
    wait_until(session.pending_inputs, what="the restarted run to ask again")


def test_restart__of_a_non_terminal_run_is_refused(engine: Engine) -> None:
    engine.register(_simple())
    queued = engine.client.start("simple")
    with pytest.raises(Conflict, match="is queued: only a finished run can be restarted"):
        engine.client.restart(queued.run_id)
    with pytest.raises(NotFound):
        engine.client.restart("run-missing")
    assert len(engine.store.list_runs()) == 1


# -- control ---------------------------------------------------------------------------------
def test_cancel__an_unclaimed_run_is_cancelled_at_once(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    engine.register(_simple(calls))
    run = engine.client.start("simple")
    assert engine.client.cancel(run.run_id) == "cancelled"
    result = engine.client.result(run.run_id)
    assert (result.status, result.run_state_status, result.error_code) == (
        "cancelled",
        "cancelled",
        "cancelled",
    )
    engine.runner()
    with pytest.raises(Conflict, match="already cancelled"):
        engine.client.cancel(run.run_id)
    assert calls == Counter()


def test_cancel__a_running_compute_is_cancelled_by_its_runner(engine: Engine) -> None:
    latch = engine.latch()
    calls: Counter[str] = Counter()

    def held(ctx):  # type: ignore[no-untyped-def]
        latch.hold()
        return {"late": True}

    wf = Workflow(
        "held",
        start="held",
        nodes=[compute("held", held), compute("next", lambda ctx: calls.update(["next"]))],
        edges={"held": "next"},
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("held")
    assert latch.entered.wait(10)
    assert engine.client.cancel(run.run_id) == "requested"
    result = engine.wait(run.run_id)
    assert result.status == "cancelled"
    latch.release.set()
    wait_until(
        lambda: engine.attempts(run.run_id)[0].status == "cancelled", what="the attempt to be cancelled"
    )
    assert calls == Counter()
    assert "run.cancel_requested" in engine.event_types(run.run_id)


def test_resume__of_a_finished_run_is_refused(engine: Engine) -> None:
    engine.register(_simple())
    engine.runner()
    run = engine.client.start("simple")
    engine.wait(run.run_id)
    with pytest.raises(Conflict, match="cannot be resumed"):
        engine.client.resume(run.run_id)


def test_wait__times_out_for_a_run_nobody_executes(engine: Engine) -> None:
    engine.register(_simple())
    run = engine.client.start("simple")
    with pytest.raises(WaitTimeout, match="still queued"):
        engine.client.wait(run.run_id, timeout_s=0.1, poll_s=0.01)
    with pytest.raises(NotFound):
        engine.client.result("run-missing")


# -- reading ---------------------------------------------------------------------------------
def test_events__read_and_follow_a_run_journal(engine: Engine) -> None:
    engine.register(_simple())
    run = engine.client.start("simple")
    assert [e.type for e in engine.client.events(run_id=run.run_id)] == ["run.queued"]

    followed: list[str] = []

    def follow() -> None:
        for event in engine.client.events(run_id=run.run_id, follow=True, poll_s=0.02):
            followed.append(event.type)
            if event.type == "run.queue_done":
                return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    engine.runner()
    reader.join(10)
    assert not reader.is_alive()
    assert followed[0] == "run.queued"
    assert followed[-1] == "run.queue_done"
    assert followed.index("node.started") < followed.index("node.completed") < followed.index("run.completed")
    seqs = [e.seq for e in engine.client.events(run_id=run.run_id)]
    assert seqs == sorted(seqs)
    assert [e.type for e in engine.client.events(seqs[-2], run_id=run.run_id)] == [followed[-1]]


def test_client__opens_a_store_from_a_url(store_url: str) -> None:
    client = Tether(store_url, workflows=[_simple()])
    try:
        run = client.start("simple", {"n": 1})
        assert client.result(run.run_id).status == "queued"
    finally:
        client.store.close()


def test_cancel__requested_while_a_dead_runner_holds_the_run_is_honoured_by_the_next_runner(
    engine: Engine,
) -> None:
    calls: Counter[str] = Counter()
    engine.register(_simple(calls))
    run = engine.client.start("simple")
    token = "dead-token"
    assert engine.store.claim(run_id=run.run_id, runner_id="host-dead", claim_token=token, lease_ms=300)
    assert engine.client.cancel(run.run_id) == "requested"
    wait_until(
        lambda: not engine.store.verify_claim(run_id=run.run_id, claim_token=token),
        what="the lease to expire",
    )
    engine.runner()
    result = engine.wait(run.run_id)
    assert result.status == "cancelled"
    assert calls == Counter()


def test_cancel__requested_during_a_step_opens_no_decision_after_it(engine: Engine) -> None:
    from tether.engine.graph import decision

    latch = engine.latch()

    def held(ctx):  # type: ignore[no-untyped-def]
        latch.hold()
        return {"held": True}

    wf = Workflow(
        "held-then-ask",
        start="held",
        nodes=[compute("held", held), decision("ask", "Go?", options=["go"])],
        edges={"held": "ask"},
    )
    engine.register(wf)
    # A long renew interval: the runner hears of the cancel by change notice, not by renewal.
    engine.runner(lease_ms=6000, renew_ms=2000)
    run = engine.client.start("held-then-ask")
    assert latch.entered.wait(10)
    assert engine.client.cancel(run.run_id) == "requested"
    latch.release.set()
    result = engine.wait(run.run_id, timeout=5)
    assert result.status == "cancelled"
    assert engine.client.decisions(run.run_id, open_only=False) == [], "the decision never began"


def test_start__with_a_changed_workflow_object_is_refused_unless_replaced(engine: Engine) -> None:
    v1 = _simple(name="redefined")
    v2 = Workflow(
        "redefined",
        start="work",
        nodes=[compute("work", lambda ctx: {"v": 2}), compute("more", lambda ctx: {"v": 3})],
        edges={"work": "more"},
    )
    first = engine.client.start(v1)
    with pytest.raises(Conflict, match="A different definition of workflow redefined is already registered"):
        engine.client.start(v2, run_id="run-v2")
    assert engine.store.get_run("run-v2") is None, "a refused start writes nothing"
    assert engine.client.registry.get("redefined") is v1, "the in-process runner keeps its definition"
    engine.client.registry.add(v2, replace=True)
    second = engine.client.start(v2)
    assert first.definition_digest == v1.digest
    assert second.definition_digest == v2.digest
    assert engine.client.registry.get("redefined") is v2


# -- when runs come due ------------------------------------------------------------------------
def test_due_at__a_retry_in_backoff_is_due_when_its_backoff_ends(engine: Engine) -> None:
    def fails(ctx):  # type: ignore[no-untyped-def]
        raise ConnectionError("down")

    engine.register(
        Workflow("backing-off", start="call", nodes=[compute("call", fails, retries=2, backoff_s=600)]),
        _simple(),
    )
    engine.runner()
    finished = engine.client.start("simple").run_id
    engine.wait(finished)
    backing_off = engine.client.start("backing-off").run_id
    wait_until(
        lambda: (
            [a.status for a in engine.attempts(backing_off)] == ["failed"]
            and engine.client.view(backing_off).status == "parked"
        ),
        what="the first try failed and the run parked for its backoff",
    )
    failed_at = engine.attempts(backing_off)[0].finished_at
    assert failed_at is not None

    due = engine.client.due_at([backing_off, finished, "run-unknown"])

    assert list(due) == [backing_off]  # a finished run and an unknown one have no due time
    assert 599 <= (due[backing_off] - failed_at).total_seconds() <= 601
    assert engine.client.due_at([]) == {}
    with pytest.raises(InvalidInput):
        engine.client.due_at([""])
