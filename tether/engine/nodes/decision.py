"""``decision``: ask a person (or their default after a deadline) to choose."""

from __future__ import annotations

from datetime import timedelta

from tether.engine.context import Context
from tether.engine.failures import summary
from tether.engine.graph import Node, Workflow
from tether.engine.nodes.base import StepHost, computed_text
from tether.engine.worker.state import ActiveRun, Parked
from tether.store import Attempt


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
    spec = node.spec
    if waiting is None:
        try:
            question = computed_text(node, "question", ctx)
        except BaseException as error:  # the workflow's question function failed: the step's failure
            attempt = host.begin_node(active, ctx.node_id)
            host.fail_node(active, node, attempt, summary(error), failures, 0, 1.0, raised=error)
            return
        deadline = (
            None
            if spec["deadlineS"] is None
            else host.store.now() + timedelta(seconds=float(spec["deadlineS"]))
        )
        request = {
            "question": question,
            "options": spec["options"],
            "schema": spec["schema"],
            "default": spec["default"],
            "nodeId": ctx.node_id,
        }
        with store.transaction():
            attempt = host.begin_node(active, ctx.node_id)
            decision = store.decision_open(
                run_id=run_id,
                claim_token=token,
                node_id=ctx.node_id,
                request=request,
                deadline_at=deadline,
            )
            store.set_run_status(
                run_id=run_id,
                claim_token=token,
                status="waiting",
                detail=f"waiting for decision {decision.decision_id}",
            )
            store.message_send(
                run_id=run_id,
                claim_token=token,
                kind="decision",
                payload={**request, "decisionId": decision.decision_id, "attemptId": attempt.attempt_id},
            )
            host.ensure(store.park(run_id=run_id, claim_token=token))
        raise Parked("waiting for a decision")
    decisions = [
        d
        for d in store.decisions(run_id=run_id)
        if d.node_id == ctx.node_id and d.created_at >= waiting.started_at
    ]
    answered = decisions[-1] if decisions else None
    if answered is None or answered.outcome is None:
        host.ensure(store.park(run_id=run_id, claim_token=token))
        raise Parked("decision still open")
    if answered.outcome == "accepted":
        exit_name = str(answered.response) if spec["options"] else "ok"
        with store.transaction():
            store.set_run_status(run_id=run_id, claim_token=token, status="running")
            host.complete_node(
                active,
                waiting,
                {"response": answered.response, "provenance": answered.provenance},
                exit_name,
            )
        return
    with store.transaction():
        store.attempt_finish(
            run_id=run_id,
            claim_token=token,
            attempt_id=waiting.attempt_id,
            status="timed_out",
            error_message=answered.reason,
        )
        host.ensure(
            store.fail(
                run_id=run_id,
                claim_token=token,
                error_code="decisionExpired",
                error_message=(f"Decision {answered.decision_id} ended without an answer: {answered.reason}"),
            )
        )
    raise Parked("decision expired")
