"""Run operations that move a run's lease or status: claims and renewals, status moves,
pause/resume and resume requests, terminal transitions (under a claim or by control) and
interaction deadlines.

Each public method is one transaction that re-reads the run and re-checks the claim it acts
under, if any; a ``False``/``None`` return means nothing was written.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from tether.errors import (
    CommitUnknown,
    Conflict,
    InconsistentState,
    InvalidInput,
)
from tether.store.db import Row
from tether.store.journal import STATUS_TARGETS, owner_type_for
from tether.store.limits import slot_free
from tether.store.records import (
    Actor,
    ClaimAuthority,
    RunRecord,
)
from tether.store.runs import (
    Now,
    RunOps,
    _is_live,
    _json_list,
    _sources,
)
from tether.store.states import (
    QUEUE_TERMINAL,
    RUN_TERMINAL,
    QueueStatus,
    RunStatus,
    queue_sources,
    run_sources,
)
from tether.values import (
    digest_bytes,
    iso,
    require_count,
    require_lease_ms,
    require_text,
    to_datetime,
    token_hash,
)

DETAIL_LIMIT = 8192
CONTROL_LEASE_MS = 30_000
DEFAULT_CONTROL_ID = "workflow-control"
CANCELLED_TEXT = "Workflow run cancelled"
MESSAGE_KINDS_CANCELLED_WITH_RUN = ("step", "decision", "followUp")


def _holds(row: Row | None, claim_token: str, now: int) -> bool:
    """VERIFY: the run exists, is owned, and the live lease was taken with this token."""
    return (
        row is not None
        and _is_live(row, now)
        and row["token_hash"] is not None
        and bytes(row["token_hash"]) == token_hash(claim_token)
    )


class LeaseOps(RunOps):
    """The seed's operations that move a run's lease or status."""

    # -- claims ------------------------------------------------------------------------------
    def claim(
        self, *, run_id: str, runner_id: str, claim_token: str, lease_ms: int, now: Now = None
    ) -> RunRecord | None:
        """Claim one run for a runner. None when terminal, waiting on input, held by another, or
        counting against a concurrency limit whose slots other runs hold."""
        return self._claim_checked(run_id, runner_id, claim_token, lease_ms, now)

    def claim_for_interaction_validation(
        self, *, run_id: str, runner_id: str, claim_token: str, lease_ms: int, now: Now = None
    ) -> RunRecord | None:
        """Claim a run to validate a pending interactive submission (pending requests allowed)."""
        return self._claim_checked(run_id, runner_id, claim_token, lease_ms, now, allow_pending=True)

    def claim_for_control(
        self, *, run_id: str, runner_id: str, claim_token: str, lease_ms: int, now: Now = None
    ) -> RunRecord | None:
        """Take a short control claim that leaves the queue status and errors as they are."""
        return self._claim_checked(
            run_id, runner_id, claim_token, lease_ms, now, allow_pending=True, preserve_status=True
        )

    def claim_next(
        self,
        *,
        runner_id: str,
        claim_token: str,
        lease_ms: int,
        now: Now = None,
        exclude_run_ids: Sequence[str] | None = None,
        definition_digests: Sequence[str] | None = None,
    ) -> RunRecord | None:
        """Claim the first eligible run in (available_at, created_at, run_id) order, or None.

        The candidate is chosen and claimed in one write transaction, so it cannot be taken by
        another runner in between. ``definition_digests`` (``sha256:...``): only runs reserved
        with one of these definitions are eligible (a runner claims only what it has loaded).
        A run under a concurrency limit is taken only while its key has a free slot.
        """
        require_text("runner_id", runner_id)
        require_text("claim_token", claim_token, limit=1000)
        require_lease_ms(lease_ms)
        for run_id in exclude_run_ids or ():
            require_text("exclude_run_ids item", run_id, limit=1000)
        digests = (
            None
            if definition_digests is None
            else _json_list([digest_bytes(digest).hex() for digest in definition_digests])
        )
        at = self._now(now)
        candidate: Row | None = None
        passed: list[str] = []
        try:
            with self.db.transaction():
                query = "run_claim_next" if self.project_id is not None else "run_claim_next_global"
                params: dict[str, Any] = {
                    "now": at,
                    "runner_id": runner_id,
                    "exclude": _json_list(exclude_run_ids),
                    "digests": digests,
                }
                if self.project_id is not None:
                    params["project_id"] = self.project_id
                candidate = self.db.one(query, **params)
                # A run of a limit whose slots filled since the pick is passed over (see limits).
                while candidate is not None and not slot_free(self.db, candidate, at):
                    passed.append(candidate["run_id"])
                    params["exclude"] = _json_list([*(exclude_run_ids or ()), *passed])
                    candidate = self.db.one(query, **params)
                if candidate is None:
                    return None
                scope = {"project_id": self.project_id, "exclude": params["exclude"], "digests": digests}
                chosen = candidate["run_id"]
                return self._claim(chosen, runner_id, claim_token, lease_ms, at, next_scope=scope)
        except CommitUnknown:
            if candidate is None:
                raise
            return self._claim_landed(candidate["run_id"], claim_token)

    def next_lease_lapse_ms(self, *, runner_id: str, now: Now = None) -> int | None:
        """Milliseconds from ``now`` until the earliest live lease that a runner other than
        ``runner_id`` holds on a run (of this store's project) lapses: from then on ``claim_next``
        may take that run over. None when no other runner holds a live lease. A runner with
        nothing to claim waits at most this long, so a dead runner's runs are taken over when their
        leases lapse rather than at the next poll."""
        require_text("runner_id", runner_id)
        at = self._now(now)
        row = self.db.one("lease_next_lapse", now=at, runner_id=runner_id, project_id=self.project_id)
        return None if row is None else int(row["expires_at"]) - at

    def _claim_landed(self, run_id: str, claim_token: str) -> RunRecord | None:
        """After a commit of unknown outcome: the claim if the lease holds this token (it landed),
        else None (nothing was written)."""
        with self.db.transaction(write=False):
            row = self._row(run_id)
            if row is None or row["token_hash"] != token_hash(claim_token):
                return None
            return self._record(row, claim_token)

    def _claim_checked(
        self,
        run_id: str,
        runner_id: str,
        claim_token: str,
        lease_ms: int,
        now: Now,
        *,
        allow_pending: bool = False,
        preserve_status: bool = False,
    ) -> RunRecord | None:
        require_text("run_id", run_id, limit=1000)
        require_text("runner_id", runner_id)
        require_text("claim_token", claim_token, limit=1000)
        require_lease_ms(lease_ms)
        at = self._now(now)
        try:
            with self.db.transaction():
                return self._claim(
                    run_id, runner_id, claim_token, lease_ms, at, allow_pending, preserve_status
                )
        except CommitUnknown:
            return self._claim_landed(run_id, claim_token)

    def _claim(
        self,
        run_id: str,
        runner_id: str,
        claim_token: str,
        lease_ms: int,
        now: int,
        allow_pending: bool = False,
        preserve_status: bool = False,
        next_scope: dict[str, Any] | None = None,
    ) -> RunRecord | None:
        """Claim one run. ``next_scope`` (claim_next's project and exclusions): the statement that
        takes the lease re-checks every claim_next clause."""
        pending_check = () if allow_pending else (("run_has_pending_request", {"run_id": run_id}),)
        row, pending = self._row_with(run_id, *pending_check)
        if row is None or row["status"] in QUEUE_TERMINAL:
            return None
        if self.project_id is not None and row["project_id"] != self.project_id:
            return None  # a project's store claims only its own runs
        if any(pending):
            return None
        if _is_live(row, now) and row["owner_id"] != runner_id:
            return None
        if not preserve_status and self._session_slot_taken(row):
            return None
        # A claim that runs the run needs a slot of its concurrency limit (claim_next counted
        # already); a control claim (preserve_status) does not run it.
        if not preserve_status and next_scope is None and not slot_free(self.db, row, now):
            return None
        expires_at = now + lease_ms
        owner_type = owner_type_for(runner_id)
        taken = self.db.run(
            "lease_take" if next_scope is None else "lease_take_next",
            resource_id=row["resource_id"],
            generation=row["generation"],
            owner_type=owner_type,
            owner_id=runner_id,
            token_hash=token_hash(claim_token),
            now=now,
            expires_at=expires_at,
            require_free=0,
            **(next_scope or {}),
        )
        if taken != 1:
            return None
        if not preserve_status:
            self._set_queue(row, QueueStatus.STARTING, now, clear_error=True)
        self._bump_emit(
            row,
            "lease.claimed",
            {"expiresAt": iso(expires_at)},
            now,
            actor=(owner_type, runner_id),
            generation=row["generation"] + 1,
        )
        return self._record_of(run_id, claim_token)

    def _set_queue(
        self,
        row: Row,
        status: QueueStatus,
        now: int,
        *,
        clear_error: bool = False,
        stamp_start: bool = False,
    ) -> bool:
        """Move the run's queue status to ``status`` if the table allows it from the one ``row``
        holds; whether it moved. ``row``: the run's row read in this transaction with its queue
        status unchanged since (the run lock keeps other writers out), so it decides the move
        and the write needs no answer: it goes out with the transaction's next statement, and
        if it changed no row after all the transaction fails (``expect``)."""
        if row["status"] not in queue_sources(status):
            return False
        self.db.expect(
            "queue_set_status",
            f"Workflow run {row['run_id']} queue status changed from {row['status']} under its lock",
            run_id=row["run_id"],
            status=status.value,
            now=now,
            clear_error=int(clear_error),
            stamp_start=int(stamp_start),
            sources=_sources(queue_sources(status)),
        )
        if status in (QueueStatus.QUEUED, QueueStatus.PARKED):
            self.db.notify("runs")
        return True

    def _session_slot_taken(self, row: Row) -> bool:
        """Whether starting this interactive run would give its session a second active run."""
        if row["execution_mode"] != "interactive" or row["status"] not in (
            QueueStatus.PARKED,
            QueueStatus.QUEUED,
        ):
            return False
        holder = self.db.one("run_session_active", session_id=row["origin_session_id"])
        return holder is not None and holder["run_id"] != row["run_id"]

    def runs_awaiting_resume(self) -> list[str]:
        """Parked runs whose decisions are all answered and that wait for nothing else."""
        return [r["run_id"] for r in self.db.all("run_awaiting_resume", project_id=self.project_id)]

    def runs_past_deadline(self, *, definition_digest: str, timeout_ms: int, now: Now = None) -> list[str]:
        """Unfinished runs (of this store's project) reserved with ``definition_digest`` that
        started ``timeout_ms`` or longer before ``now`` (the store's clock): their run deadline
        passed. At most 100, oldest first."""
        require_count("timeout_ms", timeout_ms)
        at = self._now(now)
        rows = self.db.all(
            "run_past_deadline",
            digest=digest_bytes(definition_digest),
            started_by=at - timeout_ms,
            project_id=self.project_id,
        )
        return [r["run_id"] for r in rows]

    def renew(self, *, run_id: str, claim_token: str, lease_ms: int, now: Now = None) -> bool:
        """Extend a live claim. False when the claim expired, was superseded or never existed."""
        require_text("run_id", run_id, limit=1000)
        require_text("claim_token", claim_token, limit=1000)
        require_lease_ms(lease_ms)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if row is None or row["owner_id"] is None:
                return False
            renewed = self.db.run(
                "lease_renew",
                resource_id=row["resource_id"],
                owner_type=row["owner_type"],
                owner_id=row["owner_id"],
                token_hash=token_hash(claim_token),
                generation=row["generation"],
                now=at,
                expires_at=at + lease_ms,
            )
            # The lease row and nothing else: a renewal changes nothing a viewer shows.
            return renewed == 1

    def verify_claim(self, *, run_id: str, claim_token: str, now: Now = None) -> bool:
        """Whether ``claim_token`` holds the run's live lease at ``now`` (read only)."""
        require_text("run_id", run_id, limit=1000)
        require_text("claim_token", claim_token, limit=1000)
        # The instant first, then the row: a renewal committed between the two reads then only
        # extends the lease judged, where the other order could judge a lease read before its
        # renewal by an instant after its old expiry.
        at = self._now(now)
        return _holds(self._row(run_id), claim_token, at)

    def claim_authority(self, run_id: str, claim_token: str) -> ClaimAuthority | None:
        """Who holds the run under this token (expiry is not judged here: see ``verify_claim``)."""
        require_text("run_id", run_id, limit=1000)
        require_text("claim_token", claim_token, limit=1000)
        row = self._row(run_id)
        if (
            row is None
            or row["owner_id"] is None
            or row["expires_at"] is None
            or bytes(row["token_hash"]) != token_hash(claim_token)
        ):
            return None
        owner_type = owner_type_for(row["owner_id"])
        return ClaimAuthority(
            actor=Actor(owner_type, row["owner_id"]),
            owner_type=owner_type,
            owner_id=row["owner_id"],
            token=claim_token,
            generation=row["generation"],
            lease_ms=row["expires_at"] - row["heartbeat_at"],
        )

    # -- moves under a claim -----------------------------------------------------------------
    def _claimed_row(self, run_id: str, claim_token: str, now: int) -> Row | None:
        row = self._row(run_id)
        return row if _holds(row, claim_token, now) else None

    def _claimed_row_with(
        self, run_id: str, claim_token: str, now: int, *also: tuple[str, Mapping[str, Any]]
    ) -> tuple[Row | None, list[list[Row]]]:
        """``_claimed_row``, and the rows of the reads ``also`` names (in the row's round trip)."""
        row, others = self._row_with(run_id, *also)
        return (row if _holds(row, claim_token, now) else None), others

    def _args(self, run_id: str, claim_token: str, now: Now) -> int:
        require_text("run_id", run_id, limit=1000)
        require_text("claim_token", claim_token, limit=1000)
        return self._now(now)

    def mark_running(self, *, run_id: str, claim_token: str, now: Now = None) -> bool:
        """The claimer reports it executes the run (``started_at`` is kept from the first time)."""
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            row = self._claimed_row(run_id, claim_token, at)
            read_at = self.db.writes
            if row is None or not self._set_queue(row, QueueStatus.RUNNING, at, stamp_start=True):
                return False
            self._bump_emit(row, "run.queue_running", {"status": "running"}, at)
            # The queue columns as queue_set_status wrote them: the next call (the runner moves
            # the run status next) need not read the row again.
            self._row_written(
                run_id,
                read_at,
                1,
                status=QueueStatus.RUNNING.value,
                updated_at=at,
                started_at=at if row["started_at"] is None else row["started_at"],
                finished_at=None,
            )
            return True

    def park(self, *, run_id: str, claim_token: str, now: Now = None) -> bool:
        """Release the claim and leave the run resumable."""
        return self._release(run_id, claim_token, QueueStatus.PARKED, now)

    def complete(self, *, run_id: str, claim_token: str, now: Now = None) -> bool:
        """Release the claim and finish the run's queue entry as done."""
        return self._release(run_id, claim_token, QueueStatus.DONE, now)

    def _release(self, run_id: str, claim_token: str, status: QueueStatus, now: Now) -> bool:
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            # The run's effects are read with its row (in its round trip): nothing here changes
            # them before they are used, and one read serves both uses below (settling moves
            # pending ones only).
            row, (effects,) = self._claimed_row_with(
                run_id, claim_token, at, ("effects_of_run", {"run_id": run_id})
            )
            if row is None or not self._set_queue(row, status, at):
                return False
            parent = self._waiting_parent(row) if status == QueueStatus.DONE else None
            self._release_lease(row, claim_token, at, "claim changed during release")
            self._bump_emit(row, f"run.queue_{status}", {"status": status.value}, at)
            self._settle_effects(
                row, "run.park_queue" if status == QueueStatus.PARKED else "run.settle_queue", at, effects
            )
            if status == QueueStatus.DONE:
                owner = (row["owner_type"], row["owner_id"])
                text = "Workflow run completed while the effect was applying"
                self._end_run_effects(run_id, ("applying",), owner, text, at, "workflowCompleted", effects)
                self._wake_parent(row, parent, at)
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def _waiting_parent(self, row: Row) -> Row | None:
        """Called by every move that finishes a run (``row``: its row, read in the move's
        transaction) before it writes the journal: ``ChildOps`` (children.py) locks and returns
        the parent run that waits for this one, if any."""
        return None

    def _wake_parent(self, row: Row, parent: Row | None, now: int) -> None:
        """Called by every move that finishes a run, last in its transaction, with what
        ``_waiting_parent`` returned: ``ChildOps`` puts that parent back in the queue."""

    def _release_lease(self, row: Row, claim_token: str, now: int, what: str) -> None:
        """Clear the lease ``row`` shows held with ``claim_token``; if it is not (``what``
        happened), the transaction fails with ``InconsistentState`` (``expect``)."""
        self.db.expect(
            "lease_release",
            f"Workflow run {row['run_id']} {what}",
            resource_id=row["resource_id"],
            token_hash=token_hash(claim_token),
            generation=row["generation"],
            now=now,
        )

    def park_for_no_progress(self, *, run_id: str, claim_token: str, detail: str, now: Now = None) -> bool:
        """Park a run whose runner made no progress; claim_next skips it until an operator resumes."""
        return self._special_park(
            run_id,
            claim_token,
            detail,
            now,
            code="runnerNoProgress",
            event="run.worker_no_progress",
            state_error="changed during runner recovery",
            claim_error="claim changed during runner recovery",
        )

    def park_for_source_change(self, *, run_id: str, claim_token: str, detail: str, now: Now = None) -> bool:
        """Park a run whose workflow source changed since it was reserved."""
        return self._special_park(
            run_id,
            claim_token,
            detail,
            now,
            code="workflowSourceChanged",
            event="run.source_changed",
            state_error="has inconsistent source-change state",
            claim_error="claim changed during source recovery",
        )

    def _special_park(
        self,
        run_id: str,
        claim_token: str,
        detail: str,
        now: Now,
        *,
        code: str,
        event: str,
        state_error: str,
        claim_error: str,
    ) -> bool:
        at = self._args(run_id, claim_token, now)
        if not isinstance(detail, str):
            raise InvalidInput("detail must be a string")
        detail = detail[:DETAIL_LIMIT]
        with self.db.transaction():
            row = self._claimed_row(run_id, claim_token, at)
            if row is None:
                return False
            error_hash = self._put_text(detail, at)
            run_changed = self.db.run("run_set_detail", run_id=run_id, detail=detail, now=at)
            queue_changed = self.db.run(
                "queue_park_with_error",
                run_id=run_id,
                code=code,
                error_hash=error_hash,
                now=at,
                touch_available=1,
                sources=_sources(queue_sources(QueueStatus.PARKED)),
            )
            if run_changed != 1 or queue_changed != 1:
                raise InconsistentState(f"Workflow run {run_id} {state_error}")
            self._release_lease(row, claim_token, at, claim_error)
            self._bump_emit(row, event, {"status": "parked", "code": code}, at)
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def park_for_ambiguous_effect(self, *, run_id: str, claim_token: str, now: Now = None) -> bool:
        """Park a running run whose effect outcome is unknown; an operator must decide."""
        at = self._args(run_id, claim_token, now)
        detail = "effect outcome is ambiguous; explicit recovery is required"
        with self.db.transaction():
            row = self._claimed_row(run_id, claim_token, at)
            if row is None:
                return False
            error_hash = self._put_text(detail, at)
            self.db.run(
                "attempt_set_waiting",
                run_id=run_id,
                attempt_id=None,
                now=at,
                sources=_sources(("pending", "running")),
            )
            run_changed = self._set_run(run_id, RunStatus.WAITING, at, detail=detail, only_from=("running",))
            queue_changed = self.db.run(
                "queue_park_with_error",
                run_id=run_id,
                code="effectAmbiguous",
                error_hash=error_hash,
                now=at,
                touch_available=0,
                sources=_sources(("starting", "running", "parked")),
            )
            if not run_changed or queue_changed != 1:
                raise InconsistentState(f"Workflow run {run_id} has inconsistent ambiguous-effect state")
            self._release_lease(row, claim_token, at, "claim changed during effect recovery")
            self._bump_emit(row, "run.effect_ambiguous", {"status": "waiting", "code": "effectAmbiguous"}, at)
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def _set_run(
        self,
        run_id: str,
        status: RunStatus,
        now: int,
        *,
        detail: str | None = None,
        error_hash: bytes | None = None,
        only_from: Sequence[str] | None = None,
    ) -> bool:
        sources = run_sources(status) if only_from is None else tuple(only_from)
        self.db.notify("runs")  # a parked run waiting on its status may now be claimable
        return (
            self.db.run(
                "run_set_status",
                run_id=run_id,
                status=status.value,
                detail=detail,
                error_hash=error_hash,
                now=now,
                sources=_sources(sources),
            )
            == 1
        )

    def _move_run(self, row: Row, status: RunStatus, now: int, *, detail: str | None = None) -> None:
        """``_set_run`` for a move the caller checked against the durable status ``row`` holds
        (the run's row read in this transaction, that status unchanged since): the write needs
        no answer, so it goes out with the transaction's next statement, and if it changed no
        row after all the transaction fails (``expect``)."""
        self.db.notify("runs")
        self.db.expect(
            "run_set_status",
            f"Workflow run {row['run_id']} durable status changed from {row['run_status']} under its lock",
            run_id=row["run_id"],
            status=status.value,
            detail=detail,
            error_hash=None,
            now=now,
            sources=_sources(run_sources(status)),
        )

    # -- pause and resume --------------------------------------------------------------------
    def pause_parked(self, *, run_id: str, now: Now = None) -> bool:
        """Pause a parked run that waits on its session (its deadline clock stops)."""
        require_text("run_id", run_id, limit=1000)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if row is None or row["status"] != QueueStatus.PARKED or _is_live(row, at):
                return False
            if self.db.one("run_has_pending_request", run_id=run_id) is None:
                return False
            if row["paused"] == 1:
                return True
            changed = self.db.run(
                "run_set_paused",
                run_id=run_id,
                paused=1,
                detail="paused",
                now=at,
                sources=_sources(("running", "waiting")),
            )
            if changed != 1:
                return False
            self._close_run_time(run_id)
            self._bump_emit(
                row, "run.paused", {"status": "parked"}, at, actor=("control", None), generation=0
            )
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def resume_paused_interaction(self, *, run_id: str, now: Now = None) -> bool:
        """Unpause a parked run that waits on its session's input."""
        require_text("run_id", run_id, limit=1000)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if (
                row is None
                or row["status"] != QueueStatus.PARKED
                or row["run_status"] != RunStatus.WAITING
                or row["paused"] != 1
                or _is_live(row, at)
                or self.db.one("run_has_pending_request", run_id=run_id) is None
            ):
                return False
            changed = self.db.run(
                "run_set_paused",
                run_id=run_id,
                paused=0,
                detail="waiting for origin-session input",
                now=at,
                sources=_sources(("waiting",)),
            )
            if changed != 1:
                return False
            self.db.notify("runs")
            self._bump_emit(
                row, "run.resumed", {"status": "waiting"}, at, actor=("control", None), generation=0
            )
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def request_resume(self, *, run_id: str, now: Now = None) -> bool:
        """Put an unclaimed, non-terminal run back in the queue (operator resume).

        False when the run is terminal, held by a live claim, waits on its session, still has an
        effect whose outcome is ambiguous, or its session's active slot is taken by another run.
        """
        require_text("run_id", run_id, limit=1000)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if row is None or row["status"] in QUEUE_TERMINAL or _is_live(row, at):
                return False
            if self.db.one("run_has_pending_request", run_id=run_id) is not None:
                return False
            if any(effect["status"] == "ambiguous" for effect in self._run_effects(run_id)):
                return False
            if self._session_slot_taken(row):
                return False
            self.db.run(
                "run_set_paused",
                run_id=run_id,
                paused=0,
                detail=None,
                now=at,
                sources=_sources((*run_sources(RunStatus.RUNNING), "queued")),
            )
            self.db.run(
                "queue_requeue", run_id=run_id, now=at, sources=_sources(queue_sources(QueueStatus.QUEUED))
            )
            self.db.notify("runs")
            self._bump_emit(
                row, "run.resume_requested", {"status": "queued"}, at, actor=("control", None), generation=0
            )
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    # -- terminal transitions ----------------------------------------------------------------
    def fail(
        self,
        *,
        run_id: str,
        error_code: str,
        error_message: str,
        claim_token: str | None = None,
        now: Now = None,
    ) -> bool:
        """Fail the run. With a token: the live claimer. Without: only a queued/starting unowned run."""
        require_text("error_code", error_code)
        if not isinstance(error_message, str):
            raise InvalidInput("error_message must be a string")
        return self._terminal(run_id, claim_token, QueueStatus.FAILED, error_code, error_message, now)

    def cancel(self, *, run_id: str, claim_token: str | None = None, now: Now = None) -> bool:
        """Cancel the run. Without a token, a run whose claim is absent or expired is cancelled
        through ``cancel_stale``; with a wrong token nothing happens."""
        cancelled = self._terminal(
            run_id, claim_token, QueueStatus.CANCELLED, "cancelled", CANCELLED_TEXT, now
        )
        if cancelled or claim_token is not None:
            return cancelled
        return self.cancel_stale(run_id=run_id, now=now)

    def time_out(
        self, *, run_id: str, error_message: str, claim_token: str | None = None, now: Now = None
    ) -> bool:
        """End the run ``timed_out`` (its queue entry ``failed``, code ``runTimedOut``): its
        deadline passed. Its unfinished attempt is recorded ``timed_out``, its open decisions and
        input requests are closed, an effect caught applying becomes ambiguous. With a token: the
        live claimer; without: a run no live claim holds (a run waiting for a person, parked,
        queued, or left by a dead runner), under a short control claim. False when the run is
        terminal, or held by another live claim."""
        require_text("run_id", run_id, limit=1000)
        if not isinstance(error_message, str) or not error_message:
            raise InvalidInput("error_message must be a non-empty string")
        if claim_token is not None:
            return self._terminal(
                run_id, claim_token, QueueStatus.FAILED, "runTimedOut", error_message, now, timed_out=True
            )
        at = self._now(now)
        control = str(uuid.uuid4())
        with self.db.transaction():
            row = self._row(run_id)
            if (
                row is None
                or row["status"] in QUEUE_TERMINAL
                or row["run_status"] in RUN_TERMINAL
                or _is_live(row, at)
            ):
                return False
            taken = self.db.run(
                "lease_take",
                resource_id=row["resource_id"],
                generation=row["generation"],
                owner_type="system",
                owner_id=DEFAULT_CONTROL_ID,
                token_hash=token_hash(control),
                now=at,
                expires_at=at + CONTROL_LEASE_MS,
                require_free=1,
            )
            if taken != 1:
                return False
            if not self._terminal(
                run_id,
                control,
                QueueStatus.FAILED,
                "runTimedOut",
                error_message,
                to_datetime(at),
                timed_out=True,
            ):
                raise InconsistentState(f"Workflow run {run_id} changed while it timed out")
            return True

    def _terminal(
        self,
        run_id: str,
        claim_token: str | None,
        status: QueueStatus,
        code: str,
        error: str,
        now: Now,
        *,
        timed_out: bool = False,
    ) -> bool:
        """``timed_out``: a failed run ends ``timed_out``, its open attempt too, and its open
        decisions are closed (see ``time_out``)."""
        require_text("run_id", run_id, limit=1000)
        if claim_token is not None:
            require_text("claim_token", claim_token, limit=1000)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if row is None or row["status"] in QUEUE_TERMINAL or row["run_status"] in RUN_TERMINAL:
                return False
            if claim_token is None:
                if (
                    row["status"] not in (QueueStatus.QUEUED, QueueStatus.STARTING)
                    or row["owner_id"] is not None
                ):
                    return False
            elif not _holds(row, claim_token, at):
                return False
            parent = self._waiting_parent(row)
            error_hash = self._put_text(error, at)
            finished = self.db.run(
                "queue_finish",
                run_id=run_id,
                status=status.value,
                code=code,
                error_hash=error_hash,
                now=at,
                sources=_sources(queue_sources(status)),
            )
            if finished != 1:
                return False
            if claim_token is not None:
                self._release_lease(row, claim_token, at, "claim changed during terminal transition")
            run_status = RunStatus.TIMED_OUT if timed_out else RunStatus(status.value)
            if not self._set_run(run_id, run_status, at, error_hash=error_hash) and timed_out:
                raise InconsistentState(
                    f"Workflow run {run_id} cannot move from {row['run_status']} to timed_out"
                )
            self._cancel_pending_messages(run_id, at)
            if status == QueueStatus.FAILED:
                self._close_run_time(run_id)
                self.db.run(
                    "attempt_end_active",
                    run_id=run_id,
                    status="timed_out" if timed_out else "failed",
                    error_hash=error_hash,
                    now=at,
                )
                if timed_out:
                    self.db.run(
                        "decision_expire_open", run_id=run_id, actor_id=row["owner_id"] or "system", now=at
                    )
                self.db.run("request_cancel_pending", run_id=run_id, now=at)
                # An effect caught applying is classified (pending ones were never applied).
                owner = (row["owner_type"] or "system", row["owner_id"])
                self._end_run_effects(run_id, ("applying",), owner, error_hash, at, "workflowFailed")
            else:
                self._cancel_dependents(run_id, row["owner_id"] or DEFAULT_CONTROL_ID, error_hash, at)
            self._bump_emit(
                row, f"run.queue_{status}", {"status": status.value, "code": code, "error": error}, at
            )
            self._wake_parent(row, parent, at)
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def cancel_stale(
        self,
        *,
        run_id: str,
        control_id: str | None = None,
        claim_token: str | None = None,
        now: Now = None,
    ) -> bool:
        """Cancel a non-terminal run whose claim is absent or expired, under a short control claim
        (it consumes one lease generation). False for a live or terminal run."""
        require_text("run_id", run_id, limit=1000)
        control_id = require_text("control_id", control_id or DEFAULT_CONTROL_ID)
        claim_token = require_text("claim_token", claim_token or str(uuid.uuid4()), limit=1000)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if (
                row is None
                or row["status"] in QUEUE_TERMINAL
                or row["run_status"] in RUN_TERMINAL
                or _is_live(row, at)
            ):
                return False
            parent = self._waiting_parent(row)
            generation = row["generation"] + 1
            taken = self.db.run(
                "lease_take",
                resource_id=row["resource_id"],
                generation=row["generation"],
                owner_type="system",
                owner_id=control_id,
                token_hash=token_hash(claim_token),
                now=at,
                expires_at=at + CONTROL_LEASE_MS,
                require_free=1,
            )
            if taken != 1:
                return False
            error_hash = self._put_text(CANCELLED_TEXT, at)
            finished = self.db.run(
                "queue_finish",
                run_id=run_id,
                status="cancelled",
                code="cancelled",
                error_hash=error_hash,
                now=at,
                sources=_sources(queue_sources(QueueStatus.CANCELLED)),
            )
            if finished != 1:
                raise InconsistentState(f"Workflow run {run_id} has inconsistent queue state")
            if not self._set_run(run_id, RunStatus.CANCELLED, at, error_hash=error_hash):
                raise InconsistentState(f"Workflow run {run_id} has inconsistent durable state")
            self._cancel_pending_messages(run_id, at)
            self._cancel_dependents(run_id, control_id, error_hash, at)
            control = self._require_row(run_id)
            self._release_lease(control, claim_token, at, "control claim changed during cancellation")
            self._bump_emit(
                row,
                "run.queue_cancelled",
                {"status": "cancelled", "code": "cancelled", "staleControl": True},
                at,
                actor=("control", control_id),
                generation=generation,
            )
            self._wake_parent(row, parent, at)
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def _cancel_pending_messages(
        self, run_id: str, now: int, kinds: Sequence[str] = MESSAGE_KINDS_CANCELLED_WITH_RUN
    ) -> int:
        if not kinds:
            return 0
        return self.db.run("message_cancel_pending", run_id=run_id, now=now, kinds=_sources(kinds))

    def _cancel_dependents(self, run_id: str, actor_id: str, error_hash: bytes, now: int) -> None:
        self._close_run_time(run_id)
        self.db.run("attempt_end_active", run_id=run_id, status="cancelled", error_hash=error_hash, now=now)
        self._end_run_effects(
            run_id, ("pending", "applying"), ("control", actor_id), error_hash, now, "workflowCancelled"
        )
        self.db.run("decision_cancel_open", run_id=run_id, actor_id=actor_id, now=now)
        receipt = self._put_json({"status": "rejected", "error": CANCELLED_TEXT}, now)
        self.db.run("submission_reject_for_run", run_id=run_id, receipt_hash=receipt, now=now)
        self.db.run("request_cancel_pending", run_id=run_id, now=now)

    def _end_run_effects(
        self,
        run_id: str,
        statuses: Sequence[str],
        actor: tuple[str, str | None],
        error: bytes | str,
        now: int,
        reason: str,
        effects: list[Row] | None = None,
    ) -> None:
        """Classify the run-scoped effects a run leaves behind as it ends (``statuses`` among
        pending/applying): one caught applying becomes ``ambiguous`` (its open attempt
        ``interrupted``), a pending one ``cancelled``; each gets one event on its own resource.
        ``effects``: the run's effects, when the caller read them already in this transaction
        (and changed none of those ``statuses`` since)."""
        if effects is None:
            effects = self._run_effects(run_id)
        for effect in sorted(effects, key=lambda e: e["effect_id"]):
            if effect["owner_scope"] != "run" or effect["status"] not in statuses:
                continue
            if isinstance(error, str):
                error = self._put_text(error, now)
            error_hash = error
            status = "ambiguous" if effect["status"] == "applying" else "cancelled"
            changed = self.db.run(
                "effect_set_status",
                effect_id=effect["effect_id"],
                status=status,
                attempt_count=effect["attempt_count"],
                result_hash=None,
                error_hash=error_hash,
                now=now,
                old_status=effect["status"],
                old_attempt_count=effect["attempt_count"],
            )
            if changed != 1:
                raise InconsistentState(f"Workflow effect {effect['effect_id']} changed during cancellation")
            if effect["status"] == "applying":
                self.db.run(
                    "effect_attempt_finish",
                    effect_id=effect["effect_id"],
                    attempt_number=effect["attempt_count"],
                    outcome="interrupted",
                    error_hash=error_hash,
                    now=now,
                )
            self._bump_event(
                effect["resource_id"],
                f"effect.{status}",
                actor[0],
                actor[1],
                {"runId": run_id, "effectId": effect["effect_id"], "reason": reason},
                now,
            )

    def delete(self, *, run_id: str, claim_token: str, now: Now = None) -> bool:
        """Delete a run and everything recorded for it, under its live claim.

        False when the run is missing or the claim is not live. Raises ``Conflict`` while restart
        children still point at the run.
        """
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            row = self._claimed_row(run_id, claim_token, at)
            if row is None:
                return False
            child = self.db.one("run_delete_children_exist", run_id=run_id)
            if child is not None:
                raise Conflict(f"Workflow run {run_id} has restart children; delete {child['run_id']} first")
            self.db.run("run_delete_events", resource_id=row["resource_id"])
            self.db.run("run_delete_effect_resources", resource_id=row["resource_id"])
            deleted = self.db.run("run_delete_resource", resource_id=row["resource_id"]) == 1
            self._forget_advances()
            return deleted

    # -- interaction deadlines ---------------------------------------------------------------
    def begin_interaction_timeout(
        self, *, run_id: str, target_session_id: str, claim_token: str, now: Now = None
    ) -> bool:
        """Cancel the first expired pending request of the run for the session and hand the run
        back to the claimer to finish the node. False when nothing expired (active time only)."""
        at = self._args(run_id, claim_token, now)
        require_text("target_session_id", target_session_id)
        with self.db.transaction():
            row = self._claimed_row(run_id, claim_token, at)
            if row is None or row["run_status"] != RunStatus.WAITING or row["status"] != QueueStatus.PARKED:
                return False
            expired = self.db.one("request_expired", run_id=run_id, session_id=target_session_id)
            if expired is None:
                return False
            self._close_run_time(run_id)
            request = self.db.run(
                "request_set_status", request_id=expired["request_id"], status="cancelled", now=at
            )
            run = self._set_run(
                run_id,
                RunStatus.RUNNING,
                at,
                detail="finishing expired interaction deadline",
                only_from=("waiting",),
            )
            queue = self.db.run(
                "queue_set_status",
                run_id=run_id,
                status="starting",
                now=at,
                clear_error=1,
                stamp_start=0,
                sources=_sources(("parked",)),
            )
            if request != 1 or not run or queue != 1:
                raise InconsistentState(f"Workflow run {run_id} changed during interaction timeout")
            receipt = self._put_json(
                {"status": "rejected", "error": "Workflow node model-turn deadline expired"}, at
            )
            self.db.run(
                "submission_reject_for_request",
                request_id=expired["request_id"],
                receipt_hash=receipt,
                now=at,
            )
            self._bump_emit(
                row,
                "run.interaction_timeout_started",
                {"requestId": expired["request_id"], "attemptId": expired["attempt_id"]},
                at,
            )
            from tether.store.records import ViewerTarget

            self._viewer_record(
                run_id, (ViewerTarget("summary"), ViewerTarget("replay"), ViewerTarget("conversation")), at
            )
            return True
