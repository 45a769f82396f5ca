"""``sleep``: park the run durably until a moment on the store's clock."""

from __future__ import annotations

from datetime import timedelta

from tether.engine.context import Context
from tether.engine.graph import Node, Workflow
from tether.engine.nodes.base import StepHost
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
    with host.store.transaction():
        attempt = host.begin_node(active, ctx.node_id)
        # The store's clock, as the attempt's finish is stamped: the sleep counts from there.
        wake = host.store.now() + timedelta(seconds=float(node.spec["seconds"]))
        host.complete_node(active, attempt, {"wakeAt": wake.isoformat()})
        host.ensure(host.store.park_until(run_id=active.run_id, claim_token=active.token, available_at=wake))
    raise Parked("sleeping")
