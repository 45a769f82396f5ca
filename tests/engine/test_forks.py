"""Forking a finished run at a node (``Tether.restart(run_id, from_node=...)``): the new run
reuses the outputs its parent recorded before the node and starts executing there."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from tests.store.conftest import snapshot
from tether.aio import AsyncTether
from tether.engine.graph import Workflow, compute, effect
from tether.errors import Conflict, InvalidInput, NotFound
from tether.store import Lineage
from tether.values import Json

from .conftest import Engine


def _four(calls: Counter[tuple[str, str]], *, third: str = "draft", fail_third: bool = False) -> Workflow:
    """fetch -> enrich -> <third> -> publish. fetch and enrich count their calls; the third node
    (``draft`` or its fixed version ``draft2``) reads both outputs from the context."""

    def fetch(ctx):  # type: ignore[no-untyped-def]
        calls[(ctx.run_id, "fetch")] += 1
        return {"doc": f"doc-{(ctx.input or {}).get('n', 0)}"}

    def enrich(ctx):  # type: ignore[no-untyped-def]
        calls[(ctx.run_id, "enrich")] += 1
        return {"words": 3}

    def draft(ctx):  # type: ignore[no-untyped-def]
        calls[(ctx.run_id, "draft")] += 1
        if fail_third:
            raise ValueError("the prompt is wrong")
        return {"v": 1, "seen": [ctx.outputs["fetch"], ctx.outputs["enrich"]], "input": ctx.input}

    def draft2(ctx):  # type: ignore[no-untyped-def]
        calls[(ctx.run_id, "draft2")] += 1
        return {"v": 2, "seen": [ctx.outputs["fetch"], ctx.outputs["enrich"]], "input": ctx.input}

    def publish(ctx):  # type: ignore[no-untyped-def]
        calls[(ctx.run_id, "publish")] += 1
        return {"published": ctx.outputs["write"]["v"]}

    return Workflow(
        "four",
        start="fetch",
        nodes=[
            compute("fetch", fetch),
            compute("enrich", enrich),
            compute("write", draft if third == "draft" else draft2),
            compute("publish", publish),
        ],
        edges={"fetch": "enrich", "enrich": "write", "write": "publish"},
    )


def _finished_parent(engine: Engine, calls: Counter[tuple[str, str]], **options: bool) -> str:
    engine.register(_four(calls, **options))  # type: ignore[arg-type]
    runner = engine.runner()
    parent = engine.client.start("four", {"n": 7}, run_id="run-parent").run_id
    engine.wait(parent)
    engine.stop(runner)
    return parent


def test_restart_from__reuses_the_outputs_before_the_node_and_runs_from_it(engine: Engine) -> None:
    calls: Counter[tuple[str, str]] = Counter()
    parent = _finished_parent(engine, calls)
    assert engine.wait(parent).status == "done"
    revision = engine.store.run_revision(parent)

    child = engine.client.restart(parent, from_node="write")
    assert (child.run_id, child.parent_run_id, child.lineage_kind) == ("run-parent-r1", parent, "restart")
    assert (child.restart_number, child.parent_run_revision, child.input) == (1, revision, {"n": 7})
    # The copies are there before any runner took the run: one transaction reserved it with them.
    copied = engine.attempts(child.run_id)
    assert [(a.node_id, a.status, a.attempt_number) for a in copied] == [
        ("fetch", "completed", 1),
        ("enrich", "completed", 1),
    ]
    assert [a.output for a in copied] == [{"doc": "doc-7"}, {"words": 3}]
    assert engine.event_types(child.run_id) == ["run.queued", "run.forked"]
    forked = engine.store.events_after(0, run_id=child.run_id, event_type="run.forked")[0].payload
    parent_attempts = {a.node_id: a.attempt_id for a in engine.attempts(parent)}
    assert forked == {
        "parentRunId": parent,
        "fromNode": "write",
        "copied": [
            {"nodeId": "fetch", "attemptId": parent_attempts["fetch"]},
            {"nodeId": "enrich", "attemptId": parent_attempts["enrich"]},
        ],
        "parentRevision": revision,
    }

    engine.runner()
    result = engine.wait(child.run_id)
    assert result.status == "done"
    assert result.outputs["write"] == {
        "v": 1,
        "seen": [{"doc": "doc-7"}, {"words": 3}],
        "input": {"n": 7},
    }
    assert result.output == {"published": 1}
    assert calls[(child.run_id, "fetch")] == calls[(child.run_id, "enrich")] == 0
    assert calls[(child.run_id, "draft")] == calls[(child.run_id, "publish")] == 1
    assert calls[(parent, "fetch")] == calls[(parent, "enrich")] == 1
    assert [a.node_id for a in engine.attempts(child.run_id)] == ["fetch", "enrich", "write", "publish"]

    # Visible both ways.
    down, up = engine.client.lineage(parent), engine.client.lineage(child.run_id)
    assert (down.parent_run_id, down.child_run_id, down.child_from_node) == (None, child.run_id, "write")
    assert (up.parent_run_id, up.from_node, up.copied) == (parent, "write", ("fetch", "enrich"))
    assert (up.child_run_id, up.child_from_node) == (None, None)


def test_restart_from__runs_the_fixed_code_of_the_failed_node(engine: Engine) -> None:
    calls: Counter[tuple[str, str]] = Counter()
    parent = _finished_parent(engine, calls, fail_third=True)
    assert engine.wait(parent).status == "failed"
    fixed = _four(calls, third="draft2")
    engine.register(fixed)  # the prompt is fixed: a new definition (its function changed)

    child = engine.client.restart(parent, from_node="write", input={"n": 8})
    assert child.definition_digest == fixed.digest
    assert child.input == {"n": 8}
    engine.runner()
    result = engine.wait(child.run_id)
    assert result.status == "done"
    # The reused outputs are the parent's (made from its input); the new input reaches write on.
    assert result.outputs["write"] == {"v": 2, "seen": [{"doc": "doc-7"}, {"words": 3}], "input": {"n": 8}}
    assert result.output == {"published": 2}
    assert calls[(child.run_id, "draft2")] == 1
    assert calls[(child.run_id, "draft")] == calls[(child.run_id, "fetch")] == 0


def test_restart_from__the_start_node_reuses_nothing(engine: Engine) -> None:
    calls: Counter[tuple[str, str]] = Counter()
    parent = _finished_parent(engine, calls)
    child = engine.client.restart(parent, from_node="fetch", new_run_id="run-again")
    assert engine.attempts(child.run_id) == []
    assert engine.client.lineage(child.run_id).copied == ()
    engine.runner()
    assert engine.wait(child.run_id).status == "done"
    assert calls[(child.run_id, "fetch")] == 1


def test_restart_from__effects_before_the_node_are_not_applied_again(engine: Engine) -> None:
    applied: list[str] = []

    def pay(ctx, key):  # type: ignore[no-untyped-def]
        applied.append(key)
        return {"paid": key}

    def after(ctx):  # type: ignore[no-untyped-def]
        return {"receipt": ctx.outputs["pay"]}

    engine.register(
        Workflow(
            "paying",
            start="pay",
            nodes=[effect("pay", pay), compute("after", after), effect("notify", pay)],
            edges={"pay": "after", "after": "notify"},
        )
    )
    engine.runner()
    parent = engine.client.start("paying", run_id="run-pay").run_id
    assert engine.wait(parent).status == "done"
    child = engine.client.restart(parent, from_node="after")
    result = engine.wait(child.run_id)
    assert result.status == "done"
    assert result.outputs["after"] == {"receipt": {"paid": "run-pay:pay:1"}}
    # The parent's payment is reused, not made again; the child's own effect has its own key.
    assert applied == ["run-pay:pay:1", "run-pay:notify:1", f"{child.run_id}:notify:1"]
    assert [e.idempotency_key for e in engine.store.effects(run_id=child.run_id)] == [
        f"{child.run_id}:notify:1"
    ]


def _refused(engine: Engine, run_id: str, error: type[Exception], match: str, **kwargs: Json) -> None:
    before = snapshot(engine.store)
    with pytest.raises(error, match=match):
        engine.client.restart(run_id, **kwargs)  # type: ignore[arg-type]
    assert snapshot(engine.store) == before


def test_restart_from__refusals_write_nothing(engine: Engine) -> None:
    calls: Counter[tuple[str, str]] = Counter()
    parent = _finished_parent(engine, calls, fail_third=True)  # failed at write: never reached publish
    _refused(
        engine, parent, InvalidInput, r"Workflow four has no node nope \(its nodes: fetch, ", from_node="nope"
    )
    _refused(
        engine, parent, Conflict, "Workflow run run-parent never reached node publish", from_node="publish"
    )
    _refused(engine, "run-missing", NotFound, "Workflow run not found: run-missing", from_node="write")

    live = engine.client.start("four", run_id="run-live").run_id
    _refused(
        engine, live, Conflict, "run-live is queued: only a finished run can be restarted", from_node="write"
    )

    # The definition changed under the reused nodes: enrich is gone.
    def step(ctx):  # type: ignore[no-untyped-def]
        return {}

    engine.register(
        Workflow(
            "four",
            start="fetch",
            nodes=[compute("fetch", step), compute("write", step), compute("publish", step)],
            edges={"fetch": "write", "write": "publish"},
        )
    )
    _refused(
        engine,
        parent,
        Conflict,
        "node enrich, whose output it would reuse, no longer exists",
        from_node="write",
    )
    # A node put before the fork's node: the current definition no longer takes the parent's path.
    engine.register(
        Workflow(
            "four",
            start="fetch",
            nodes=[compute(n, step) for n in ("fetch", "enrich", "check", "write", "publish")],
            edges={"fetch": "enrich", "enrich": "check", "check": "write", "write": "publish"},
        )
    )
    _refused(engine, parent, Conflict, "goes on to check where the run went on to write", from_node="write")

    engine.register(_four(calls))
    engine.client.restart(parent, from_node="write")
    _refused(engine, parent, Conflict, "run-parent was already restarted as run-parent-r1", from_node="write")


def test_restart_from__a_fork_of_a_fork_reuses_the_copies(engine: Engine) -> None:
    calls: Counter[tuple[str, str]] = Counter()
    parent = _finished_parent(engine, calls)
    engine.runner()
    child = engine.client.restart(parent, from_node="write").run_id
    assert engine.wait(child).status == "done"
    grandchild = engine.client.restart(child, from_node="publish").run_id
    assert engine.wait(grandchild).status == "done"
    assert [a.node_id for a in engine.attempts(grandchild)] == ["fetch", "enrich", "write", "publish"]
    assert calls[(grandchild, "draft")] == 0 and calls[(grandchild, "publish")] == 1
    middle = engine.client.lineage(child)
    assert (middle.parent_run_id, middle.from_node, middle.child_run_id, middle.child_from_node) == (
        parent,
        "write",
        grandchild,
        "publish",
    )


def test_run_fork__a_plan_the_parent_no_longer_matches_rolls_the_reservation_back(engine: Engine) -> None:
    calls: Counter[tuple[str, str]] = Counter()
    parent = _finished_parent(engine, calls)
    workflow = engine.client.registry.get("four")
    before = snapshot(engine.store)
    with pytest.raises(Conflict, match="changed while the fork was planned"):
        engine.store.run_fork(
            run_id="run-fork",
            parent_run_id=parent,
            parent_run_revision=engine.store.run_revision(parent),
            from_node="write",
            copy_nodes=["fetch"],  # the parent's path before write is fetch, enrich
            workflow_name="four",
            workflow_source_ref="workflow:four",
            workflow_source=engine.client.registry.source("four"),
            definition_digest=workflow.digest,
            definition_snapshot=workflow.snapshot(),
            origin_session_id=engine.store.run_origin(parent) or "",
            execution_mode="headless",
        )
    assert snapshot(engine.store) == before


def test_prune__keeps_a_fork_s_parent_until_the_fork_goes_too(engine: Engine) -> None:
    calls: Counter[tuple[str, str]] = Counter()
    parent = _finished_parent(engine, calls)
    child = engine.client.restart(parent, from_node="write").run_id
    later = datetime.now(UTC) + timedelta(days=1)
    kept = engine.store.prune(finished_before=later)
    assert (kept.runs, kept.kept) == (0, 1)
    assert [a.output for a in engine.attempts(child)] == [{"doc": "doc-7"}, {"words": 3}]
    engine.runner()
    assert engine.wait(child).status == "done"
    gone = engine.store.prune(finished_before=later)
    assert gone.runs == 2
    assert engine.store.get_run(parent) is None and engine.store.get_run(child) is None


def test_restart_from__two_forks_of_one_run_at_once_make_one(engine: Engine) -> None:
    calls: Counter[tuple[str, str]] = Counter()
    parent = _finished_parent(engine, calls)
    barrier = threading.Barrier(2, timeout=10)
    outcomes: dict[str, object] = {}

    def fork(new_run_id: str) -> None:
        barrier.wait()
        try:
            outcomes[new_run_id] = engine.client.restart(parent, from_node="write", new_run_id=new_run_id)
        except Conflict as error:
            outcomes[new_run_id] = error

    threads = [threading.Thread(target=fork, args=(name,)) for name in ("run-left", "run-right")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    won = [name for name, outcome in outcomes.items() if not isinstance(outcome, Conflict)]
    assert len(won) == 1 and len(outcomes) == 2
    lost = next(name for name in outcomes if name not in won)
    assert engine.store.get_run(lost) is None
    assert engine.client.lineage(parent).child_run_id == won[0]
    assert [a.node_id for a in engine.attempts(won[0])] == ["fetch", "enrich"]


def test_async_restart_from__forks_through_the_asyncio_client(engine: Engine) -> None:
    calls: Counter[tuple[str, str]] = Counter()
    parent = _finished_parent(engine, calls)

    async def main() -> tuple[str, Lineage]:
        async with AsyncTether(engine.client) as client:
            child = await client.restart(parent, from_node="publish", new_run_id="run-async")
            return child.run_id, await client.lineage(child.run_id)

    child, lineage = asyncio.run(main())
    assert (child, lineage.from_node, lineage.copied) == (
        "run-async",
        "publish",
        ("fetch", "enrich", "write"),
    )
