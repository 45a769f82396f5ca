"""Forks: a restart that reuses its parent's recorded outputs up to a node.

A fork is a restart (``lineage_kind = 'restart'``, one per parent, in the parent's restart
family) whose journal begins with the parent's completed node attempts from before the parent
first entered the fork's node: ``run_fork`` reserves the new run, copies those attempts into it
(their output blobs are shared, not copied) and journals ``run.forked`` naming the parent, the
node and the copied attempts, all in one transaction. A runner then continues the fork where a
run with those completed attempts continues: at the fork's node, so the copied nodes are never
executed again (nor their effects applied again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tether.errors import CommitUnknown, Conflict, InvalidInput, SessionBusy
from tether.store.control import ControlOps
from tether.store.limits import RunLimit
from tether.store.records import Attempt, RunRecord
from tether.store.runs import Now
from tether.values import Json, ordered_uuid, require_text

#: The journal entry that opens a fork's own entries (after ``run.queued``).
FORKED_EVENT = "run.forked"


@dataclass(frozen=True)
class Lineage:
    """How a run is linked to the runs before and after it in its restart family.

    ``parent_run_id``: the run this one restarts (None for a root run); ``from_node``: for a fork,
    the node it started at, and ``copied`` the nodes whose recorded outputs it took from its
    parent, in path order (empty for a plain restart). ``child_run_id``: the run that restarts this
    one, if any; ``child_from_node``: the node that child was forked at (None for a plain
    restart)."""

    run_id: str
    parent_run_id: str | None
    from_node: str | None
    copied: tuple[str, ...]
    child_run_id: str | None
    child_from_node: str | None


def path_before(attempts: Sequence[Attempt], node_id: str) -> list[Attempt] | None:
    """The completed attempts a run recorded before it first entered ``node_id`` (first try of
    it, whatever that try's outcome), in the order they ran; None when the run never entered it."""
    for index, attempt in enumerate(attempts):
        if attempt.node_id == node_id:
            return [a for a in attempts[:index] if a.status == "completed"]
    return None


class ForkOps(ControlOps):
    """Forking a finished run at a node."""

    def run_fork(
        self,
        *,
        run_id: str,
        parent_run_id: str,
        parent_run_revision: int | None,
        from_node: str,
        copy_nodes: Sequence[str],
        workflow_name: str,
        workflow_source_ref: str,
        workflow_source: Json,
        definition_digest: str,
        definition_snapshot: Json,
        input: Json = None,
        launch_options: Json = None,
        origin_session_id: str,
        execution_mode: str = "interactive",
        actor_id: str = "operator",
        limit: RunLimit | None = None,
        now: Now = None,
    ) -> RunRecord:
        """Reserve ``run_id`` as the restart of ``parent_run_id`` (finished, still at
        ``parent_run_revision``) with the parent's completed attempts from before it first
        entered ``from_node`` copied in, and journal ``run.forked``; one transaction, nothing
        written on any refusal.

        ``copy_nodes``: the node ids of those attempts as the caller planned them (checked against
        the definition the fork runs on); read again here under the parent's lock, a different
        list is refused (``Conflict``). ``NotFound`` for a missing parent, ``Conflict`` when the
        parent is not finished, changed, was restarted already, or never entered ``from_node``."""
        require_text("from_node", from_node)
        require_text("actor_id", actor_id)
        if isinstance(copy_nodes, str) or not all(isinstance(n, str) and n for n in copy_nodes):
            raise InvalidInput("copy_nodes must be a list of node ids")
        args = self._reservation_args(
            {
                "run_id": run_id,
                "workflow_name": workflow_name,
                "workflow_source_ref": workflow_source_ref,
                "workflow_source": workflow_source,
                "definition_digest": definition_digest,
                "definition_snapshot": definition_snapshot,
                "input": input,
                "launch_options": launch_options,
                "origin_session_id": origin_session_id,
                "execution_mode": execution_mode,
                "parent_run_id": parent_run_id,
                "lineage_kind": "restart",
                "restart_number": None,
                "parent_run_revision": parent_run_revision,
                "limit": limit,
                "now": now,
            }
        )
        plan = (from_node, list(copy_nodes), actor_id)
        try:
            with self.db.transaction():
                return self._fork(args, *plan)
        except (Conflict, SessionBusy):
            if self._row(args["run_id"]) is not None:
                raise Conflict(f"Workflow run already reserved: {args['run_id']}") from None
            raise
        except CommitUnknown:
            # Read the fork back: there, it landed whole (one transaction); absent, nothing was
            # written and the fork is made now.
            with self.db.transaction():
                existing = self._row(args["run_id"])
                if existing is None:
                    return self._fork(args, *plan)
                if existing["parent_run_id"] != parent_run_id:
                    raise Conflict(f"Workflow run already reserved: {args['run_id']}") from None
                return self._record(existing)

    def _fork(self, a: dict[str, Any], from_node: str, copy_nodes: list[str], actor_id: str) -> RunRecord:
        parent_id, now = a["parent_run_id"], a["now"]
        # Reserving reads (on PostgreSQL: locks) the parent first and checks it: finished, at the
        # planned revision, not restarted yet. A refusal below rolls the reservation back.
        record = self._reserve(a)
        parent = self._require_row(parent_id)
        taken = path_before(self.attempts(parent_id), from_node)
        if taken is None:
            raise Conflict(f"Workflow run {parent_id} never reached node {from_node}")
        if [t.node_id for t in taken] != copy_nodes:
            raise Conflict(
                f"Workflow run {parent_id} changed while the fork was planned "
                f"(its path before {from_node} is now {', '.join(t.node_id for t in taken) or 'empty'})"
            )
        for attempt in taken:
            copied = self.db.run(
                "attempt_copy",
                attempt_id=f"attempt-{ordered_uuid(now)}",
                run_id=a["run_id"],
                parent_run_id=parent_id,
                source_attempt_id=attempt.attempt_id,
                now=now,
            )
            if copied != 1:
                raise Conflict(f"Node attempt {attempt.attempt_id} of {parent_id} is no longer completed")
        child = self._require_row(a["run_id"])
        payload: Json = {
            "parentRunId": parent_id,
            "fromNode": from_node,
            "copied": [{"nodeId": t.node_id, "attemptId": t.attempt_id} for t in taken],
            "parentRevision": parent["revision"],
        }
        self._bump_emit(child, FORKED_EVENT, payload, now, actor=("human", actor_id), generation=0)
        return record

    def lineage(self, run_id: str) -> Lineage:
        """The run's parent and child in its restart family, and for forks where they started
        (``NotFound`` for an unknown run)."""
        require_text("run_id", run_id, limit=1000)
        with self.db.transaction(write=False):
            row = self._require_row(run_id)
            child = self.db.one("run_restart_child", run_id=run_id)
        child_id = None if child is None else str(child["run_id"])
        own = self._fork_entry(run_id) if row["parent_run_id"] is not None else None
        later = self._fork_entry(child_id) if child_id is not None else None
        copied = own.get("copied") if own is not None else None
        return Lineage(
            run_id=run_id,
            parent_run_id=row["parent_run_id"],
            from_node=None if own is None else str(own.get("fromNode")),
            copied=tuple(str(c["nodeId"]) for c in copied) if isinstance(copied, list) else (),
            child_run_id=child_id,
            child_from_node=None if later is None else str(later.get("fromNode")),
        )

    def _fork_entry(self, run_id: str) -> dict[str, Any] | None:
        """The payload of the run's ``run.forked`` entry (None: not a fork)."""
        found = self.events_after(0, run_id=run_id, event_type=FORKED_EVENT, limit=1)
        if not found or not isinstance(found[0].payload, dict):
            return None
        return found[0].payload
