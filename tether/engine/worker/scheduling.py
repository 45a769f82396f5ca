"""Scheduling: a runner writes the schedules its workflows declare, and fires the due ticks of
the schedules of the workflows it loaded (from its housekeeping sweep).

A tick is fired in one store transaction: the schedule's next tick is moved on by
compare-and-set (``Store.schedule_advance``), and only when that wrote the row is the tick's run
reserved. However many runners sweep at once, one of them moves the schedule on and reserves the
run, whose id is derived from the schedule and the tick (``tether.cron.tick_run_id``). Due
instants are judged by the store's clock; the runner's clock only times its wake-up for the next
tick (``_until_next_tick``).

A tick's input is checked against the workflow's ``input_schema`` as the workflow is loaded now
(the schema may have changed since the schedule was added). Input it refuses starts no step: the
tick's run is reserved and failed in the same transaction (``scheduleInputInvalid``, with the
schema's complaint), so the refused tick shows as the schedule's last run (``tether schedule
list``), in ``tether runs`` and in the inbox, and the runner logs a warning. The schedule stays
and fires again at its next tick.
"""

from __future__ import annotations

import logging

from tether.cron import iso, plan, tick_run_id
from tether.engine.schedules import declared_specs
from tether.engine.worker.core import RunnerCore
from tether.errors import InvalidInput, TetherError
from tether.store import ScheduleRecord
from tether.values import Json, parse_now, to_datetime

log = logging.getLogger("tether.runner")

#: The error code of a tick's run failed before any step: its input broke the workflow's schema.
INPUT_REFUSED = "scheduleInputInvalid"
#: Longest time between two looks at the schedules (their next tick aside).
SWEEP_S = 1.0


class Scheduling(RunnerCore):
    """Writes the declared schedules once, then fires due ticks on each housekeeping sweep."""

    def _fire_schedules(self) -> None:
        """Fire the due ticks of the loaded workflows' schedules (after writing the schedules
        they declare, the first time), and note when the next one is due. Looks every
        ``SWEEP_S`` (a schedule added meanwhile is seen within it), and when that next one comes."""
        if self.store.project_id is None:
            return  # a runner on the global view fires none: schedules belong to a project
        looked_at = self.clock.monotonic()
        woken = self._next_tick_at is not None and looked_at >= self._next_tick_at
        if not woken and looked_at - self._schedules_swept_at < SWEEP_S:
            return
        self._schedules_swept_at = looked_at
        # Unset until this sweep got through: a refused sweep cuts no idle wait short.
        self._next_tick_at = None
        names = self.registry.names()
        if not self._schedules_declared:
            try:
                for name in names:
                    workflow = self.registry.get(name)
                    self.store.schedules_declare(name, declared_specs(name, workflow.schedules))
                self._schedules_declared = True
            except TetherError as error:
                self._trouble("write the declared schedules", error)  # again on the next sweep
        for schedule in self.store.schedules_due(workflow_names=names):
            # One schedule the store refuses (its run's reservation, a busy database) must not
            # keep the others from firing: its transaction wrote nothing, the next sweep retries.
            try:
                self._fire(schedule)
            except TetherError as error:
                self._trouble(f"fire schedule {schedule.name}", error)
        upcoming = self.store.schedules_next_due(workflow_names=names)
        if upcoming is None:
            self._next_tick_at = None
        else:
            ahead_s = (parse_now(upcoming) - parse_now(self.store.now())) / 1000
            # A schedule still due (more than one batch, or one the store refused) is looked at
            # again by the next sweep, not in a loop that waits for nothing.
            self._next_tick_at = self.clock.monotonic() + max(self._housekeeping_every, ahead_s)

    def _fire(self, schedule: ScheduleRecord) -> None:
        """Move one due schedule on and start its tick's run, in one transaction (nothing when
        another runner moved it on first)."""
        now = parse_now(self.store.now())
        due = parse_now(schedule.next_due_at)
        fire = plan(schedule.cron, schedule.timezone, schedule.catch_up, due, now)
        workflow = self.registry.get(schedule.workflow_name)
        run_id = None if fire.tick is None else tick_run_id(schedule.name, fire.tick)
        refused: str | None = None
        tick_input = schedule.input
        try:
            tick_input = workflow.check_input(schedule.input)
        except InvalidInput as error:
            refused = f"Schedule {schedule.name} fired with input its workflow refuses: {error}"
        with self.store.transaction():
            moved = self.store.schedule_advance(
                name=schedule.name,
                expected_due=schedule.next_due_at,
                next_due=to_datetime(fire.next_due),
                tick=None if fire.tick is None else to_datetime(fire.tick),
                run_id=run_id,
            )
            if not moved or run_id is None or fire.tick is None:
                started = False
            elif self.store.get_run(run_id) is not None:
                started = False  # the tick's run exists: a reservation that committed before
            else:
                launch: Json = {
                    "schedule": {
                        "name": schedule.name,
                        "tick": iso(fire.tick),
                        "missed": [iso(t) for t in fire.missed],
                        "missed_count": fire.missed_count,
                    }
                }
                self.store.reserve(
                    run_id=run_id,
                    workflow_name=workflow.name,
                    workflow_source_ref=f"workflow:{workflow.name}",
                    workflow_source=self.registry.source(workflow.name),
                    definition_digest=workflow.digest,
                    definition_snapshot=workflow.snapshot(),
                    input=tick_input,
                    launch_options=launch,
                    origin_session_id=f"schedule:{schedule.name}",
                    execution_mode="headless",
                )
                if refused is not None:
                    self.store.fail(run_id=run_id, error_code=INPUT_REFUSED, error_message=refused)
                started = True
        fields = {"schedule": schedule.name, "workflow": workflow.name, "runner_id": self.runner_id}
        if started and refused is not None:
            log.warning(
                "schedule %s did not start run %s (tick %s): %s",
                schedule.name,
                run_id,
                iso(fire.tick or due),
                refused,
                extra={**fields, "run_id": run_id},
            )
        elif started:
            log.info(
                "schedule %s started run %s (tick %s, %d missed)",
                schedule.name,
                run_id,
                iso(fire.tick or due),
                fire.missed_count,
                extra={**fields, "run_id": run_id},
            )
        elif moved and fire.tick is None:
            log.info(
                "schedule %s skipped %d missed ticks (catch-up skip); next at %s",
                schedule.name,
                fire.missed_count,
                iso(fire.next_due),
                extra=fields,
            )

    def _until_next_tick(self, wait_s: float) -> float:
        """The idle wait cut short to the moment the next schedule of the loaded workflows is due."""
        if self._next_tick_at is None:
            return wait_s
        return max(0.0, min(wait_s, self._next_tick_at - self.clock.monotonic()))
