"""Completing steps: group commit of node completions with the next claims, node failure with
backoff, run completion."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from tether.engine.failures import story
from tether.engine.graph import Node
from tether.engine.worker.core import RunnerCore
from tether.engine.worker.deadlines import routes
from tether.engine.worker.state import ActiveRun, Completion, Parked
from tether.errors import CancelRequested, CommitUnknown, InconsistentState
from tether.store import Attempt
from tether.values import Json

log = logging.getLogger("tether.runner")


class Completing(RunnerCore):
    """Completing steps: group commit of node completions with the next claims, node failure with
    backoff, run completion."""

    def _complete_together(self, active: ActiveRun, complete: Callable[[], None]) -> bool:
        """Commit ``complete`` (the writes that complete a node of ``active``, and the run when it
        ends with that node) together with the other run threads' completions waiting at the same
        moment, and with the claim of the next runs for the slots the runs that ended free: one
        transaction and one commit for all (a group commit); the runs claimed start once it
        committed. True once committed; False, having written nothing, when the group's
        transaction failed (the caller then completes alone, which raises the error of its own
        run, if any); ``CommitUnknown`` when the group's commit outcome is.

        A thread that finds another committing a group waits for the commit lock; then, unless a
        group committed its completion meanwhile, it commits every completion that queued up.
        While one group's commit waits on the disk, the next gathers. A thread whose completion a
        group took returns once it had the lock too, so up to one group later: measured, waking
        it as soon as its own group ended drained no-op runs about 6% slower at concurrency 4."""
        mine = Completion(active, complete)
        with self._lock:
            self._completions.append(mine)
        with self._committing:
            if not mine.done:
                with self._lock:
                    group, self._completions = self._completions, []
                try:
                    self._commit_group(group)
                finally:
                    for member in group:
                        member.done = True
        if isinstance(mine.outcome, CommitUnknown):
            raise CommitUnknown(str(mine.outcome)) from mine.outcome
        return mine.outcome

    def _commit_group(self, group: list[Completion]) -> None:
        """One transaction: every completion in ``group``, then, unless the runner is stopping,
        the claim of the next runs for the slots the runs that ended free (a session answer
        waiting for validation is left to the claim loop, which takes those first). Sets each
        member's outcome. The runs claimed go to other run threads once it committed (one may
        be started while a finishing run's thread is not yet idle): measured, two threads taking
        turns drain a SQLite queue about 1.2x faster than one thread executing each next run
        itself, as one thread's statements run while the other's Python finishes up."""
        # Waits for a claim under way (the claim loop's, or a run thread's after its run): a group
        # that skipped its claim would leave its slots to one more transaction each.
        with self._claiming:
            try:
                exclude = self.active_run_ids
                asked_at = self.clock.monotonic()
                with self._claim_transaction() as followers:
                    for member in group:
                        member.complete()
                    # Checked under the lock, as run() sets it before taking the lock to count
                    # its threads.
                    if not self._stopping.is_set() and not self._validation_waits(exclude):
                        followers.extend(self._claim_batch(exclude, self._free_slots(), asked_at)[1])
            except CommitUnknown as unknown:
                for member in group:
                    member.outcome = unknown
                return
            except Exception as error:
                # Whose write failed is not known here (on PostgreSQL a completion's queued writes
                # go out with a later statement): each completes alone, which tells, and raises it.
                log.warning(
                    "runs %s: the transaction of their completion and the next claim failed (%s); "
                    "completing each alone",
                    ", ".join(member.active.run_id for member in group),
                    error,
                )
                for member in group:
                    member.active.roll_back_marks()
                return
            for member in group:
                member.outcome = True

    def _finish(self, active: ActiveRun, output: Json) -> None:
        store, run_id, token = self.store, active.run_id, active.token
        with store.transaction():
            if store.run_status(run_id) == "waiting":
                store.set_run_status(run_id=run_id, claim_token=token, status="running")
            store.set_run_status(run_id=run_id, claim_token=token, status="completed")
            if active.run.execution_mode == "interactive":
                # A headless run has no session to tell: message_send would only read the run
                # again to find that out (a round trip on PostgreSQL).
                store.message_send(
                    run_id=run_id,
                    claim_token=token,
                    kind="terminal",
                    payload={"status": "completed", "output": output},
                )
            self.ensure(store.complete(run_id=run_id, claim_token=token))

    def resume_running(self, active: ActiveRun) -> None:
        if self.store.run_status(active.run_id) == "waiting":
            self.store.set_run_status(run_id=active.run_id, claim_token=active.token, status="running")

    def fail_node(
        self,
        active: ActiveRun,
        node: Node,
        attempt: Attempt,
        error: str,
        failures: int,
        retries: int,
        backoff_s: float,
        *,
        raised: BaseException | None = None,
        status: str = "failed",
    ) -> None:
        """Finish a failed attempt: back off durably and retry (raises ``Parked``); after the last
        try, follow the node's ``error`` exit when the graph routes it (returns), else fail the
        run (raises ``Parked``). ``raised``: the
        exception, whose traceback (bounded) is kept with the attempt; ``status``: the attempt's
        ending (``timed_out`` for a step abandoned at its deadline)."""
        store, run_id, token = self.store, active.run_id, active.token
        tries = failures + 1
        took = self.clock.monotonic() - active.step_started
        self.tracing.failed(error)
        log.info(
            "run %s node %s attempt %d failed after %.3f s (%s): %s",
            run_id,
            node.id,
            tries,
            took,
            "will retry" if tries <= retries else "no retries left",
            error.splitlines()[0] if error else "",
            extra=self._fields(active, node=node.id, attempt=tries, duration_s=round(took, 6)),
        )
        workflow = active.workflow
        if tries > retries and workflow is not None and routes(workflow, attempt.node_id, "error"):
            # Its last try: the graph routes the failure to a recovery step (the error in its
            # context as ``ctx.outputs[node]["error"]``) instead of failing the run.
            store.attempt_finish(
                run_id=run_id,
                claim_token=token,
                attempt_id=attempt.attempt_id,
                status=status,
                exit_name="error",
                error_message=error if raised is None else story(raised),
            )
            log.info(
                "run %s node %s failed; following its error exit",
                run_id,
                node.id,
                extra=self._fields(active, node=node.id, attempt=tries),
            )
            return
        with store.transaction():
            store.attempt_finish(
                run_id=run_id,
                claim_token=token,
                attempt_id=attempt.attempt_id,
                status=status,
                error_message=error if raised is None else story(raised),
            )
            if tries <= retries:
                wake = self.store.now() + timedelta(seconds=backoff_s * 2 ** (tries - 1))
                self.ensure(store.park_until(run_id=run_id, claim_token=token, available_at=wake))
            else:
                self.ensure(
                    store.fail(
                        run_id=run_id,
                        claim_token=token,
                        error_code="nodeFailed",
                        error_message=f"Node {node.id} failed after {tries} attempt(s): {error}",
                    )
                )
        raise Parked(f"node {node.id} failed")

    def complete_node(self, active: ActiveRun, attempt: Attempt, output: Json, exit_name: str = "ok") -> None:
        """Finish the attempt; in the same transaction (one commit instead of two), complete the
        run when the workflow ends after it, or begin the next node when that is a compute node
        (``begin_node`` hands it out); unless the step holds a transaction of its own around this call
        (its later writes, a sleep's park for one, need the claim). Outside one, the completion
        commits with the others waiting at the same moment, and with the claim of the next runs
        for the slots they free (``_complete_together``)."""
        workflow = active.workflow
        inside = self.store.in_transaction
        ends, following = False, None
        if not inside and workflow is not None and not active.cancelled.is_set():
            target = workflow.route(attempt.node_id, exit_name)
            ends = target is None
            # A stopping runner begins nothing more: it gives the run back after this node.
            if target is not None and not self._stopping.is_set():
                following = workflow.entry(target)
                if workflow.nodes[following].kind != "compute":
                    following = None

        def complete() -> None:
            try:
                with self.store.transaction():
                    self.store.attempt_finish(
                        run_id=active.run_id,
                        claim_token=active.token,
                        attempt_id=attempt.attempt_id,
                        status="completed",
                        output=output,
                        exit_name=exit_name,
                    )
                    if ends:
                        self._finish(active, output)
                        active.completed = True
                    elif following is not None:
                        self.resume_running(active)
                        try:
                            active.begun = self.store.attempt_start(
                                run_id=active.run_id, claim_token=active.token, node_id=following
                            )
                        except CancelRequested:
                            # Refused before writing anything: the completion commits, the run
                            # thread finds the request when it begins the node itself.
                            active.begun = None
            except CommitUnknown:
                raise  # it may have landed: the run's thread resolves that
            except BaseException:
                # Nothing of it landed (on PostgreSQL a refused write can fail the commit itself,
                # after the marks were set).
                active.roll_back_marks()
                raise

        if inside or not self._complete_together(active, complete):
            complete()

    def begin_node(self, active: ActiveRun, node_id: str, timeout_ms: int | None = None) -> Attempt:
        begun, active.begun = active.begun, None
        if begun is not None:
            if begun.node_id != node_id or timeout_ms is not None:
                raise InconsistentState(f"node {begun.node_id} was begun ahead, not {node_id}")
            return begun
        with self.store.transaction():
            self.resume_running(active)
            return self.store.attempt_start(
                run_id=active.run_id, claim_token=active.token, node_id=node_id, timeout_ms=timeout_ms
            )
