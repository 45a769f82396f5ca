"""Events sent into a run (``Tether.send_event``) and the runs waiting for them.

An event is kept in the run's inbox (``run_inbox``) from the moment it is sent, whether or not
the run has reached a ``wait_for_event`` node yet. A node waiting for an event of that name takes
the oldest one not taken, in the transaction that completes its attempt under the run's claim:
each event is taken once. A run that reaches the node before the event is parked waiting
(``run_event_waits`` says for which name, until when); sending the event puts it back in the
queue in the same transaction, and housekeeping does so for a run whose time is up (or whose
resume was refused: its session's slot was taken), so the node leaves by its ``timeout`` exit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime

from tether.errors import Conflict, InvalidInput, NotFound
from tether.store.db import Row
from tether.store.runs import Now
from tether.store.states import QUEUE_TERMINAL, RUN_TERMINAL
from tether.store.work import WorkOps
from tether.values import Json, canonical_json, ordered_uuid, require_text, to_datetime

EVENT_SENT = "run.event_sent"


@dataclass(frozen=True)
class InboxEvent:
    """An event sent into a run: its name and payload, who sent it and when, and the attempt
    that took it (None while it waits to be taken)."""

    event_id: str
    run_id: str
    name: str
    payload: Json
    sent_by: str
    sent_at: datetime
    taken_at: datetime | None
    taken_by_attempt_id: str | None


@dataclass(frozen=True)
class EventWait:
    """A run parked at a wait_for_event node: the event name and the deadline (None: none)."""

    run_id: str
    attempt_id: str
    name: str
    deadline_at: datetime | None


def _event(row: Row) -> InboxEvent:
    taken = row["taken_at"]
    return InboxEvent(
        event_id=row["event_id"],
        run_id=row["run_id"],
        name=row["name"],
        payload=json.loads(row["payload_json"]),
        sent_by=row["sent_by"],
        sent_at=to_datetime(int(row["sent_at"])),
        taken_at=None if taken is None else to_datetime(int(taken)),
        taken_by_attempt_id=row["taken_by_attempt_id"],
    )


def check_event_name(name: object) -> str:
    """An event name: text of at most 200 characters."""
    return require_text("event name", name)


class RunEventOps(WorkOps):
    """The run inbox and the runs waiting for an event."""

    def run_definition_snapshot(self, run_id: str) -> Json:
        """The definition snapshot the run executes (``NotFound`` for an unknown run)."""
        require_text("run_id", run_id, limit=1000)
        row = self._row(run_id)
        if row is None:
            raise NotFound(f"Workflow run not found: {run_id}")
        return self._read_json(row["definition_hash"])

    def event_send(
        self, *, run_id: str, name: str, payload: Json, sent_by: str = "operator", now: Now = None
    ) -> InboxEvent:
        """Keep an event for the run, and when the run is parked waiting for an event of that
        name, put it back in the queue, in one transaction. ``NotFound`` for an unknown run,
        ``Conflict`` for a finished one (nothing is written). The payload's schema is the
        caller's check (``Tether.send_event``)."""
        require_text("run_id", run_id, limit=1000)
        check_event_name(name)
        require_text("sent_by", sent_by)
        payload_json = canonical_json(payload)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if row is None:
                raise NotFound(f"Workflow run not found: {run_id}")
            if row["status"] in QUEUE_TERMINAL or row["run_status"] in RUN_TERMINAL:
                raise Conflict(f"Workflow run {run_id} is already {row['status']}: it takes no more events")
            event_id = f"event-{ordered_uuid(at)}"
            self.db.run(
                "inbox_insert",
                event_id=event_id,
                run_id=run_id,
                name=name,
                payload_json=payload_json,
                sent_by=sent_by,
                now=at,
            )
            self._bump_emit(
                row, EVENT_SENT, {"eventId": event_id, "name": name}, at, actor=("human", sent_by)
            )
            wait = self.db.one("event_wait_get", run_id=run_id)
            if wait is not None and wait["name"] == name:
                # Refused while a claim holds the run or its session's slot is taken: the
                # housekeeping sweep puts it back later (``event_waits_ready``).
                self.request_resume(run_id=run_id, now=to_datetime(at))
            return next(e for e in self.inbox(run_id) if e.event_id == event_id)

    def inbox(self, run_id: str) -> list[InboxEvent]:
        """Every event sent into the run, oldest first (taken or not)."""
        require_text("run_id", run_id, limit=1000)
        return [_event(row) for row in self.db.all("inbox_of_run", run_id=run_id)]

    def event_take(
        self, *, run_id: str, claim_token: str, attempt_id: str, name: str, now: Now = None
    ) -> InboxEvent | None:
        """Under the run's live claim, take the oldest event of that name not taken yet for the
        attempt (None: none waits). Call it in the transaction that completes the attempt."""
        check_event_name(name)
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            self._held(run_id, claim_token, at)
            row = self.db.one("inbox_next", run_id=run_id, name=name)
            if row is None:
                return None
            if self.db.run("inbox_take", event_id=row["event_id"], attempt_id=attempt_id, now=at) != 1:
                return None
            return replace(_event(row), taken_at=to_datetime(at), taken_by_attempt_id=attempt_id)

    def event_wait_open(
        self,
        *,
        run_id: str,
        claim_token: str,
        attempt_id: str,
        name: str,
        deadline_at: datetime | None,
        now: Now = None,
    ) -> None:
        """Under the run's live claim, record that it waits at the attempt for an event of that
        name until ``deadline_at`` (None: no deadline)."""
        check_event_name(name)
        if deadline_at is not None and not isinstance(deadline_at, datetime):
            raise InvalidInput("deadline_at must be a datetime or None")
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            self._held(run_id, claim_token, at)
            self.db.run(
                "event_wait_set",
                run_id=run_id,
                attempt_id=attempt_id,
                name=name,
                deadline_at=None if deadline_at is None else self._now(deadline_at),
                now=at,
            )

    def event_wait_close(self, *, run_id: str, claim_token: str, now: Now = None) -> None:
        """Under the run's live claim, forget what it waited for (its node is done waiting)."""
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            self._held(run_id, claim_token, at)
            self.db.run("event_wait_delete", run_id=run_id)

    def event_wait(self, run_id: str) -> EventWait | None:
        """What the run waits for, if it is parked waiting for an event."""
        row = self.db.one("event_wait_get", run_id=run_id)
        if row is None:
            return None
        deadline = row["deadline_at"]
        return EventWait(
            row["run_id"],
            row["attempt_id"],
            row["name"],
            None if deadline is None else to_datetime(int(deadline)),
        )

    def event_waits_ready(self, *, now: Now = None) -> list[str]:
        """Runs parked waiting for an event that came, or whose deadline passed (the store's
        clock): what housekeeping puts back in the queue."""
        rows = self.db.all("event_waits_ready", project_id=self.project_id, now=self._now(now))
        return [str(r["run_id"]) for r in rows]
