"""``notify``: send a notification to the run's origin session."""

from __future__ import annotations

from typing import Any

from tether.engine.context import Context
from tether.engine.failures import summary
from tether.engine.graph import Node, Workflow
from tether.engine.nodes.base import StepHost
from tether.engine.worker.deadlines import RunTimedOut, StepTimedOut
from tether.engine.worker.state import ActiveRun
from tether.store import Attempt
from tether.values import canonical_json


def run(
    host: StepHost,
    active: ActiveRun,
    wf: Workflow,
    node: Node,
    ctx: Context,
    failures: int,
    waiting: Attempt | None,
) -> None:
    attempt = host.begin_node(active, ctx.node_id)
    fn = node.fn
    try:
        payload: Any = (
            host.call_with_deadline(active, node, ctx, lambda: host.call_step(active, fn, ctx))
            if fn is not None
            else {"text": node.spec["text"]}
        )
        canonical_json(payload)
    except StepTimedOut as late:
        host.time_out_node(active, node, attempt, str(late), failures, 0, 1.0)
        return
    except RunTimedOut:
        host.time_out_run(active)
        return
    # BaseException too: a step's sys.exit(), KeyboardInterrupt or GeneratorExit is that step's
    # failure, never the end of the runner's thread (run threads get no signals: these come
    # from the step's own code).
    except BaseException as error:
        # A broken message function fails the node (like compute), not the runner.
        host.fail_node(active, node, attempt, summary(error), failures, 0, 1.0, raised=error)
        return
    with host.store.transaction():
        message = host.store.message_send(
            run_id=active.run_id, claim_token=active.token, kind="notification", payload=payload
        )
        host.complete_node(active, attempt, {"delivered": message is not None})
