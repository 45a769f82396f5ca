"""``compute``: call the node's function; its value (or ``Exit``) is the output."""

from __future__ import annotations

from tether.engine.context import Context
from tether.engine.graph import Exit, Node, Workflow
from tether.engine.nodes.base import StepHost, fail_step
from tether.engine.worker.deadlines import RunTimedOut, StepTimedOut
from tether.engine.worker.state import ActiveRun
from tether.errors import ClaimLost
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
    assert fn is not None
    retries, backoff = int(node.spec["retries"]), float(node.spec["backoffS"])
    try:
        value = host.call_with_deadline(active, node, ctx, lambda: host.call_step(active, fn, ctx))
        exit_name, output = (value.name, value.output) if isinstance(value, Exit) else ("ok", value)
        canonical_json(output)
    except ClaimLost:
        raise
    except StepTimedOut as late:
        host.time_out_node(active, node, attempt, str(late), failures, retries, backoff)
        return
    except RunTimedOut:
        host.time_out_run(active)
        return
    # BaseException too: a step's sys.exit(), KeyboardInterrupt or GeneratorExit is that step's
    # failure, never the end of the runner's thread (run threads get no signals: these come
    # from the step's own code).
    except BaseException as error:
        fail_step(host, active, node, attempt, error, failures, retries, backoff)
        return
    host.complete_node(active, attempt, output, exit_name)
