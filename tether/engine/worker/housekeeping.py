"""Housekeeping: run deadlines, decision defaults, input deadlines and resumes refused while a
session slot was taken."""

from __future__ import annotations

import logging
import uuid

from tether.engine.worker.core import RunnerCore
from tether.engine.worker.deadlines import run_timed_out_message

log = logging.getLogger("tether.runner")


class Housekeeping(RunnerCore):
    """Housekeeping: run deadlines, decision defaults, input deadlines and resumes refused while a
    session slot was taken."""

    def _housekeeping(self) -> None:
        """End the runs no runner holds whose deadline passed; apply decision defaults and input
        deadlines that expired; resume answered runs whose resume was refused while their
        session's active slot was taken; resume runs whose event came or whose event deadline
        passed; fire due schedule ticks."""
        self._time_out_runs()
        self._fire_schedules()
        for run_id in self.store.runs_awaiting_resume():
            self.store.request_resume(run_id=run_id)
        # Runs waiting for an event that came (their resume at send was refused) or whose
        # deadline passed: their wait_for_event node takes the event or times out.
        for run_id in self.store.event_waits_ready():
            self.store.request_resume(run_id=run_id)
        for decision in self.store.decisions(open_only=True, expired_by=self.store.now()):
            request = decision.request if isinstance(decision.request, dict) else {}
            default = request.get("default")
            if default is not None:
                self.store.decision_resolve(
                    decision_id=decision.decision_id,
                    outcome="accepted",
                    provenance="timeout_policy",
                    response=default,
                    actor_id=self.runner_id,
                )
            else:
                self.store.decision_resolve(
                    decision_id=decision.decision_id,
                    outcome="cancelled",
                    provenance="expired_no_default",
                    reason="The decision deadline passed without a default",
                    actor_id=self.runner_id,
                )
            self.store.request_resume(run_id=decision.run_id)
        for run_id in self.store.interaction_tick():
            # Under the claiming lock, as claims for free slots are: a run thread that finishes a
            # run must not fill the slot counted free here.
            with self._claiming:
                if self._free_slots() <= 0:
                    return  # no free slot: the next sweep returns the runs still due
                if run_id not in self.active_run_ids and self._executable(run_id):
                    self._time_out_interaction(run_id)

    def _time_out_interaction(self, run_id: str) -> None:
        """Claim a parked run whose input deadline passed and start its timeout (or park it again
        when its session's active slot is taken)."""
        token = str(uuid.uuid4())
        claimed_at = self.clock.monotonic()
        record = self.store.claim_for_control(
            run_id=run_id, runner_id=self.runner_id, claim_token=token, lease_ms=self.config.lease_ms
        )
        if record is None:
            return
        session = record.origin_session_id or ""
        if self.store.begin_interaction_timeout(run_id=run_id, target_session_id=session, claim_token=token):
            self._start(record, token, claimed_at)
        else:
            self.store.park(run_id=run_id, claim_token=token)

    def _time_out_runs(self) -> None:
        """End ``timed_out`` the runs of the loaded workflows with a run deadline that passed and
        that no live claim holds: a run waiting for a person, parked, queued, or left by a dead
        runner. (A run this runner or another live one holds is its holder's to end: the store
        refuses the move under a live claim.)"""
        for name in self.registry.names():
            workflow = self.registry.get(name)
            if workflow.timeout_s is None:
                continue
            held = set(self.active_run_ids)
            for run_id in self.store.runs_past_deadline(
                definition_digest=workflow.digest, timeout_ms=int(workflow.timeout_s * 1000)
            ):
                if run_id in held:
                    continue
                if self.store.time_out(
                    run_id=run_id,
                    error_message=run_timed_out_message(run_id, workflow.timeout_s),
                ):
                    log.info("run %s timed out", run_id, extra={"run_id": run_id, "workflow": name})
