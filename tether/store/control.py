"""Control operations: cancel requests, and the live workers with the workflows each has loaded.

A cancel is a store operation. A run that no live claim holds is cancelled at once; a held run is
marked ``cancel requested`` in one transaction that also journals the request (``run.cancel_
requested``, whose change notice wakes the holder). From that commit on, no node and no effect of
the run begins: ``attempt_start`` and ``effect_begin`` read the mark in their own transactions and
refuse (``CancelRequested``). The holder ends the run ``cancelled`` under its claim; should it die
first, the runner that takes the run over does.

Workers announce themselves (``worker_announce``) with the definition digests they have loaded
and renew that with their leases, so that a queued run nobody can execute says why it waits
(``live_definition_digests``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from tether.errors import Conflict, NotFound
from tether.store.runs import Now, _is_live, _json_list
from tether.store.states import QUEUE_TERMINAL, RUN_TERMINAL
from tether.store.versions import VersionOps
from tether.values import digest_bytes, require_lease_ms, require_text, to_datetime

CANCEL_REQUESTED_EVENT = "run.cancel_requested"


@dataclass(frozen=True)
class WorkerRecord:
    """A live worker process: its own id (label plus instance), label and loaded definitions."""

    worker_id: str
    label: str
    definition_digests: tuple[str, ...]
    started_at: int
    seen_at: int
    expires_at: int


class ControlOps(VersionOps):
    """Cancel requests and worker announcements."""

    # -- cancel ------------------------------------------------------------------------------
    def request_cancel(self, *, run_id: str, actor_id: str = "operator", now: Now = None) -> str:
        """Cancel the run: ``"cancelled"`` when no live claim held it (it is cancelled now), else
        ``"requested"``: the request is committed, nothing more of the run begins, and its holder
        ends it. ``Conflict`` for a finished run (nothing is written)."""
        require_text("run_id", run_id, limit=1000)
        require_text("actor_id", actor_id)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if row is None:
                raise NotFound(f"Workflow run not found: {run_id}")
            if row["status"] in QUEUE_TERMINAL or row["run_status"] in RUN_TERMINAL:
                raise Conflict(f"Workflow run {run_id} is already {row['status']}")
            if not _is_live(row, at):
                if self.cancel(run_id=run_id, now=now):
                    return "cancelled"
                raise Conflict(f"Workflow run {run_id} cannot be cancelled now; try again")
            if self.db.run("run_cancel_request", run_id=run_id, now=at) == 1:
                self._bump_emit(row, CANCEL_REQUESTED_EVENT, {"by": actor_id}, at, actor=("human", actor_id))
            return "requested"

    def cancel_requested(self, run_id: str) -> bool:
        """Whether the run's cancel was requested (and it is not finished)."""
        return bool(self.cancel_requests([run_id]))

    def cancel_requests(self, run_ids: Sequence[str]) -> list[str]:
        """The runs of ``run_ids`` whose cancel was requested and that are not finished."""
        if not run_ids:
            return []
        return [r["run_id"] for r in self.db.all("runs_cancel_requested", run_ids=_json_list(run_ids))]

    def due_at(self, run_ids: Sequence[str]) -> dict[str, datetime]:
        """When each run of ``run_ids`` that waits for a worker may be taken next (a queued run's
        start, a parked run's retry or wake-up), by run id. Runs held by a runner, finished, or
        waiting for a person or an operator are left out."""
        if not run_ids:
            return {}
        rows = self.db.all("runs_due_at", run_ids=_json_list(run_ids))
        return {r["run_id"]: to_datetime(int(r["available_at"])) for r in rows}

    def work_coming(self, *, definition_digests: Sequence[str]) -> bool:
        """Whether a run of these definitions waits in the queue now or for a timer (a durable
        sleep, a retry's backoff): what a runner with them would execute sooner or later without
        anyone's help. Runs waiting for a person, paused, or parked for an operator do not count."""
        digests = [digest_bytes(digest).hex() for digest in definition_digests]
        if not digests:
            return False
        found = self.db.one("run_coming_due", project_id=self.project_id, digests=_json_list(digests))
        return found is not None

    # -- workers -----------------------------------------------------------------------------
    def worker_announce(
        self,
        *,
        worker_id: str,
        label: str,
        definition_digests: Sequence[str],
        lease_ms: int,
        now: Now = None,
    ) -> None:
        """Announce (or renew) a live worker and the definitions it can execute, for ``lease_ms``."""
        require_text("worker_id", worker_id)
        require_text("label", label)
        require_lease_ms(lease_ms)
        digests = sorted({"sha256:" + digest_bytes(d).hex() for d in definition_digests})
        at = self._now(now)
        with self.db.transaction():
            self.db.run("workers_expired_delete", before=at - 10 * lease_ms)
            self.db.run(
                "worker_upsert",
                worker_id=worker_id,
                label=label,
                project_id=self.project_id,
                workflows=json.dumps(digests),
                now=at,
                expires_at=at + lease_ms,
            )

    def worker_retire(self, *, worker_id: str) -> None:
        """Forget a worker that stops."""
        require_text("worker_id", worker_id)
        with self.db.transaction():
            self.db.run("worker_delete", worker_id=worker_id)

    def live_workers(self, *, now: Now = None) -> list[WorkerRecord]:
        """The workers whose announcement has not lapsed (of this project, or all)."""
        rows = self.db.all("workers_live", now=self._now(now), project_id=self.project_id)
        return [
            WorkerRecord(
                r["worker_id"],
                r["label"],
                tuple(json.loads(r["workflows"])),
                int(r["started_at"]),
                int(r["seen_at"]),
                int(r["expires_at"]),
            )
            for r in rows
        ]

    def live_definition_digests(self, *, now: Now = None) -> set[str]:
        """Every definition digest some live worker can execute."""
        return {digest for worker in self.live_workers(now=now) for digest in worker.definition_digests}
