"""What the engine records while a run executes, each write under the run's live claim.

Node attempts and their active time, interactive requests and submissions, human decisions,
effects (the outbox), workflow messages to the origin session, engine status moves and the
viewer projection. Every claim-gated write re-checks the claim inside its transaction and
advances the run's revision with one journal event, so a fenced runner can never write and a
watcher sees every step.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from tether.errors import (
    CancelRequested,
    ClaimLost,
    Conflict,
    DeadlinePassed,
    IllegalTransition,
    InconsistentState,
    InvalidInput,
    NotFound,
)
from tether.store.db import Row
from tether.store.journal import resource_id_for, viewer_targets
from tether.store.leases import LeaseOps
from tether.store.records import (
    Attempt,
    Decision,
    Effect,
    InteractiveRequest,
    SettledTry,
    Submission,
    ViewerChanges,
    ViewerTarget,
    WorkflowMessage,
)
from tether.store.runs import _sources
from tether.store.states import RUN_TRANSITIONS, QueueStatus, RunStatus
from tether.values import (
    Json,
    canonical_bytes,
    canonical_json,
    iso,
    optional_text,
    ordered_uuid,
    parse_now,
    require_count,
    require_text,
    sha256,
    to_datetime,
)

Now = datetime | str | None
ATTEMPT_ENDINGS = ("completed", "failed", "timed_out", "interrupted", "cancelled")
MESSAGE_KINDS = ("step", "decision", "notification", "terminal", "followUp")
PROVENANCES = ("human", "timeout_policy", "explicit_cancel", "expired_no_default")


class WorkOps(LeaseOps):
    """Engine-facing writes and reads."""

    # -- helpers -----------------------------------------------------------------------------
    def _held(self, run_id: str, claim_token: str, now: int) -> Row:
        """The run row under a live claim; ``ClaimLost`` when the claim is gone."""
        return self._held_with(run_id, claim_token, now)[0]

    def _held_with(
        self, run_id: str, claim_token: str, now: int, *also: tuple[str, Mapping[str, Any]]
    ) -> tuple[Row, list[list[Row]]]:
        """``_held``, and the rows of the reads ``also`` names (in the row's round trip)."""
        row, others = self._claimed_row_with(run_id, claim_token, now, *also)
        if row is None:
            raise ClaimLost(f"The claim on workflow run {run_id} is no longer live; nothing was written")
        return row, others

    def _attempt(self, row: Row) -> Attempt:
        return Attempt(
            attempt_id=row["attempt_id"],
            run_id=row["run_id"],
            node_id=row["node_id"],
            attempt_number=row["attempt_number"],
            status=row["status"],
            output=self._read_json(row["output_hash"]),
            exit_name=row["exit_name"],
            error_message=self._read_text(row["error_hash"]),
            timeout_ms=row["timeout_ms"],
            elapsed_ms=row["elapsed_ms"],
            started_at=to_datetime(row["started_at"]),
            finished_at=to_datetime(row["finished_at"]),
        )

    def _require_attempt(self, run_id: str, attempt_id: str, found: list[Row] | None = None) -> Row:
        """The run's attempt; ``found``: the rows of its attempt_get read, when read already."""
        if found is None:
            found = self.db.all("attempt_get", attempt_id=attempt_id)
        row = found[0] if found else None
        if row is None or row["run_id"] != run_id:
            raise NotFound(f"Node attempt not found: {attempt_id}")
        return row

    # -- engine status moves -----------------------------------------------------------------
    def set_run_status(
        self, *, run_id: str, claim_token: str, status: str, detail: str | None = None, now: Now = None
    ) -> None:
        """Move the durable run status along a legal edge (RUN_TRANSITIONS) under the claim."""
        at = self._args(run_id, claim_token, now)
        try:
            target = RunStatus(status)
        except ValueError:
            raise InvalidInput(f"Unknown run status: {status}") from None
        if target in (RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CANCELLED):
            raise InvalidInput(
                f"A run becomes {target} through fail() or cancel(), which settle its dependents"
            )
        optional_text("detail", detail, limit=8192)
        with self.db.transaction():
            row = self._held(run_id, claim_token, at)
            read_at = self.db.writes
            current = RunStatus(row["run_status"])
            if target not in RUN_TRANSITIONS[current]:
                raise IllegalTransition(f"Workflow run {run_id} cannot move from {current} to {target}")
            self._move_run(row, target, at, detail=detail)
            if target == RunStatus.WAITING:
                self.db.run(
                    "attempt_set_waiting",
                    run_id=run_id,
                    attempt_id=None,
                    now=at,
                    sources=_sources(("pending", "running")),
                )
            elif current == RunStatus.WAITING and target == RunStatus.RUNNING:
                self.db.run("attempt_wake", run_id=run_id, now=at)
            bumps = 0
            if not self._journaled_last(row["resource_id"], f"run.queue_{target.value}"):
                # A run that starts running as its queue entry does (a claim's first step) has
                # one journal entry for both: ``run.queue_running`` says it, with the same
                # actor and generation, a moment before in this transaction.
                self._bump_emit(row, f"run.{target.value}", {"status": target.value}, at)
                bumps = 1
            # Of the run row, the move changed the status (and a finished run is not paused;
            # the attempts' writes change none of it): the next call need not read it again.
            changed: dict[str, Any] = {"run_status": target.value}
            if target == RunStatus.COMPLETED:
                changed["paused"] = 0
            self._row_written(run_id, read_at, bumps, **changed)

    def interaction_tick(self, *, now: Now = None) -> list[str]:
        """Advance the active-time clocks of pending input requests on parked, unpaused, unclaimed
        runs (opening an interval where a resume left none) and return the runs whose deadline
        has passed. Time while paused is never counted: pause closes the intervals."""
        at = self._now(now)
        expired: list[str] = []
        if not self.db.in_transaction:
            # Most sweeps find no clock to advance: look first, and write only when there is one.
            with self.db.transaction(write=False):
                if not self.db.all("interaction_clocks", now=at, project_id=self.project_id):
                    return expired
        with self.db.transaction():
            for clock in self.db.all("interaction_clocks", now=at, project_id=self.project_id):
                elapsed = clock["closed_ms"]
                if clock["interval_number"] is None:
                    self.db.one("interval_open", attempt_id=clock["attempt_id"], now=at)
                else:
                    sample = max(0, at - clock["started_at"])
                    self.db.run(
                        "interval_sample",
                        attempt_id=clock["attempt_id"],
                        interval_number=clock["interval_number"],
                        elapsed_ms=sample,
                        now=at,
                    )
                    elapsed += sample
                if elapsed >= clock["timeout_ms"] and clock["run_id"] not in expired:
                    expired.append(clock["run_id"])
        return expired

    def park_until(self, *, run_id: str, claim_token: str, available_at: Now, now: Now = None) -> bool:
        """Park the run so that no runner claims it before ``available_at`` (durable sleep)."""
        at = self._args(run_id, claim_token, now)
        wake = self._now(available_at)
        with self.db.transaction():
            if self._claimed_row(run_id, claim_token, at) is None:
                return False
            if not self._release(run_id, claim_token, QueueStatus.PARKED, to_datetime(at)):
                return False
            self.db.run("queue_delay", run_id=run_id, available_at=wake, now=at)
            return True

    # -- node attempts -----------------------------------------------------------------------
    def attempt_start(
        self, *, run_id: str, claim_token: str, node_id: str, timeout_ms: int | None = None, now: Now = None
    ) -> Attempt:
        """Record that a node starts running (its attempt number counts earlier tries)."""
        at = self._args(run_id, claim_token, now)
        require_text("node_id", node_id)
        if timeout_ms is not None:
            require_count("timeout_ms", timeout_ms)
        with self.db.transaction():
            row, (attempts, cancelling) = self._held_with(
                run_id,
                claim_token,
                at,
                ("attempt_list", {"run_id": run_id}),
                ("run_cancel_requested", {"run_id": run_id}),
            )
            if cancelling:  # a cancel committed: nothing more of the run begins (store/control.py)
                raise CancelRequested(
                    f"Workflow run {run_id} is being cancelled; node {node_id} does not begin"
                )
            if any(a["status"] in ("pending", "running", "waiting") for a in attempts):
                raise Conflict(f"Workflow run {run_id} already has an active node attempt")
            attempt_id = f"attempt-{ordered_uuid(at)}"
            attempt = self.db.one(
                "attempt_insert",
                attempt_id=attempt_id,
                run_id=run_id,
                node_id=node_id,
                timeout_ms=timeout_ms,
                generation=row["generation"],
                now=at,
            )
            if attempt is None:
                raise InconsistentState(f"Node attempt {attempt_id} was not stored")
            self._bump_emit(
                row,
                "node.started",
                {"nodeId": node_id, "attemptId": attempt_id, "attempt": attempt["attempt_number"]},
                at,
            )
            return self._attempt(attempt)

    def attempt_finish(
        self,
        *,
        run_id: str,
        claim_token: str,
        attempt_id: str,
        status: str,
        output: Json = None,
        exit_name: str | None = None,
        error_message: str | None = None,
        now: Now = None,
    ) -> Attempt:
        """Settle an active attempt with its output (completed) or error (failed, timed_out...)."""
        at = self._args(run_id, claim_token, now)
        if status not in ATTEMPT_ENDINGS:
            raise InvalidInput(f"status must be one of {', '.join(ATTEMPT_ENDINGS)}")
        optional_text("exit_name", exit_name)
        if error_message is not None and not isinstance(error_message, str):
            raise InvalidInput("error_message must be a string")
        canonical_json(output)
        with self.db.transaction():
            row, (found,) = self._held_with(
                run_id, claim_token, at, ("attempt_get", {"attempt_id": attempt_id})
            )
            attempt = self._require_attempt(run_id, attempt_id, found)
            read_at = self.db.writes
            self.db.queue("interval_close_run", run_id=run_id)
            finished = self.db.one(
                "attempt_finish",
                attempt_id=attempt_id,
                run_id=run_id,
                status=status,
                output_hash=self._put_json(output, at) if status == "completed" else None,
                exit_name=exit_name,
                error_hash=None if error_message is None else self._put_text(error_message, at),
                now=at,
            )
            if finished is None:
                raise Conflict(f"Node attempt {attempt_id} is not active")
            payload: dict[str, Json] = {
                "nodeId": attempt["node_id"],
                "attemptId": attempt_id,
                "status": status,
            }
            if exit_name is not None:
                payload["exit"] = exit_name
            if error_message is not None:
                payload["error"] = error_message[:1000]
            self._bump_emit(row, f"node.{status}", payload, at)
            # The attempt's, its intervals' and blobs' writes leave the run row as read, but for
            # the entry just journaled: the next store call in this transaction (the runner
            # reads the run's status) need not read it again.
            self._row_written(run_id, read_at, 1)
            return self._attempt(finished)

    def attempt_record(
        self, *, run_id: str, claim_token: str, tries: Sequence[SettledTry], now: Now = None
    ) -> list[str]:
        """Record, in one transaction under the live claim, attempts that ran and ended in one go:
        tries of items of a fan-out node (node ids like ``fan[7]``), which run beside their
        node's own active attempt and so never hold the run's one active attempt. Each try is
        ``completed`` (with its output) or ``failed`` (with its error); it started ``ran_ms``
        before now, by the store's clock. One ``node.<status>`` journal entry per try. The new
        attempts' ids, in order. ``ClaimLost`` (nothing written) once the claim is gone: a stale
        runner records no item; ``CancelRequested`` (nothing written) once a cancel of the run
        committed."""
        at = self._args(run_id, claim_token, now)
        if isinstance(tries, SettledTry) or not all(isinstance(t, SettledTry) for t in tries):
            raise InvalidInput("tries must be a list of SettledTry")
        for tried in tries:
            require_text("node_id", tried.node_id)
            if tried.status not in ("completed", "failed", "timed_out"):
                raise InvalidInput("a settled try's status must be completed, failed or timed_out")
            require_count("ran_ms", tried.ran_ms)
            if tried.error_message is not None and not isinstance(tried.error_message, str):
                raise InvalidInput("a settled try's error_message must be a string")
            canonical_json(tried.output)
        recorded: list[str] = []
        with self.db.transaction():
            row, (cancelling,) = self._held_with(
                run_id, claim_token, at, ("run_cancel_requested", {"run_id": run_id})
            )
            if cancelling:  # a cancel committed: nothing more of the run is recorded as done
                raise CancelRequested(f"Workflow run {run_id} is being cancelled; its items are not recorded")
            for tried in tries:
                attempt_id = f"attempt-{ordered_uuid(at)}"
                self.db.expect(
                    "attempt_insert_settled",
                    f"Node attempt {attempt_id} was not stored",
                    attempt_id=attempt_id,
                    run_id=run_id,
                    node_id=tried.node_id,
                    status=tried.status,
                    output_hash=self._put_json(tried.output, at) if tried.status == "completed" else None,
                    error_hash=None
                    if tried.error_message is None
                    else self._put_text(tried.error_message, at),
                    generation=row["generation"],
                    started_at=at - tried.ran_ms,
                    now=at,
                )
                payload: dict[str, Json] = {
                    "nodeId": tried.node_id,
                    "attemptId": attempt_id,
                    "status": tried.status,
                }
                if tried.error_message is not None:
                    payload["error"] = tried.error_message[:1000]
                self._bump_emit(row, f"node.{tried.status}", payload, at)
                recorded.append(attempt_id)
        return recorded

    def attempts(self, run_id: str) -> list[Attempt]:
        """A run's node attempts in the order they started."""
        require_text("run_id", run_id, limit=1000)
        with self.db.transaction(write=False):
            return [self._attempt(r) for r in self.db.all("attempt_list", run_id=run_id)]

    def attempt_interrupt_active(self, *, run_id: str, claim_token: str, now: Now = None) -> int:
        """After a takeover: close orphaned active-time intervals and mark attempts a dead runner
        left pending or running as interrupted. How many attempts were interrupted."""
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            row = self._held(run_id, claim_token, at)
            self._close_run_time(run_id)
            count = self.db.run("attempt_interrupt_active", run_id=run_id, now=at)
            if count:
                self._bump_emit(row, "node.interrupted", {"count": count}, at)
            return count

    # -- active time -------------------------------------------------------------------------
    def interval_open(self, *, run_id: str, claim_token: str, attempt_id: str, now: Now = None) -> int:
        """Open the next active-time interval of an attempt. Raises while one is still open
        (a new runner must close a crashed one's intervals first: ``close_run_time``)."""
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            self._held(run_id, claim_token, at)
            self._require_attempt(run_id, attempt_id)
            if self.db.one("interval_open_count", attempt_id=attempt_id)["open"]:  # type: ignore[index]
                raise InconsistentState(
                    f"Node attempt {attempt_id} has an open active-time interval; close it first"
                )
            row = self.db.one("interval_open", attempt_id=attempt_id, now=at)
            assert row is not None
            return int(row["interval_number"])

    def interval_sample(
        self,
        *,
        run_id: str,
        claim_token: str,
        attempt_id: str,
        interval_number: int,
        elapsed_ms: int,
        now: Now = None,
    ) -> bool:
        """Record proven active time (a monotonic delta) of an open interval."""
        at = self._args(run_id, claim_token, now)
        require_count("interval_number", interval_number, minimum=1)
        require_count("elapsed_ms", elapsed_ms)
        with self.db.transaction():
            self._held(run_id, claim_token, at)
            self._require_attempt(run_id, attempt_id)
            return (
                self.db.run(
                    "interval_sample",
                    attempt_id=attempt_id,
                    interval_number=interval_number,
                    elapsed_ms=elapsed_ms,
                    now=at,
                )
                == 1
            )

    def interval_close(
        self, *, run_id: str, claim_token: str, attempt_id: str, interval_number: int, now: Now = None
    ) -> bool:
        """Close an interval at its last sample (time after the last sample is not counted)."""
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            self._held(run_id, claim_token, at)
            return self.db.run("interval_close", attempt_id=attempt_id, interval_number=interval_number) == 1

    def close_run_time(self, *, run_id: str, claim_token: str, now: Now = None) -> None:
        """Close every open interval of the run's attempts without sampling."""
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            self._held(run_id, claim_token, at)
            self._close_run_time(run_id)

    # -- interactive requests ----------------------------------------------------------------
    def _request(self, row: Row) -> InteractiveRequest:
        return InteractiveRequest(
            request_id=row["request_id"],
            run_id=row["run_id"],
            attempt_id=row["attempt_id"],
            target_session_id=row["target_session_id"],
            kind=row["kind"],
            revision=row["revision"],
            status=row["status"],
            payload=self._read_json(row["payload_hash"]),
            created_at=to_datetime(row["created_at"]),
        )

    def request_open(
        self, *, run_id: str, claim_token: str, attempt_id: str, kind: str, payload: Json, now: Now = None
    ) -> InteractiveRequest:
        """Ask the run's origin session for input: the attempt and the run wait. The caller parks
        the run in the same transaction (``with store.transaction(): ... store.park(...)``)."""
        at = self._args(run_id, claim_token, now)
        require_text("kind", kind)
        canonical_json(payload)
        with self.db.transaction():
            row = self._held(run_id, claim_token, at)
            if row["execution_mode"] != "interactive":
                raise InvalidInput(f"Workflow run {run_id} is headless: it has no session to ask")
            self._require_attempt(run_id, attempt_id)
            request_id = f"request-{uuid.uuid4()}"
            self.db.run(
                "request_insert",
                request_id=request_id,
                run_id=run_id,
                attempt_id=attempt_id,
                target_session_id=row["origin_session_id"],
                kind=kind,
                payload_hash=self._put_json(payload, at),
                now=at,
            )
            self.db.run(
                "attempt_set_waiting",
                run_id=run_id,
                attempt_id=attempt_id,
                now=at,
                sources=_sources(("pending", "running")),
            )
            if row["run_status"] not in (RunStatus.RUNNING, RunStatus.WAITING):
                raise IllegalTransition(
                    f"Workflow run {run_id} is {row['run_status']}: only a started run can wait for input"
                )
            self._set_run(run_id, RunStatus.WAITING, at, detail="waiting for origin-session input")
            self._bump_emit(
                row, "input.requested", {"requestId": request_id, "attemptId": attempt_id, "kind": kind}, at
            )
            found = self.db.one("request_get", request_id=request_id)
            assert found is not None
            return self._request(found)

    def requests(
        self, *, run_id: str | None = None, session_id: str | None = None, status: str | None = None
    ) -> list[InteractiveRequest]:
        """Interactive requests by run, target session and status, oldest first."""
        with self.db.transaction(write=False):
            rows = self.db.all("request_list", run_id=run_id, session_id=session_id, status=status)
            return [self._request(r) for r in rows]

    def submit(self, *, request_id: str, session_id: str, payload: Json, now: Now = None) -> Submission:
        """The origin session answers a pending request; a runner validates it next."""
        require_text("request_id", request_id, limit=1000)
        require_text("session_id", session_id)
        canonical_json(payload)
        at = self._now(now)
        with self.db.transaction():
            request = self.db.one("request_get", request_id=request_id)
            if request is None:
                raise NotFound(f"Interactive request not found: {request_id}")
            if request["target_session_id"] != session_id:
                raise Conflict(f"Interactive request {request_id} belongs to another session")
            if request["status"] != "pending":
                raise Conflict(f"Interactive request {request_id} is {request['status']}, not pending")
            self._refuse_past_deadline(request, at)
            submission_id = f"submission-{uuid.uuid4()}"
            self.db.run(
                "submission_insert",
                submission_id=submission_id,
                request_id=request_id,
                payload_hash=self._put_json(payload, at),
                now=at,
            )
            run = self._require_row(request["run_id"])
            self._bump_emit(
                run,
                "input.submitted",
                {"requestId": request_id, "submissionId": submission_id},
                at,
                actor=("session", session_id),
                generation=0,
            )
            return self._submission_by_id(submission_id)

    def _refuse_past_deadline(self, request: Row, now: int) -> None:
        """Refuse an answer to ``request`` once its attempt counted its deadline in active time
        (``now``: the store's clock, read before the request): the input's timeout policy
        applies instead (a runner's housekeeping starts it)."""
        clock = self.db.one("attempt_active_time", attempt_id=request["attempt_id"], now=now)
        if clock is None or not clock["timeout_ms"] or clock["active_ms"] < clock["timeout_ms"]:
            return
        payload = self._read_json(request["payload_hash"])
        default = payload.get("default") if isinstance(payload, dict) else None
        policy = (
            f"the default {canonical_json(default)} applies"
            if default is not None
            else "it has no default, so its node fails"
        )
        raise DeadlinePassed(
            f"Input request {request['request_id']} closed: its deadline of "
            f"{clock['timeout_ms'] / 1000:g} s of active time passed; {policy}"
        )

    def _submission(self, row: Row) -> Submission:
        return Submission(
            submission_id=row["submission_id"],
            request_id=row["request_id"],
            outcome=row["outcome"],
            payload=self._read_json(row["payload_hash"]),
            receipt=self._read_json(row["receipt_hash"]),
            created_at=to_datetime(row["created_at"]),
        )

    def _submission_by_id(self, submission_id: str) -> Submission:
        row = self.db.one("submission_get", submission_id=submission_id)
        if row is None:
            raise NotFound(f"Interactive submission not found: {submission_id}")
        return self._submission(row)

    def submissions(self, request_id: str) -> list[Submission]:
        with self.db.transaction(write=False):
            return [self._submission(r) for r in self.db.all("submission_list", request_id=request_id)]

    def runs_with_validating_submissions(self) -> list[str]:
        """Runs a runner should claim first: a session answer waits for validation. Paused runs
        are left out: a paused run makes no progress, so its answer is validated once it is
        resumed (else the run would move on and carry the pause into its next wait, whose clock
        never runs)."""
        return [r["run_id"] for r in self.db.all("run_validating_submission", project_id=self.project_id)]

    def submission_resolve(
        self,
        *,
        run_id: str,
        claim_token: str,
        submission_id: str,
        accepted: bool,
        receipt: Json = None,
        now: Now = None,
    ) -> Submission:
        """Accept (the request settles, the attempt and run run again) or reject a submission."""
        at = self._args(run_id, claim_token, now)
        canonical_json(receipt)
        with self.db.transaction():
            row = self._held(run_id, claim_token, at)
            submission = self.db.one("submission_get", submission_id=submission_id)
            request = (
                None
                if submission is None
                else self.db.one("request_get", request_id=submission["request_id"])
            )
            if submission is None or request is None or request["run_id"] != run_id:
                raise NotFound(f"Interactive submission not found: {submission_id}")
            receipt = receipt if receipt is not None else {"status": "accepted" if accepted else "rejected"}
            changed = self.db.run(
                "submission_resolve",
                submission_id=submission_id,
                outcome="accepted" if accepted else "rejected",
                receipt_hash=self._put_json(receipt, at),
                now=at,
            )
            if changed != 1:
                raise Conflict(f"Interactive submission {submission_id} was already resolved")
            if accepted:
                if (
                    self.db.run(
                        "request_set_status", request_id=request["request_id"], status="settled", now=at
                    )
                    != 1
                ):
                    raise Conflict(f"Interactive request {request['request_id']} is no longer pending")
                self._close_run_time(run_id)
                self.db.run("attempt_resume", attempt_id=request["attempt_id"], run_id=run_id, now=at)
                if row["run_status"] == RunStatus.WAITING:
                    self._set_run(run_id, RunStatus.RUNNING, at, detail=None)
            self._bump_emit(
                row,
                "input.accepted" if accepted else "input.rejected",
                {"requestId": request["request_id"], "submissionId": submission_id},
                at,
            )
            return self._submission_by_id(submission_id)

    # -- human decisions ---------------------------------------------------------------------
    def _decision(self, row: Row) -> Decision:
        return Decision(
            decision_id=row["decision_id"],
            run_id=row["run_id"],
            node_id=row["node_id"],
            request=self._read_json(row["request_hash"]),
            request_digest="sha256:" + bytes(row["request_digest"]).hex(),
            deadline_at=to_datetime(row["deadline_at"]),
            created_at=to_datetime(row["created_at"]),
            outcome=row["outcome"],
            provenance=row["provenance"],
            response=self._read_json(row["response_hash"]),
            reason=row["reason"],
            actor_id=row["actor_id"],
            resolved_at=to_datetime(row["resolved_at"]),
        )

    def decision_open(
        self,
        *,
        run_id: str,
        claim_token: str,
        node_id: str,
        request: Json,
        deadline_at: Now = None,
        now: Now = None,
    ) -> Decision:
        """Ask a person to decide; ``deadline_at`` is when the node's timeout policy applies."""
        at = self._args(run_id, claim_token, now)
        require_text("node_id", node_id)
        data = canonical_bytes(request)
        deadline = None if deadline_at is None else parse_now(deadline_at)
        with self.db.transaction():
            row = self._held(run_id, claim_token, at)
            decision_id = f"decision-{uuid.uuid4()}"
            self.db.run(
                "decision_insert",
                decision_id=decision_id,
                run_id=run_id,
                node_id=node_id,
                request_digest=sha256(data),
                request_hash=self._put_json(request, at),
                deadline_at=deadline,
                now=at,
            )
            self._bump_emit(row, "decision.requested", {"decisionId": decision_id, "nodeId": node_id}, at)
            return self.decisions(decision_id=decision_id)[0]

    def decisions(
        self,
        *,
        run_id: str | None = None,
        decision_id: str | None = None,
        open_only: bool = False,
        expired_by: Now = None,
    ) -> list[Decision]:
        """Decisions with their resolutions; ``expired_by`` keeps those whose deadline passed."""
        expired = None if expired_by is None else parse_now(expired_by)
        with self.db.transaction(write=False):
            rows = self.db.all(
                "decision_select",
                decision_id=decision_id,
                run_id=run_id,
                open_only=int(open_only),
                expired_by=expired,
                project_id=self.project_id,
            )
            return [self._decision(r) for r in rows]

    def decision_resolve(
        self,
        *,
        decision_id: str,
        outcome: str,
        provenance: str,
        response: Json = None,
        reason: str | None = None,
        channel: str | None = None,
        actor_id: str | None = None,
        now: Now = None,
    ) -> Decision | None:
        """Resolve an open decision once. None when it was already resolved."""
        require_text("decision_id", decision_id, limit=1000)
        if outcome not in ("accepted", "cancelled"):
            raise InvalidInput("outcome must be 'accepted' or 'cancelled'")
        if provenance not in PROVENANCES:
            raise InvalidInput(f"provenance must be one of {', '.join(PROVENANCES)}")
        if outcome == "accepted" and (response is None or reason is not None):
            raise InvalidInput("An accepted decision carries a response and no reason")
        if outcome == "cancelled" and (response is not None or not isinstance(reason, str) or not reason):
            raise InvalidInput("A cancelled decision carries a reason and no response")
        optional_text("channel", channel)
        optional_text("actor_id", actor_id)
        canonical_json(response)
        at = self._now(now)
        with self.db.transaction():
            found = self.decisions(decision_id=decision_id)
            if not found:
                raise NotFound(f"Decision not found: {decision_id}")
            run = self._require_row(found[0].run_id)
            if run["status"] in ("done", "failed", "cancelled") or found[0].outcome is not None:
                return None
            deadline = found[0].deadline_at
            # ``at`` was read before the decision: an answer judged in time was given in time.
            if provenance == "human" and deadline is not None and at >= parse_now(deadline):
                request = found[0].request if isinstance(found[0].request, dict) else {}
                default = request.get("default")
                policy = (
                    f"the default {canonical_json(default)} applies"
                    if default is not None
                    else "it has no default, so its node fails"
                )
                raise DeadlinePassed(
                    f"Decision {decision_id} closed at {iso(parse_now(deadline))}: its deadline "
                    f"passed; {policy}"
                )
            changed = self.db.run(
                "decision_resolve",
                decision_id=decision_id,
                outcome=outcome,
                provenance=provenance,
                response_hash=None if response is None else self._put_json(response, at),
                reason=reason,
                channel=channel,
                actor_id=actor_id,
                now=at,
            )
            if changed != 1:
                return None
            actor = ("human", actor_id) if provenance == "human" else ("policy", actor_id)
            self._bump_emit(
                run,
                "decision.resolved",
                {"decisionId": decision_id, "outcome": outcome, "provenance": provenance},
                at,
                actor=actor,
                generation=0,
            )
            return self.decisions(decision_id=decision_id)[0]

    # -- effects -----------------------------------------------------------------------------
    def _effect(self, row: Row) -> Effect:
        return Effect(
            effect_id=row["effect_id"],
            run_id=row["run_id"],
            effect_type=row["effect_type"],
            idempotency_key=row["idempotency_key"],
            payload=self._read_json(row["payload_hash"]),
            result=self._read_json(row["result_hash"]),
            status=row["status"],
            attempt_count=row["attempt_count"],
            error_message=self._read_text(row["error_hash"]),
            created_at=to_datetime(row["created_at"]),
            settled_at=to_datetime(row["settled_at"]),
        )

    def effects(self, *, run_id: str | None = None, status: str | None = None) -> list[Effect]:
        with self.db.transaction(write=False):
            rows = self.db.all("effect_list", run_id=run_id, status=status)
            return [self._effect(r) for r in rows]

    def _one_effect(self, effect_id: str) -> Row:
        row = self.db.one("effect_get", effect_id=effect_id)
        if row is None:
            raise NotFound(f"Effect not found: {effect_id}")
        return row

    def effect_enqueue(
        self,
        *,
        run_id: str,
        claim_token: str,
        effect_type: str,
        idempotency_key: str,
        payload: Json = None,
        owner_scope: str = "run",
        now: Now = None,
    ) -> Effect:
        """Record an effect as ``pending`` before anything is applied. Idempotent by key: the same
        key on the same run returns the stored effect (with any settled outcome)."""
        at = self._args(run_id, claim_token, now)
        require_text("effect_type", effect_type)
        require_text("idempotency_key", idempotency_key, limit=1000)
        require_text("owner_scope", owner_scope)
        canonical_json(payload)
        with self.db.transaction():
            row = self._held(run_id, claim_token, at)
            existing = self.db.one("effect_by_key", idempotency_key=idempotency_key)
            if existing is not None:
                if existing["run_id"] != run_id or existing["effect_type"] != effect_type:
                    raise Conflict(f"Idempotency key {idempotency_key} belongs to another effect")
                return self._effect(existing)
            effect_id = f"effect-{uuid.uuid4()}"
            resource_id = resource_id_for("effect", effect_id)
            self.db.run(
                "resource_insert", resource_id=resource_id, type="effect", key=effect_id, revision=1, now=at
            )
            self.db.run(
                "effect_insert",
                effect_id=effect_id,
                resource_id=resource_id,
                source_resource_id=row["resource_id"],
                effect_type=effect_type,
                owner_scope=owner_scope,
                idempotency_key=idempotency_key,
                payload_hash=self._put_json(payload, at),
                now=at,
            )
            self._emit(
                resource_id,
                1,
                "effect.pending",
                row["owner_type"],
                row["owner_id"],
                {"runId": run_id, "effectId": effect_id},
                at,
                row["generation"],
            )
            self._bump_emit(row, "effect.enqueued", {"effectId": effect_id, "effectType": effect_type}, at)
            return self._effect(self._one_effect(effect_id))

    def _effect_move(
        self,
        effect: Row,
        status: str,
        now: int,
        *,
        attempt_count: int | None = None,
        result: Json = None,
        error: str | None = None,
        actor: tuple[str, str | None],
        generation: int | None = None,
    ) -> None:
        changed = self.db.run(
            "effect_set_status",
            effect_id=effect["effect_id"],
            status=status,
            attempt_count=effect["attempt_count"] if attempt_count is None else attempt_count,
            result_hash=None if result is None else self._put_json(result, now),
            error_hash=None if error is None else self._put_text(error, now),
            now=now,
            old_status=effect["status"],
            old_attempt_count=effect["attempt_count"],
        )
        if changed != 1:
            raise Conflict(f"Effect {effect['effect_id']} changed underneath this call")
        self._bump_event(
            effect["resource_id"],
            f"effect.{status}",
            actor[0],
            actor[1],
            {"runId": effect["run_id"], "effectId": effect["effect_id"]},
            now,
            generation,
        )

    def effect_begin(self, *, run_id: str, claim_token: str, effect_id: str, now: Now = None) -> Effect:
        """Mark a pending effect ``applying`` (one more attempt) just before it is applied."""
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            row, (cancelling,) = self._held_with(
                run_id, claim_token, at, ("run_cancel_requested", {"run_id": run_id})
            )
            if cancelling:  # a cancel committed: no effect of the run begins (store/control.py)
                raise CancelRequested(
                    f"Workflow run {run_id} is being cancelled; effect {effect_id} does not begin"
                )
            effect = self._one_effect(effect_id)
            if effect["run_id"] != run_id:
                raise NotFound(f"Effect not found: {effect_id}")
            if effect["status"] != "pending":
                raise Conflict(f"Effect {effect_id} is {effect['status']}, not pending")
            attempt = effect["attempt_count"] + 1
            self._effect_move(
                effect,
                "applying",
                at,
                attempt_count=attempt,
                actor=(row["owner_type"], row["owner_id"]),
                generation=row["generation"],
            )
            self.db.run(
                "effect_attempt_insert",
                effect_id=effect_id,
                attempt_number=attempt,
                generation=row["generation"],
                now=at,
            )
            self._bump_emit(row, "effect.applying", {"effectId": effect_id, "attempt": attempt}, at)
            return self._effect(self._one_effect(effect_id))

    def effect_finish(
        self,
        *,
        run_id: str,
        claim_token: str,
        effect_id: str,
        applied: bool,
        result: Json = None,
        error_message: str | None = None,
        now: Now = None,
    ) -> Effect:
        """Settle an applying effect as ``applied`` (with its result) or ``rejected`` (with why)."""
        at = self._args(run_id, claim_token, now)
        canonical_json(result)
        if error_message is not None and not isinstance(error_message, str):
            raise InvalidInput("error_message must be a string")
        with self.db.transaction():
            row = self._held(run_id, claim_token, at)
            effect = self._one_effect(effect_id)
            if effect["run_id"] != run_id:
                raise NotFound(f"Effect not found: {effect_id}")
            if effect["status"] != "applying":
                raise Conflict(f"Effect {effect_id} is {effect['status']}, not applying")
            status = "applied" if applied else "rejected"
            self._effect_move(
                effect,
                status,
                at,
                result=result,
                error=error_message,
                actor=(row["owner_type"], row["owner_id"]),
                generation=row["generation"],
            )
            self.db.run(
                "effect_attempt_finish",
                effect_id=effect_id,
                attempt_number=effect["attempt_count"],
                outcome=status,
                error_hash=None if error_message is None else self._put_text(error_message, at),
                now=at,
            )
            self._bump_emit(row, f"effect.{status}", {"effectId": effect_id}, at)
            return self._effect(self._one_effect(effect_id))

    def effect_mark_ambiguous(
        self, *, run_id: str, claim_token: str, effect_id: str, now: Now = None
    ) -> Effect:
        """A runner found the effect ``applying`` after a crash: its outcome is unknown."""
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            row = self._held(run_id, claim_token, at)
            effect = self._one_effect(effect_id)
            if effect["run_id"] != run_id or effect["status"] != "applying":
                raise Conflict(f"Effect {effect_id} is not applying")
            error = "the runner stopped while the effect was applying"
            self._effect_move(
                effect,
                "ambiguous",
                at,
                error=error,
                actor=(row["owner_type"], row["owner_id"]),
                generation=row["generation"],
            )
            self.db.run(
                "effect_attempt_finish",
                effect_id=effect_id,
                attempt_number=effect["attempt_count"],
                outcome="interrupted",
                error_hash=self._put_text(error, at),
                now=at,
            )
            return self._effect(self._one_effect(effect_id))

    def effect_resolve(
        self, *, effect_id: str, outcome: str, actor_id: str = "operator", now: Now = None
    ) -> Effect:
        """An operator's decision on an ambiguous effect: ``applied`` (it happened), ``rejected``
        (it did not), or ``retry`` (back to pending, to be applied again with the same key).

        On a finished run only the effect's own journal records the decision (the run's journal
        ends at its terminal event), and ``retry`` is refused: no runner would apply it again."""
        require_text("effect_id", effect_id, limit=1000)
        require_text("actor_id", actor_id)
        if outcome not in ("applied", "rejected", "retry"):
            raise InvalidInput("outcome must be 'applied', 'rejected' or 'retry'")
        at = self._now(now)
        with self.db.transaction():
            effect = self._one_effect(effect_id)
            if effect["status"] != "ambiguous":
                raise Conflict(f"Effect {effect_id} is {effect['status']}, not ambiguous")
            run = self._require_row(effect["run_id"])
            finished = run["status"] in (QueueStatus.DONE, QueueStatus.FAILED, QueueStatus.CANCELLED)
            if finished and outcome == "retry":
                raise Conflict(
                    f"Effect {effect_id} belongs to a finished run: resolve it applied or rejected"
                )
            status = "pending" if outcome == "retry" else outcome
            self._effect_move(effect, status, at, actor=("control", actor_id))
            if finished:
                return self._effect(self._one_effect(effect_id))
            self._bump_emit(
                run,
                "effect.resolved",
                {"effectId": effect_id, "outcome": outcome},
                at,
                actor=("control", actor_id),
                generation=0,
            )
            return self._effect(self._one_effect(effect_id))

    # -- workflow messages -------------------------------------------------------------------
    def _message(self, row: Row) -> WorkflowMessage:
        return WorkflowMessage(
            message_id=row["workflow_message_id"],
            run_id=row["run_id"],
            target_session_id=row["target_session_id"],
            kind=row["kind"],
            status=row["status"],
            payload=self._read_json(row["payload_hash"]),
            created_at=to_datetime(row["created_at"]),
        )

    def message_send(
        self, *, run_id: str, claim_token: str, kind: str, payload: Json, now: Now = None
    ) -> WorkflowMessage | None:
        """Queue a message to the run's origin session; None for a headless run (no session)."""
        at = self._args(run_id, claim_token, now)
        if kind not in MESSAGE_KINDS:
            raise InvalidInput(f"kind must be one of {', '.join(MESSAGE_KINDS)}")
        canonical_json(payload)
        with self.db.transaction():
            row = self._held(run_id, claim_token, at)
            if row["execution_mode"] != "interactive":
                return None
            message_id = f"message-{ordered_uuid(at)}"
            self.db.run(
                "message_insert",
                message_id=message_id,
                run_id=run_id,
                target_session_id=row["origin_session_id"],
                kind=kind,
                payload_hash=self._put_json(payload, at),
                now=at,
            )
            self._bump_emit(row, "message.queued", {"messageId": message_id, "kind": kind}, at)
            rows = self.db.all("message_select", session_id=None, run_id=run_id, status=None)
            return self._message(next(r for r in rows if r["workflow_message_id"] == message_id))

    def messages(
        self, *, session_id: str | None = None, run_id: str | None = None, status: str | None = "pending"
    ) -> list[WorkflowMessage]:
        """Messages for a session (or of a run), oldest first; pending ones by default."""
        with self.db.transaction(write=False):
            rows = self.db.all("message_select", session_id=session_id, run_id=run_id, status=status)
            return [self._message(r) for r in rows]

    def message_ack(self, *, session_id: str, message_id: str, now: Now = None) -> bool:
        """The session received a message. False when it was not pending for that session."""
        require_text("session_id", session_id)
        require_text("message_id", message_id, limit=1000)
        at = self._now(now)
        with self.db.transaction():
            return self.db.run("message_mark_sent", message_id=message_id, session_id=session_id, now=at) == 1

    def cancel_pending_messages(
        self, *, run_id: str, kinds: Sequence[str] = ("step", "decision", "followUp"), now: Now = None
    ) -> int:
        """Cancel the run's pending messages of ``kinds``; notification/terminal ones stay."""
        require_text("run_id", run_id, limit=1000)
        for kind in kinds:
            if kind not in MESSAGE_KINDS:
                raise InvalidInput(f"kind must be one of {', '.join(MESSAGE_KINDS)}")
        at = self._now(now)
        with self.db.transaction():
            return self._cancel_pending_messages(run_id, at, kinds)

    # -- viewer projection -------------------------------------------------------------------
    def viewer_record(self, *, run_id: str, targets: Sequence[ViewerTarget | str], now: Now = None) -> int:
        """Record one viewer revision (joins the caller's transaction). The new revision."""
        require_text("run_id", run_id, limit=1000)
        checked = viewer_targets(targets)
        for target in checked:
            canonical_json(list(target.ops))
        at = self._now(now)
        with self.db.transaction():
            return self._viewer_record(run_id, checked, at)

    def viewer_changes(self, *, run_id: str, revision: int) -> ViewerChanges:
        """The deltas after ``revision``, or ``snapshot_required`` when they cannot bridge the gap."""
        require_text("run_id", run_id, limit=1000)
        if isinstance(revision, bool) or not isinstance(revision, int):
            raise InvalidInput("revision must be a whole number")
        with self.db.transaction(write=False):
            return self._viewer_changes(run_id, revision)
