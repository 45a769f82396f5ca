"""Moving a run onto a new definition of its workflow (``tether resume RUN --accept-changes``).

A run is executed only on the definition it was reserved with (see ``Workflow.digest``). When an
operator accepts a changed definition for a run that no runner holds, the run's definition and
source are replaced in one transaction, the change is journaled (``run.definition_accepted``,
with both digests and the node the run continues after), and a run parked for the change is put
back in the queue. Whether the new graph can continue the run is the client's check: it knows
the graph (``Tether.resume(accept_changes=True)``).

A run whose decision was answered (or whose awaited event came, or whose event wait timed out)
while it was reserved on a definition no worker has any more is movable too: its waiting attempt
stays as it is, and a worker with the new definition settles it with the answer and continues
after it. The store checks, in the moving transaction, that the attempt still waits and that what
it waits for is in.
"""

from __future__ import annotations

from typing import Any

from tether.errors import Conflict, InvalidInput, NotFound
from tether.store.db import Row
from tether.store.journal import STATUS_TARGETS
from tether.store.records import RunRecord
from tether.store.runs import Now, _is_live, _source_parts, _sources, normalize_source
from tether.store.states import QUEUE_TERMINAL, RUN_TERMINAL, QueueStatus, queue_sources
from tether.store.work import WorkOps
from tether.values import Json, canonical_json, digest_bytes, require_text

DEFINITION_ACCEPTED_EVENT = "run.definition_accepted"
#: Queue error codes a run may carry and still be moved: none, or parked for the change itself.
MOVABLE_ERRORS = (None, "workflowSourceChanged")


class VersionOps(WorkOps):
    """Accepting a changed definition for a run."""

    def accept_definition(
        self,
        *,
        run_id: str,
        definition_digest: str,
        definition_snapshot: Json,
        workflow_source: Any,
        continue_after: str | None,
        answered_attempt_id: str | None = None,
        actor_id: str = "operator",
        now: Now = None,
    ) -> RunRecord:
        """Move a run that no live claim holds (queued, or parked not waiting on a person) onto
        ``definition_digest`` of the same workflow; ``continue_after`` (the last completed node,
        or None) is journaled. ``answered_attempt_id``: the run's waiting attempt whose decision
        was answered or whose event came (or timed out): the run may then be waiting, and it is
        put back in the queue. ``Conflict`` when the run cannot be moved (nothing is written)."""
        require_text("run_id", run_id, limit=1000)
        require_text("actor_id", actor_id)
        digest = digest_bytes(definition_digest)
        if not isinstance(definition_snapshot, dict) or definition_snapshot.get("name") is None:
            raise InvalidInput("definition_snapshot must be a workflow definition snapshot")
        canonical_json(definition_snapshot)
        source = normalize_source(workflow_source)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if row is None:
                raise NotFound(f"Workflow run not found: {run_id}")
            if row["status"] in QUEUE_TERMINAL or row["run_status"] in RUN_TERMINAL:
                raise Conflict(f"Workflow run {run_id} is already {row['status']}")
            if _is_live(row, at):
                raise Conflict(f"Workflow run {run_id} is held by a runner; wait until it lets go")
            answered = answered_attempt_id is not None and self._answered(row, answered_attempt_id, at)
            if (row["run_status"] == "waiting" and not answered) or row["error_code"] not in MOVABLE_ERRORS:
                raise Conflict(
                    f"Workflow run {run_id} is {row['status']}/{row['run_status']}"
                    f"{' (' + row['error_code'] + ')' if row['error_code'] else ''}: only a run waiting "
                    "for a worker can move to a new definition"
                )
            if definition_snapshot["name"] != row["workflow_name"]:
                raise InvalidInput(
                    f"The new definition is of workflow {definition_snapshot['name']}, "
                    f"not {row['workflow_name']}"
                )
            before = "sha256:" + bytes(row["definition_digest"]).hex()
            if bytes(row["definition_digest"]) == digest:
                raise Conflict(f"Workflow run {run_id} is already on definition {before}")
            self.db.run(
                "definition_insert",
                digest=digest,
                name=row["workflow_name"],
                definition_hash=self._put_json(definition_snapshot, at),
                now=at,
            )
            self.db.run("run_definition_set", run_id=run_id, digest=digest, now=at)
            self.db.run("run_sources_delete", run_id=run_id)
            placed = [("", source["root"])] + [
                ("/".join(m["mountPath"]), m["source"]) for m in source["mounted"]
            ]
            for mount_path, identity in placed:
                source_type, ref, revision = _source_parts(identity) or ("", "", "")
                self.db.run(
                    "run_source_insert",
                    run_id=run_id,
                    mount_path=mount_path,
                    source_type=source_type,
                    source_ref=ref,
                    source_revision=revision,
                )
            if row["status"] == "parked":
                self.db.run(
                    "queue_requeue",
                    run_id=run_id,
                    now=at,
                    sources=_sources(queue_sources(QueueStatus.QUEUED)),
                )
            self.db.notify("runs")
            self._bump_emit(
                row,
                DEFINITION_ACCEPTED_EVENT,
                {"from": before, "to": "sha256:" + digest.hex(), "continueAfter": continue_after},
                at,
                actor=("human", actor_id),
                generation=0,
            )
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return self._record_of(run_id)

    def _answered(self, row: Row, attempt_id: str, at: int) -> bool:
        """Whether the run's attempt ``attempt_id`` still waits and what it waits for is in: its
        decision answered (accepted), or its awaited event sent and not taken, or that event's
        deadline passed. Called in the moving transaction."""
        run_id = row["run_id"]
        waiting = [a for a in self.attempts(run_id) if a.attempt_id == attempt_id and a.status == "waiting"]
        if not waiting:
            raise Conflict(f"Workflow run {run_id} no longer waits at attempt {attempt_id}")
        attempt = waiting[0]
        decisions = [
            d
            for d in self.decisions(run_id=run_id)
            if d.node_id == attempt.node_id and d.created_at >= attempt.started_at
        ]
        if decisions:
            return decisions[-1].outcome == "accepted"
        wait = self.db.one("event_wait_get", run_id=run_id)
        if wait is None or wait["attempt_id"] != attempt_id:
            return False
        if self.db.one("inbox_next", run_id=run_id, name=wait["name"]) is not None:
            return True
        return wait["deadline_at"] is not None and int(wait["deadline_at"]) <= at
