"""Child runs: a node starts another workflow as a run of its own, linked to its parent; the parent
waits for it (parked, released by the child's finishing move) or goes on at once."""

from __future__ import annotations

from typing import Any

import pytest

from tether.engine.graph import Workflow, child, compute, decision, notify
from tether.engine.nodes.child import child_run_id
from tether.errors import InvalidInput

from .conftest import Engine, wait_until


def double(ctx: Any) -> dict[str, int]:
    return {"doubled": ctx.input["n"] * 2}


def explode(ctx: Any) -> None:
    raise ValueError("the child broke")


def after(ctx: Any) -> dict[str, Any]:
    return {"parent saw": ctx.outputs["spawn"]}


DOUBLER = Workflow("doubler", start="double", nodes=[compute("double", double)])
BROKEN = Workflow("broken", start="explode", nodes=[compute("explode", explode)])
ASKER = Workflow("asker", start="ask", nodes=[decision("ask", "Go on?", options=["yes", "no"])])


def exists(engine: Engine, run_id: str) -> str:
    """Wait until the run is reserved (a parent's runner starts its child meanwhile)."""
    wait_until(lambda: engine.store.get_run_view(run_id) is not None, what=f"run {run_id}")
    return run_id


def parent(name: str, workflow: Workflow, **options: Any) -> Workflow:
    return Workflow(
        name,
        start="spawn",
        nodes=[child("spawn", workflow, **options), compute("after", after)],
        edges={"spawn": "after"},
    )


def test_child__the_parent_continues_with_the_childs_result(engine: Engine) -> None:
    wf = parent("doubling", DOUBLER, input=lambda ctx: {"n": ctx.input["n"]})
    engine.register(wf)
    engine.runner()
    run = engine.client.start("doubling", {"n": 21})
    result = engine.wait(run.run_id)
    assert result.status == "done", result
    assert result.output == {"parent saw": {"doubled": 42}}
    kid = f"{run.run_id}.spawn"
    assert [(c.run_id, c.node_id, c.waits, c.status) for c in engine.client.children(run.run_id)] == [
        (kid, "spawn", True, "done")
    ]
    link = engine.client.parent(kid)
    assert link is not None and (link.parent_run_id, link.node_id) == (run.run_id, "spawn")
    assert engine.client.parent(run.run_id) is None
    record, view = engine.store.get_run(kid), engine.client.view(kid)
    assert record is not None and (record.child_of, record.child_of_node) == (run.run_id, "spawn")
    assert (view.child_of, view.child_of_node) == (run.run_id, "spawn")
    assert engine.client.view(run.run_id).child_of is None
    assert engine.client.result(kid).output == {"doubled": 42}
    events = engine.event_types(run.run_id)
    assert "run.child_started" in events and "run.child_finished" in events


def test_child__a_failed_child_leaves_by_error_when_routed(engine: Engine) -> None:
    wf = Workflow(
        "routes-failure",
        start="spawn",
        nodes=[child("spawn", BROKEN), compute("after", after), compute("fallback", after)],
        edges={"spawn.ok": "after", "spawn.error": "fallback"},
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("routes-failure")
    result = engine.wait(run.run_id)
    assert result.status == "done", result
    seen = result.output["parent saw"]
    assert seen["child_run_id"] == f"{run.run_id}.spawn"
    assert seen["status"] == "failed" and seen["error_code"] == "nodeFailed"
    assert "the child broke" in seen["error"]
    assert [a.exit_name for a in engine.attempts(run.run_id, "spawn")] == ["error"]


def test_child__a_failed_child_fails_the_node_when_error_is_not_routed(engine: Engine) -> None:
    engine.register(parent("unrouted", BROKEN))
    engine.runner()
    run = engine.client.start("unrouted")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert f"child run {run.run_id}.spawn failed" in (result.error_message or "")
    assert "the child broke" in (result.error_message or "")


def test_child__a_detached_child_completes_the_node_at_once(engine: Engine) -> None:
    engine.register(parent("detaching", ASKER, wait=False))
    engine.runner()
    run = engine.client.start("detaching")
    result = engine.wait(run.run_id)
    kid = exists(engine, f"{run.run_id}.spawn")
    assert result.output == {"parent saw": {"child_run_id": kid}}
    # The child still waits for its person; the parent did not.
    engine.wait_status(kid, "parked", "waiting")
    assert [(c.run_id, c.waits) for c in engine.client.children(run.run_id)] == [(kid, False)]


def test_child__the_parent_waits_parked_without_a_claim_until_the_child_ends(engine: Engine) -> None:
    engine.register(parent("waits-for-person", ASKER))
    engine.runner()
    run = engine.client.start("waits-for-person")
    kid = exists(engine, f"{run.run_id}.spawn")
    engine.wait_status(kid, "parked", "waiting")
    engine.wait_status(run.run_id, "parked", "waiting")
    assert engine.store.get_run(run.run_id).runner_id is None  # type: ignore[union-attr]
    (question,) = engine.client.decisions(kid)
    engine.client.answer(question.decision_id, "yes")
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert result.output == {"parent saw": {"response": "yes", "provenance": "human"}}


def test_child__cancelling_the_parent_cancels_the_child_it_waits_for(engine: Engine) -> None:
    engine.register(parent("cancelled-parent", ASKER))
    engine.runner()
    run = engine.client.start("cancelled-parent")
    kid = exists(engine, f"{run.run_id}.spawn")
    engine.wait_status(kid, "parked", "waiting")
    engine.wait_status(run.run_id, "parked", "waiting")
    assert engine.client.cancel(run.run_id) == "cancelled"
    assert engine.statuses(run.run_id) == ("cancelled", "cancelled")
    assert engine.statuses(kid) == ("cancelled", "cancelled")


def test_child__cancelling_a_finished_parent_is_refused_and_writes_nothing(engine: Engine) -> None:
    engine.register(parent("finished-parent", DOUBLER, input={"n": 1}))
    engine.runner()
    run = engine.client.start("finished-parent")
    engine.wait(run.run_id)
    before = engine.store.last_event_seq()
    with pytest.raises(Exception, match="already done"):
        engine.client.cancel(run.run_id)
    assert engine.store.last_event_seq() == before


def test_child__a_second_start_of_the_node_adopts_the_child(engine: Engine) -> None:
    """The start is idempotent: the node begun again under a new claim (a runner that died after
    the start committed) finds its child and starts no second one."""
    engine.register(parent("adopting", DOUBLER, input={"n": 2}))
    run = engine.client.start("adopting")
    claim = engine.store.claim(run_id=run.run_id, runner_id="r1", claim_token="t1", lease_ms=60_000)
    assert claim is not None
    engine.store.set_run_status(run_id=run.run_id, claim_token="t1", status="running")
    kid = child_run_id(run.run_id, "spawn", 0, None)
    common: dict[str, Any] = dict(
        parent_run_id=run.run_id,
        claim_token="t1",
        node_id="spawn",
        child_run_id=kid,
        waits=False,
        workflow_name="doubler",
        workflow_source_ref="workflow:doubler",
        workflow_source={"root": {"kind": "builtin", "id": "doubler", "revision": "1"}, "mounted": []},
        definition_digest=DOUBLER.digest,
        definition_snapshot=DOUBLER.snapshot(),
        input={"n": 2},
        origin_session_id=f"client-{run.run_id}",
    )
    assert engine.store.child_start(**common).state == "reserved"
    assert engine.store.child_start(**common).state == "adopted"
    assert [c.run_id for c in engine.client.children(run.run_id)] == [kid]


def test_child_run_id__derived_from_parent_node_visit_and_key() -> None:
    assert child_run_id("run-1", "spawn", 0, None) == "run-1.spawn"
    assert child_run_id("run-1", "mount/spawn", 1, "item-3") == "run-1.mount.spawn.2.item-3"
    long = child_run_id("r" * 195, "spawn", 0, "key")
    assert long.startswith("child-") and len(long) <= 200


def test_child__builder_checks_its_arguments() -> None:
    with pytest.raises(InvalidInput, match="workflow must be a Workflow"):
        child("spawn", "doubler")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="key must be"):
        child("spawn", DOUBLER, key="no spaces")
    with pytest.raises(InvalidInput, match="wait must be"):
        child("spawn", DOUBLER, wait="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="an exit node spawn cannot produce: 'error'"):
        Workflow(
            "detached-error",
            start="spawn",
            nodes=[child("spawn", DOUBLER, wait=False), compute("after", after)],
            edges={"spawn.error": "after"},
        )
    shown = parent("shown", DOUBLER).text()
    assert "spawn [child doubler]: * -> after" in shown


def test_child__a_key_function_starts_one_child_per_key(engine: Engine) -> None:
    wf = Workflow(
        "keyed",
        start="spawn",
        nodes=[child("spawn", DOUBLER, input=lambda ctx: {"n": 5}, key=lambda ctx: f"item-{ctx.input['i']}")],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("keyed", {"i": 7})
    assert engine.wait(run.run_id).output == {"doubled": 10}
    wait_until(lambda: engine.client.children(run.run_id), what="the child")
    assert [c.run_id for c in engine.client.children(run.run_id)] == [f"{run.run_id}.spawn.item-7"]


def greet(ctx: Any) -> dict[str, str]:
    return {"text": f"hello {ctx.input['name']}"}


GREETER = Workflow("greeter", start="hello", nodes=[notify("hello", greet)])


def test_child__an_interactive_parent_hands_its_session_to_the_child_it_waits_for(engine: Engine) -> None:
    engine.register(parent("greeting", GREETER, input=lambda ctx: {"name": ctx.input["name"]}))
    engine.runner()
    run = engine.client.start("greeting", {"name": "Ada"}, session_id="desk")
    result = engine.wait(run.run_id)
    assert result.status == "done", result
    kid = engine.store.get_run(f"{run.run_id}.spawn")
    assert kid is not None and (kid.execution_mode, kid.origin_session_id) == ("interactive", "desk")
    assert {"text": "hello Ada"} in [m.payload for m in engine.client.session("desk").messages()]


def test_child__a_detached_child_may_not_talk_to_the_session(engine: Engine) -> None:
    engine.register(parent("detached-greeting", GREETER, input={"name": "Ada"}, wait=False))
    engine.runner()
    run = engine.client.start("detached-greeting", session_id="desk")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert "child workflow greeter talks to its run's session" in (result.error_message or "")
    assert "it is detached" in (result.error_message or "")
    assert engine.client.children(run.run_id) == []


def test_child__a_parent_whose_session_was_taken_meanwhile_is_resumed_by_hand(engine: Engine) -> None:
    """The child waits for a person (its session is free meanwhile), the session starts another
    run, and the child is cancelled: the parent cannot take the session back, says so, and goes
    on (failing: its child was cancelled) once resumed with the session free."""
    from tether.cli import statuses

    family = parent("session-taken", ASKER)
    holder = Workflow("holder", start="hold", nodes=[compute("hold", after)])
    engine.register(family, holder)
    engine.runner(workflows=[family])  # never takes the holder: it keeps the session's slot
    run = engine.client.start("session-taken", session_id="desk")
    kid = exists(engine, f"{run.run_id}.spawn")
    engine.wait_status(kid, "parked", "waiting")
    held = engine.client.start("holder", session_id="desk")
    assert engine.client.cancel(kid) == "cancelled"
    assert engine.statuses(run.run_id) == ("parked", "waiting")
    shown = statuses(engine.client, [engine.client.view(run.run_id)])[run.run_id]
    assert (shown.text, shown.action) == (f"child run {kid} finished", f"tether resume {run.run_id}")
    engine.client.cancel(held.run_id)
    engine.client.resume(run.run_id)
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert f"child run {kid} cancelled" in (result.error_message or "")


def test_child__cancelling_the_parent_stops_a_child_a_worker_is_running(engine: Engine) -> None:
    latch = engine.latch()

    def linger(ctx: Any) -> None:
        latch.entered.set()
        while not ctx.cancelled:
            latch.release.wait(0.01)
        ctx.raise_if_cancelled()

    lingering = Workflow("lingering", start="linger", nodes=[compute("linger", linger)])
    engine.register(parent("lingering-parent", lingering))
    engine.runner()
    run = engine.client.start("lingering-parent")
    assert latch.entered.wait(15)
    kid = f"{run.run_id}.spawn"
    assert engine.client.cancel(run.run_id) == "cancelled"
    engine.wait(kid)
    assert engine.statuses(kid) == ("cancelled", "cancelled")
    assert engine.statuses(run.run_id) == ("cancelled", "cancelled")
    assert "run.child_finished" not in engine.event_types(run.run_id)


def test_child__the_async_client_reads_the_links(engine: Engine) -> None:
    import asyncio

    from tether.aio import AsyncTether

    engine.register(parent("async-family", DOUBLER, input={"n": 3}))
    engine.runner()
    run = engine.client.start("async-family")
    engine.wait(run.run_id)

    async def main() -> tuple[list[str], str | None]:
        async with AsyncTether(engine.client) as client:
            kids = await client.children(run.run_id)
            link = await client.parent(kids[0].run_id)
            return [k.run_id for k in kids], None if link is None else link.parent_run_id

    assert asyncio.run(main()) == ([f"{run.run_id}.spawn"], run.run_id)


def test_child__a_child_deleted_before_its_parent_read_it_fails_the_node(engine: Engine) -> None:
    from datetime import timedelta

    engine.register(parent("pruned-child", ASKER))
    first = engine.runner()
    run = engine.client.start("pruned-child")
    kid = exists(engine, f"{run.run_id}.spawn")
    engine.wait_status(kid, "parked", "waiting")
    engine.wait_status(run.run_id, "parked", "waiting")
    engine.stop(first)
    assert engine.client.cancel(kid) == "cancelled"
    assert engine.statuses(run.run_id) == ("queued", "waiting")
    report = engine.store.prune(finished_before=engine.store.now() + timedelta(seconds=1))
    assert report.run_ids == [kid]
    assert engine.client.children(run.run_id) == []
    engine.runner()
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert f"child run {kid} no longer exists" in (result.error_message or "")
