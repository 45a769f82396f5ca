"""Child runs: a run that a node of another run (its parent) starts as a run of its own.

The link lives in ``run_children`` (one row per child: its parent, the node that started it and
whether that node waits for it). ``child_start`` reserves the child and writes the link in the
parent's claim-checked transaction; when the node waits, the same transaction parks the parent
``waiting``. The move that finishes a child (done, failed, cancelled: every terminal move in
``leases.py`` calls ``_waiting_parent`` and ``_wake_parent``) puts a parent that waits for it back
in the queue in the same transaction, so no runner polls for a child's end. Cancelling a parent
(``request_cancel``) cancels the children it waits for first, in the same transaction.

Locks (PostgreSQL): a transaction that touches both a child and its parent takes the child's run
lock first (a finishing child holds its own lock when it locks its parent, before it writes the
journal), so two such transactions do not wait for each other in a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tether.errors import ClaimLost, Conflict
from tether.store.db import Row
from tether.store.forks import ForkOps
from tether.store.journal import STATUS_TARGETS
from tether.store.limits import RunLimit
from tether.store.records import Preparation
from tether.store.runs import Now, _is_live, _sources
from tether.store.states import QUEUE_TERMINAL, QueueStatus, RunStatus, queue_sources
from tether.values import Json, require_run_id, require_text, to_datetime

#: Journal entries on the parent: a child started by one of its nodes, and a child it waited for
#: that finished (the parent went back in the queue).
CHILD_STARTED_EVENT = "run.child_started"
CHILD_FINISHED_EVENT = "run.child_finished"


@dataclass(frozen=True)
class ChildRun:
    """A child run as its parent sees it: the node that started it, whether that node waits for
    it, and where the child stands (queue and durable status)."""

    run_id: str
    node_id: str
    waits: bool
    workflow_name: str
    status: str
    run_state_status: str
    error_code: str | None
    created_at: datetime


@dataclass(frozen=True)
class ParentLink:
    """The parent of a child run: the run and its node that started the child, and whether that
    node waits for the child."""

    parent_run_id: str
    node_id: str
    waits: bool


class ChildOps(ForkOps):
    """Starting child runs, waiting for them, and reading the links both ways."""

    def child_start(
        self,
        *,
        parent_run_id: str,
        claim_token: str,
        node_id: str,
        child_run_id: str,
        waits: bool,
        workflow_name: str,
        workflow_source_ref: str,
        workflow_source: Json,
        definition_digest: str,
        definition_snapshot: Json,
        input: Json = None,
        origin_session_id: str,
        execution_mode: str = "headless",
        limit: RunLimit | None = None,
        now: Now = None,
    ) -> Preparation:
        """Under the parent's live claim, reserve ``child_run_id`` as a child of the parent's node
        ``node_id``, or adopt it when the parent started it already (a retried step, a runner
        that died after the start committed): one transaction, nothing written on a refusal.

        ``waits``: unless the child is finished already, the same transaction moves the parent
        to ``waiting`` and parks it (releasing the claim; the child's finishing move requeues
        it). Parking first frees an interactive parent's session for the child. ``ClaimLost``
        when the parent's claim is gone; ``Conflict`` when ``child_run_id`` names a run that is
        not a child of this parent."""
        require_run_id(parent_run_id)
        require_text("claim_token", claim_token, limit=1000)
        require_text("node_id", node_id)
        args = self._reservation_args(
            {
                "run_id": child_run_id,
                "workflow_name": workflow_name,
                "workflow_source_ref": workflow_source_ref,
                "workflow_source": workflow_source,
                "definition_digest": definition_digest,
                "definition_snapshot": definition_snapshot,
                "input": input,
                "launch_options": None,
                "origin_session_id": origin_session_id,
                "execution_mode": execution_mode,
                "parent_run_id": None,
                "lineage_kind": None,
                "restart_number": None,
                "parent_run_revision": None,
                "limit": limit,
                "now": now,
            }
        )
        at = args["now"]
        with self.db.transaction():
            existing = self._row(child_run_id)  # the child's lock first (see the module's note)
            parent = self._claimed_row(parent_run_id, claim_token, at)
            if parent is None:
                raise ClaimLost(
                    f"The claim on workflow run {parent_run_id} is no longer live; nothing was written"
                )
            if existing is not None:
                link = self.db.one("child_link_of", run_id=child_run_id)
                if link is None or link["parent_run_id"] != parent_run_id:
                    raise Conflict(
                        f"Workflow run {child_run_id} exists and is not a child of {parent_run_id}"
                    )
                if link["node_id"] != node_id:
                    raise Conflict(
                        f"Workflow run {child_run_id} is the child of node {link['node_id']} of "
                        f"{parent_run_id}, not of node {node_id}: give one of the nodes a key"
                    )
                if waits and existing["status"] not in QUEUE_TERMINAL:
                    self._await_child(parent_run_id, claim_token, child_run_id, at)
                return Preparation("adopted", self._record(existing))
            if waits:
                self._await_child(parent_run_id, claim_token, child_run_id, at)
            record = self._reserve(args)
            self.db.run(
                "child_link_insert",
                child_run_id=child_run_id,
                parent_run_id=parent_run_id,
                node_id=node_id,
                waits=int(waits),
                now=at,
            )
            payload: Json = {"childRunId": child_run_id, "nodeId": node_id, "waits": waits}
            # Journaled as the parent's runner under its claim (released above when it waits).
            self._bump_emit(
                self._require_row(parent_run_id),
                CHILD_STARTED_EVENT,
                payload,
                at,
                actor=(parent["owner_type"], parent["owner_id"]),
                generation=parent["generation"],
            )
            return Preparation("reserved", self._record_of(record.run_id))

    def child_wait(self, *, parent_run_id: str, claim_token: str, child_run_id: str, now: Now = None) -> bool:
        """Park the parent (still ``waiting``) for its unfinished child: True when parked, False
        when the child is finished or gone (the caller goes on with its outcome). Read with the child
        locked, so a child finishing meanwhile either is seen finished here or finds the parent
        parked and requeues it. ``ClaimLost`` when the parent's claim is gone."""
        require_run_id(parent_run_id)
        require_run_id(child_run_id)
        at = self._now(now)
        with self.db.transaction():
            child = self._row(child_run_id)
            if child is None or child["status"] in QUEUE_TERMINAL:
                return False
            if not self.park(run_id=parent_run_id, claim_token=claim_token, now=to_datetime(at)):
                raise ClaimLost(
                    f"The claim on workflow run {parent_run_id} is no longer live; nothing was written"
                )
            return True

    def _await_child(self, parent_run_id: str, claim_token: str, child_run_id: str, at: int) -> None:
        when = to_datetime(at)
        self.set_run_status(
            run_id=parent_run_id,
            claim_token=claim_token,
            status=RunStatus.WAITING.value,
            detail=f"waiting for child run {child_run_id}",
            now=when,
        )
        if not self.park(run_id=parent_run_id, claim_token=claim_token, now=when):
            raise ClaimLost(
                f"The claim on workflow run {parent_run_id} is no longer live; nothing was written"
            )

    def _waiting_parent(self, row: Row) -> Row | None:
        """The parent that waits for the run of ``row``, which a move is finishing: locked here,
        before the move writes the journal (on PostgreSQL a lock taken after that does not
        wait: it fails the move when another transaction holds it)."""
        if row["child_of"] is None or not row["child_waits"]:
            return None
        parent = self._row(row["child_of"])
        if parent is not None:
            # Its session's queue rows too, which ``_wake_parent`` reads to requeue it.
            self._session_slot_taken(parent)
        return parent

    def _wake_parent(self, row: Row, parent: Row | None, now: int) -> None:
        """The run of ``row`` just finished (in the caller's transaction): ``parent``, the run
        waiting for it (``_waiting_parent``), goes back in the queue, journaled
        ``run.child_finished``. A parent that is held, finished, or whose session has another
        active run meanwhile is left as it is (its node reads the child when it runs next;
        ``tether resume`` requeues it)."""
        if (
            parent is None
            or parent["status"] != QueueStatus.PARKED
            or parent["run_status"] != RunStatus.WAITING
            or parent["paused"]
            or _is_live(parent, now)
            or self._session_slot_taken(parent)
        ):
            return
        requeued = self.db.run(
            "queue_requeue",
            run_id=parent["run_id"],
            now=now,
            sources=_sources(queue_sources(QueueStatus.QUEUED)),
        )
        if requeued != 1:
            return
        self.db.notify("runs")
        child = self._require_row(row["run_id"])
        self._bump_emit(
            parent,
            CHILD_FINISHED_EVENT,
            {"childRunId": row["run_id"], "nodeId": row["child_of_node"], "status": child["status"]},
            now,
            actor=("control", None),
            generation=0,
        )
        self._viewer_record(parent["run_id"], STATUS_TARGETS, now)

    def request_cancel(self, *, run_id: str, actor_id: str = "operator", now: Now = None) -> str:
        """Cancel the run: ``"cancelled"`` when no live claim held it (it is cancelled now), else
        ``"requested"``: the request is committed, nothing more of the run begins, and its holder
        ends it. ``Conflict`` for a finished run (nothing is written).

        First, in the same transaction, every unfinished child run it waits for is cancelled
        the same way (a held child is marked, and its runner ends it); a refused cancel of the
        run cancels no child either."""
        require_run_id(run_id)
        with self.db.transaction():
            for child in self.children(run_id):
                if not child.waits:
                    continue
                row = self._row(child.run_id)  # locked: its status cannot change before the cancel
                if row is not None and row["status"] not in QUEUE_TERMINAL:
                    super().request_cancel(run_id=child.run_id, actor_id=actor_id, now=now)
            return super().request_cancel(run_id=run_id, actor_id=actor_id, now=now)

    # -- reading -----------------------------------------------------------------------------
    def children(self, run_id: str) -> list[ChildRun]:
        """The child runs the run's nodes started, oldest first."""
        require_text("run_id", run_id, limit=1000)
        return [
            ChildRun(
                run_id=r["child_run_id"],
                node_id=r["node_id"],
                waits=bool(r["waits"]),
                workflow_name=r["workflow_name"],
                status=r["status"],
                run_state_status=r["run_status"],
                error_code=r["error_code"],
                created_at=to_datetime(int(r["created_at"])),
            )
            for r in self.db.all("child_links_of", run_id=run_id)
        ]

    def parent_of(self, run_id: str) -> ParentLink | None:
        """The run that started this one as a child run (None: it is not a child run)."""
        require_text("run_id", run_id, limit=1000)
        link = self.db.one("child_link_of", run_id=run_id)
        if link is None:
            return None
        return ParentLink(str(link["parent_run_id"]), str(link["node_id"]), bool(link["waits"]))
