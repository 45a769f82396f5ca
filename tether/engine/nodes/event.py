"""``wait_for_event``: wait durably for an event sent into the run (``tether.store.run_events``).

On entry the node takes the oldest event of its name that waits in the run's inbox, if any, and
completes. Else the run parks waiting (its attempt ``waiting``, the wait recorded with its
deadline) and is put back in the queue when the event is sent, or by housekeeping once the
deadline passed: then the node takes the event, or leaves by its ``timeout`` exit.
"""

from __future__ import annotations

from datetime import timedelta

from tether.engine.context import Context
from tether.engine.graph import Node, Workflow
from tether.engine.nodes.base import StepHost
from tether.engine.worker.state import ActiveRun, Parked
from tether.store import Attempt, InboxEvent
from tether.values import Json


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
    name = str(node.spec["name"])
    timeout = node.spec.get("timeoutS")
    timeout_s = float(timeout) if isinstance(timeout, int | float) else None
    if waiting is None:
        with store.transaction():
            attempt = host.begin_node(active, ctx.node_id)
            event = store.event_take(
                run_id=run_id, claim_token=token, attempt_id=attempt.attempt_id, name=name
            )
            if event is not None:
                host.complete_node(active, attempt, _output(event))
                return
            deadline = None if timeout_s is None else store.now() + timedelta(seconds=timeout_s)
            store.event_wait_open(
                run_id=run_id,
                claim_token=token,
                attempt_id=attempt.attempt_id,
                name=name,
                deadline_at=deadline,
            )
            store.set_run_status(
                run_id=run_id, claim_token=token, status="waiting", detail=f"waiting for event {name}"
            )
            host.ensure(store.park(run_id=run_id, claim_token=token))
        raise Parked(f"waiting for event {name}")
    wait = store.event_wait(run_id)
    with store.transaction():
        event = store.event_take(run_id=run_id, claim_token=token, attempt_id=waiting.attempt_id, name=name)
        timed_out = (
            event is None
            and wait is not None
            and wait.deadline_at is not None
            and wait.deadline_at <= store.now()
        )
        if event is None and not timed_out:
            # Woken for nothing (a resume by hand): wait on.
            if store.run_status(run_id) != "waiting":
                store.set_run_status(
                    run_id=run_id, claim_token=token, status="waiting", detail=f"waiting for event {name}"
                )
            host.ensure(store.park(run_id=run_id, claim_token=token))
        else:
            store.event_wait_close(run_id=run_id, claim_token=token)
            host.resume_running(active)
            if event is not None:
                host.complete_node(active, waiting, _output(event))
            else:
                host.complete_node(active, waiting, {"name": name, "timedOut": True}, "timeout")
            return
    raise Parked(f"waiting for event {name}")


def _output(event: InboxEvent) -> Json:
    return {
        "name": event.name,
        "payload": event.payload,
        "sentAt": event.sent_at.isoformat(),
        "sentBy": event.sent_by,
    }
