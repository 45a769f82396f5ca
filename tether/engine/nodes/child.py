"""``child``: start another workflow as a run of its own, linked to this run, and (with ``wait``)
park until it finishes.

The child's run id is derived from the parent's run id, the node, the node's visit (how many
times the run completed it before) and the node's key, so a retried step or a runner that died
after the start commits adopts the child it started (``Store.child_start``) instead of starting
a second one. The start, the link and the parent's park are one transaction; the move that
finishes the child requeues the parent, whose node then reads the child's outcome.
"""

from __future__ import annotations

from tether.engine.context import Context
from tether.engine.failures import summary
from tether.engine.graph import CHILD_KEY, Node, Workflow
from tether.engine.nodes.base import StepHost, computed
from tether.engine.worker.state import ActiveRun, Parked
from tether.errors import InvalidInput
from tether.store import Attempt, RunRecord
from tether.store.states import QUEUE_TERMINAL
from tether.values import Json, require_json, sha256

#: Longest run id (``tether.values.RUN_ID_PATTERN``); a longer derived id is replaced by a digest.
RUN_ID_LIMIT = 200


def run(
    host: StepHost,
    active: ActiveRun,
    wf: Workflow,
    node: Node,
    ctx: Context,
    failures: int,
    waiting: Attempt | None,
) -> None:
    store, run_id, token = host.store, active.run_id, active.token
    workflow = node.workflow
    assert workflow is not None  # the builder requires one
    wait = bool(node.spec["wait"])
    visit = sum(1 for a in store.attempts(run_id) if a.node_id == ctx.node_id and a.status == "completed")
    if waiting is not None:
        child_id = child_run_id(run_id, ctx.node_id, visit, _key(node, ctx))
        if store.child_wait(parent_run_id=run_id, claim_token=token, child_run_id=child_id):
            raise Parked(f"waiting for child run {child_id}")
        _finish(host, active, wf, node, ctx, failures, waiting, child_id)
        return
    try:
        child_id = child_run_id(run_id, ctx.node_id, visit, _key(node, ctx))
        given = computed(node, "input", ctx)
        require_json("input", given)
        child_input = workflow.check_input(given)
        # The child counts against its workflow's concurrency limit like any run of it.
        limit = (
            None
            if workflow.concurrency is None
            else workflow.concurrency.run_limit(workflow.name, child_input)
        )
        origin, mode = _binding(host, active, workflow, wait)
    except BaseException as error:  # a function of the node or the child's input failed: the step's
        attempt = host.begin_node(active, ctx.node_id)
        host.fail_node(active, node, attempt, summary(error), failures, 0, 1.0, raised=error)
        return
    registry = host.registry
    source = (
        registry.source(workflow.name)
        if workflow.name in registry and registry.get(workflow.name).digest == workflow.digest
        else {"root": {"kind": "builtin", "id": workflow.name, "revision": workflow.revision}, "mounted": []}
    )
    with store.transaction():
        attempt = host.begin_node(active, ctx.node_id)
        started = store.child_start(
            parent_run_id=run_id,
            claim_token=token,
            node_id=ctx.node_id,
            child_run_id=child_id,
            waits=wait,
            workflow_name=workflow.name,
            workflow_source_ref=f"workflow:{workflow.name}",
            workflow_source=source,
            definition_digest=workflow.digest,
            definition_snapshot=workflow.snapshot(),
            input=child_input,
            origin_session_id=origin,
            execution_mode=mode,
            limit=limit,
        )
        if not wait:
            host.complete_node(active, attempt, {"child_run_id": child_id})
            return
    if started.run.status not in QUEUE_TERMINAL:
        raise Parked(f"waiting for child run {child_id}")
    # Adopted a child that finished already (its parent's runner died before it went on).
    _finish(host, active, wf, node, ctx, failures, attempt, child_id)


def child_run_id(parent_run_id: str, node_id: str, visit: int, key: str | None) -> str:
    """The id of the child run a node of ``parent_run_id`` starts: the parent's id, the node's id
    (a ``/`` of an included node's path as ``.``), the visit when the run completed the node
    before (``.2`` on the second), and the key. One longer than a run id may be is a digest."""
    parts = [
        parent_run_id,
        node_id.replace("/", "."),
        *([str(visit + 1)] if visit else []),
        *([key] if key else []),
    ]
    derived = ".".join(parts)
    if len(derived) <= RUN_ID_LIMIT:
        return derived
    return f"child-{sha256(derived.encode('utf-8')).hex()[:40]}"


def _key(node: Node, ctx: Context) -> str | None:
    hook = node.hooks.get("key")
    if hook is None:
        key = node.spec.get("key")
        return None if key is None else str(key)
    value = hook(ctx)
    if not isinstance(value, str) or CHILD_KEY.fullmatch(value) is None:
        raise InvalidInput(
            f"the key function of node {node.id} returned {value!r}: a key is a letter or digit, then "
            "letters, digits, _ or - (64 at most)"
        )
    return value


def _binding(host: StepHost, active: ActiveRun, workflow: Workflow, wait: bool) -> tuple[str, str]:
    """The child's origin session and execution mode: the parent's session. An interactive
    parent that waits hands its session to the child; one that goes on holds it, so a detached
    child runs headless (and may not talk to the session)."""
    origin = active.run.origin_session_id or host.store.run_origin(active.run_id) or f"client-{active.run_id}"
    interactive = active.run.execution_mode == "interactive" and wait
    if not interactive and workflow.needs_session:
        why = "its parent run is headless" if active.run.execution_mode != "interactive" else "it is detached"
        raise InvalidInput(
            f"child workflow {workflow.name} talks to its run's session (nodes "
            f"{', '.join(workflow.needs_session)}) but {why}: start it with wait=True from an "
            "interactive run"
        )
    return origin, "interactive" if interactive else "headless"


def _finish(
    host: StepHost,
    active: ActiveRun,
    wf: Workflow,
    node: Node,
    ctx: Context,
    failures: int,
    attempt: Attempt,
    child_id: str,
) -> None:
    """Complete the node with the finished child's result, or leave by ``error`` / fail it."""
    store = host.store
    child = store.get_run(child_id)
    if child is None:  # deleted meanwhile (tether prune, tether delete)
        host.fail_node(active, node, attempt, f"child run {child_id} no longer exists", failures, 0, 1.0)
        return
    if child.status == "done":
        output = _result(host, node, child)
        with store.transaction():
            host.resume_running(active)
            host.complete_node(active, attempt, output)
        return
    failure: dict[str, Json] = {
        "child_run_id": child_id,
        "status": child.status,
        "error_code": child.error_code,
        "error": child.error_message,
    }
    if f"{ctx.node_id}.error" in wf.edges:
        with store.transaction():
            host.resume_running(active)
            host.complete_node(active, attempt, failure, "error")
        return
    message = f"child run {child_id} {child.status}" + (
        f": {child.error_message}" if child.error_message else ""
    )
    # Not inside a transaction of this step's: failing the node raises ``Parked`` after its commit.
    host.fail_node(active, node, attempt, message, failures, 0, 1.0)


def _result(host: StepHost, node: Node, child: RunRecord) -> Json:
    """The child's result: its workflow's declared result (``Workflow(output=...)``), else the
    output of the node that ran last."""
    completed = [a for a in host.store.attempts(child.run_id) if a.status == "completed"]
    last = completed[-1].output if completed else None
    workflow = node.workflow
    if workflow is None or workflow.digest != child.definition_digest:
        return last
    return workflow.result_of({a.node_id: a.output for a in completed}, last)
