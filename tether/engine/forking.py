"""Planning a fork: which of a finished run's recorded outputs a new run can reuse.

A fork of run P at node N runs on the workflow's current definition. It takes over the nodes P
completed on its path before it first entered N (``tether.store.path_before``) and starts at N.
The plan is refused (``InvalidInput`` or ``Conflict``, naming the node) unless the current
definition has N, P entered N, every reused node still exists, and the current definition leads
along P's path through the reused nodes (by their recorded exits) to N: a runner continues a run
from the route out of its last completed node, so this is what makes the fork start at N.
"""

from __future__ import annotations

from collections.abc import Sequence

from tether.engine.graph import Workflow, is_item
from tether.errors import Conflict, InvalidInput
from tether.store import Attempt, path_before


def plan_fork(workflow: Workflow, attempts: Sequence[Attempt], run_id: str, node_id: str) -> list[Attempt]:
    """The attempts of run ``run_id`` (its ``attempts``, in order) a fork at ``node_id`` reuses,
    checked against ``workflow`` as loaded now. An include node is forked at its entry node."""
    if not isinstance(node_id, str) or not node_id:
        raise InvalidInput("from_node must be a node id of the workflow")
    if node_id not in workflow.nodes:
        raise InvalidInput(
            f"Workflow {workflow.name} has no node {node_id} (its nodes: {', '.join(workflow.nodes)})"
        )
    start = workflow.entry(node_id)
    taken = path_before(attempts, start)
    if taken is None:
        raise Conflict(f"Workflow run {run_id} never reached node {node_id}: nothing to fork from there")
    current = workflow.entry(workflow.start)
    for attempt in taken:
        if is_item(attempt.node_id):
            continue  # an item of a fan-out node on the path: reused with its node
        if attempt.node_id not in workflow.nodes:
            raise Conflict(
                f"Workflow run {run_id} cannot be forked at {node_id}: node {attempt.node_id}, whose "
                f"output it would reuse, no longer exists in workflow {workflow.name}"
            )
        if attempt.node_id != current:
            raise Conflict(
                f"Workflow run {run_id} cannot be forked at {node_id}: it ran {attempt.node_id} where "
                f"the current definition of {workflow.name} runs {current}"
            )
        exit_name = attempt.exit_name or "ok"
        target = workflow.route(attempt.node_id, exit_name)
        if target is None:
            raise Conflict(
                f"Workflow run {run_id} cannot be forked at {node_id}: the current definition of "
                f"{workflow.name} ends after {attempt.node_id} (exit {exit_name})"
            )
        current = workflow.entry(target)
    if current != start:
        raise Conflict(
            f"Workflow run {run_id} cannot be forked at {node_id}: the current definition of "
            f"{workflow.name} goes on to {current} where the run went on to {start}"
        )
    return taken
