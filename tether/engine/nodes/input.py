"""``input``: ask the run's origin session for a value, validated against a schema."""

from __future__ import annotations

from tether.engine.context import Context
from tether.engine.failures import summary
from tether.engine.graph import Node, Workflow
from tether.engine.nodes.base import StepHost, computed_text
from tether.engine.schema import errors as schema_errors
from tether.engine.worker.state import ActiveRun, Parked
from tether.errors import TetherError
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
    if active.run.execution_mode != "interactive":
        attempt = host.begin_node(active, ctx.node_id)
        host.fail_node(
            active,
            node,
            attempt,
            "input nodes need an interactive run with an origin session",
            failures,
            0,
            1.0,
        )
        return
    if waiting is None:
        try:
            prompt = computed_text(node, "prompt", ctx)
        except BaseException as error:  # the workflow's prompt function failed: the step's failure
            attempt = host.begin_node(active, ctx.node_id)
            host.fail_node(active, node, attempt, summary(error), failures, 0, 1.0, raised=error)
            return
        timeout = None if spec["timeoutS"] is None else int(float(spec["timeoutS"]) * 1000)
        with store.transaction():
            attempt = host.begin_node(active, ctx.node_id, timeout)
            request = store.request_open(
                run_id=run_id,
                claim_token=token,
                attempt_id=attempt.attempt_id,
                kind="input",
                payload={
                    "prompt": prompt,
                    "schema": spec["schema"],
                    # The store names it when it refuses an answer past the deadline.
                    **({"default": spec["default"]} if spec["default"] is not None else {}),
                },
            )
            store.interval_open(run_id=run_id, claim_token=token, attempt_id=attempt.attempt_id)
            store.message_send(
                run_id=run_id,
                claim_token=token,
                kind="step",
                payload={"prompt": prompt, "requestId": request.request_id},
            )
            host.ensure(store.park(run_id=run_id, claim_token=token))
        raise Parked("waiting for input")
    requests = [r for r in store.requests(run_id=run_id) if r.attempt_id == waiting.attempt_id]
    if not requests:
        raise TetherError(f"input attempt {waiting.attempt_id} has no request")
    request = requests[-1]
    submissions = store.submissions(request.request_id)
    if request.status == "cancelled":
        if spec["default"] is not None:
            with store.transaction():
                host.resume_running(active)
                host.complete_node(
                    active, waiting, {"value": spec["default"], "provenance": "timeout_policy"}
                )
            return
        with store.transaction():
            store.attempt_finish(
                run_id=run_id,
                claim_token=token,
                attempt_id=waiting.attempt_id,
                status="timed_out",
                error_message="input deadline expired",
            )
            host.ensure(
                store.fail(
                    run_id=run_id,
                    claim_token=token,
                    error_code="inputExpired",
                    error_message=f"Node {ctx.node_id}: the input deadline expired without an answer",
                )
            )
        raise Parked("input expired")
    if request.status == "settled":
        accepted = [s for s in submissions if s.outcome == "accepted"]
        with store.transaction():
            host.resume_running(active)
            host.complete_node(
                active,
                waiting,
                {"value": accepted[-1].payload if accepted else None, "provenance": "human"},
            )
        return
    for submission in submissions:
        if submission.outcome != "validating":
            continue
        problems = [] if spec["schema"] is None else schema_errors(submission.payload, spec["schema"])
        with store.transaction():
            if problems:
                store.submission_resolve(
                    run_id=run_id,
                    claim_token=token,
                    submission_id=submission.submission_id,
                    accepted=False,
                    receipt={"status": "rejected", "errors": problems},
                )
                store.message_send(
                    run_id=run_id,
                    claim_token=token,
                    kind="step",
                    payload={
                        "prompt": request.payload.get("prompt")
                        if isinstance(request.payload, dict)
                        else None,
                        "requestId": request.request_id,
                        "rejected": problems,
                    },
                )
                continue
            store.submission_resolve(
                run_id=run_id, claim_token=token, submission_id=submission.submission_id, accepted=True
            )
            host.complete_node(active, waiting, {"value": submission.payload, "provenance": "human"})
        return
    with store.transaction():
        store.set_run_status(
            run_id=run_id, claim_token=token, status="waiting", detail="waiting for origin-session input"
        )
        host.ensure(store.park(run_id=run_id, claim_token=token))
    raise Parked("still waiting for input")
