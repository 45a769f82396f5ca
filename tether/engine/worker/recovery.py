"""Taking a run up: settling what an earlier (possibly dead) holder left; handing runs back."""

from __future__ import annotations

import logging

from tether.engine.worker.core import RunnerCore
from tether.engine.worker.deadlines import run_timed_out_message
from tether.engine.worker.state import ActiveRun
from tether.errors import NotFound, TetherError
from tether.store import Attempt

log = logging.getLogger("tether.runner")


class Recovery(RunnerCore):
    """Taking a run up: settling what an earlier (possibly dead) holder left; handing runs back."""

    def _take_up(self, active: ActiveRun) -> bool:
        """Settle what an earlier holder left and mark the run running; False when that ended or
        parked the run instead (nothing left to execute). Joins the caller's transaction.

        A run claimed for the first time (lease generation 1) had no earlier holder, so it has no
        attempts to interrupt, effects or cancel requests to settle; the first node of a run that
        is no restart, when a compute node, is begun here too (one commit for the claim, the
        take-up and the node's start)."""
        run_id, token = active.run_id, active.token
        store = self.store
        fresh = active.run.claim_generation == 1
        # A cancel requested while another claim held the run (a runner that died or let go before
        # it acted on the request) is still owed.
        if not fresh and store.cancel_requested(run_id):
            active.cancelled.set()
            store.cancel(run_id=run_id, claim_token=token)
            return False
        # An effect a dead runner left applying may have happened: classify it before anything else
        # (a run failed below keeps that signal).
        for applying in [] if fresh else store.effects(run_id=run_id, status="applying"):
            store.effect_mark_ambiguous(run_id=run_id, claim_token=token, effect_id=applying.effect_id)
        try:
            workflow = self.registry.get(active.run.workflow_name)
        except NotFound:
            # Claimed past the definition filter (to validate an answer, to time an input out):
            # left for a worker that has the workflow.
            self.ensure(store.park(run_id=run_id, claim_token=token))
            return False
        # A workflow's identity is its definition (see docs/cancellation-and-versioning.md): not
        # the path its file was loaded through, nor the file's comments.
        if workflow.digest != active.run.definition_digest:
            detail = (
                f"Workflow {workflow.name} changed since the run was reserved "
                f"(reserved {active.run.definition_digest}, now {workflow.digest}); "
                "resume it on the new definition (tether resume RUN --accept-changes), "
                "restart it or cancel it"
            )
            self.ensure(store.park_for_source_change(run_id=run_id, claim_token=token, detail=detail))
            return False
        active.workflow = workflow
        if workflow.timeout_s is not None:
            # The run's deadline counts on the store's clock from its start; the runner waits on
            # its own clock, so it keeps how much of it is left.
            left = (active.run.created_at - store.now()).total_seconds() + workflow.timeout_s
            active.run_deadline = self.clock.monotonic() + left
            if left <= 0:
                # Past it already (held by a runner that died, say): nothing more of it runs.
                self.ensure(
                    store.time_out(
                        run_id=run_id,
                        claim_token=token,
                        error_message=run_timed_out_message(run_id, workflow.timeout_s),
                    )
                )
                return False
        # Interrupt what a dead runner left running (and fail a run that keeps killing its
        # runners), then mark the run running.
        if not fresh and store.attempt_interrupt_active(run_id=run_id, claim_token=token):
            self.tally.add("takeovers")
            log.info(
                "run %s taken over: its runner stopped while running node %s",
                run_id,
                self._last_node(store.attempts(run_id)),
                extra=self._fields(active),
            )
            takeovers = sum(
                1
                for e in store.events_after(0, run_id=run_id, event_type="node.interrupted", limit=100_000)
                # Takeovers only: a graceful stop's interrupted attempt is not a runner dying.
                if isinstance(e.payload, dict) and "count" in e.payload
            )
            if takeovers >= self.config.max_takeovers:
                node = self._last_node(store.attempts(run_id))
                self.ensure(
                    store.fail(
                        run_id=run_id,
                        claim_token=token,
                        error_code="poisonRun",
                        error_message=(
                            f"Workflow run {run_id} failed: its runner stopped {takeovers} times "
                            "while running "
                            f"node {node} (limit {self.config.max_takeovers})"
                        ),
                    )
                )
                return False
        # The durable status as the claim read it: under the claim only its holder changes it.
        queued = not active.run.initialized
        if not fresh and store.effects(run_id=run_id, status="ambiguous"):
            if queued:
                store.set_run_status(run_id=run_id, claim_token=token, status="running")
            self.ensure(store.park_for_ambiguous_effect(run_id=run_id, claim_token=token))
            return False
        store.mark_running(run_id=run_id, claim_token=token)
        if queued:
            store.set_run_status(run_id=run_id, claim_token=token, status="running")
        first = workflow.entry(workflow.start)
        # Not for a restart: a fork (tether.store.forks) starts with the attempts it took over
        # from its parent, so its first node is where the cursor over them leads.
        if fresh and active.run.parent_run_id is None and workflow.nodes[first].kind == "compute":
            active.begun = store.attempt_start(run_id=run_id, claim_token=token, node_id=first)
            active.attempts = [active.begun]
        return True

    def _hand_back(self, active: ActiveRun) -> None:
        """Mark the unfinished attempt interrupted and give the run back (``_give_back``) while the
        claim still holds."""
        store, run_id, token = self.store, active.run_id, active.token
        try:
            with store.transaction():
                for attempt in store.attempts(run_id):
                    if attempt.status in ("pending", "running"):
                        store.attempt_finish(
                            run_id=run_id,
                            claim_token=token,
                            attempt_id=attempt.attempt_id,
                            status="interrupted",
                            error_message="handed back by its runner",
                        )
                self._give_back(active)
            log.info("run %s handed back", run_id, extra=self._fields(active, node=active.step))
        except TetherError as error:
            log.warning("run %s could not be handed back (%s); its lease will lapse", run_id, error)

    def _give_back(self, active: ActiveRun) -> None:
        """Park the run for another runner (inside the caller's transaction). A run whose durable
        status is still waiting though nothing holds it any more (a resume put it in the queue
        and this runner gives it back before a step moved it on) goes back to the queue: parked
        and waiting, it would look like a run waiting on a person, and no runner would claim it."""
        store = self.store
        self.ensure(store.park(run_id=active.run_id, claim_token=active.token))
        if store.run_status(active.run_id) == "waiting":
            store.request_resume(run_id=active.run_id)  # refused while a person is still awaited

    def _release_after_error(self, active: ActiveRun, error: BaseException) -> None:
        detail = (
            f"Workflow runner failed before it committed workflow progress: {type(error).__name__}: {error}"
        )
        try:
            if not self.store.park_for_no_progress(
                run_id=active.run_id, claim_token=active.token, detail=detail
            ):
                self.ensure(self.store.park(run_id=active.run_id, claim_token=active.token))
        except TetherError:
            log.exception("run %s could not be parked", active.run_id)

    @staticmethod
    def _last_node(attempts: list[Attempt]) -> str:
        return attempts[-1].node_id if attempts else "(none)"
