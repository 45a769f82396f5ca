"""The runner's own records of the runs it holds, the signals between its parts, and its pacing
constants."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tether.engine.graph import Workflow
from tether.errors import CommitUnknown
from tether.store import Attempt, RunRecord


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill a command started in a session of its own, and every process in its group."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()


class Tally:
    """What a runner did, counted since it started (runs claimed, takeovers, refused writes):
    read by ``tether worker --metrics-port`` and by tests. Counting is an addition under a lock."""

    #: The counts kept, with what each means.
    NAMES: ClassVar[dict[str, str]] = {
        "runs_claimed": "Runs this worker claimed (new runs and takeovers)",
        "takeovers": "Runs this worker took over from a runner that had stopped mid-step",
        "stale_writes_refused": "Writes the store refused because this worker's claim was no longer live",
        "leases_lost": "Leases this worker could not renew (another runner or a cancel holds the run)",
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.NAMES, 0)

    def add(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class Parked(Exception):
    """The run was released (waiting, sleeping, backing off, handed off, failed or done)."""


#: The most new runs one claim transaction takes and takes up for a runner's free slots (the
#: takeovers it claims beside them are not counted: their own threads take them up).
CLAIM_BATCH = 16
#: Housekeeping (decision defaults, input deadlines, the resume sweep) runs every poll interval,
#: but at least this far apart: a runner polling every few milliseconds for new runs need not
#: sweep timers that often, and each sweep costs a write transaction.
HOUSEKEEPING_MIN_S = 0.1
#: A runner waiting for another runner's lease to lapse wakes this long after it: the store's
#: clock counts whole milliseconds, and a wait may end a little early.
LAPSE_MARGIN_MS = 2
#: An idle wait this short ends soon enough by itself: asking the store when the next lease lapses
#: (a query over the held leases) would cost more than the wait it could cut short.
LAPSE_ASKED_PAST_S = 0.025


class TakeUpFailed(Exception):
    """A run claimed in a batch could not be taken up (unexpectedly: a bug or a broken workflow);
    the batch rolls back."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


class Abandoned(BaseException):
    """Raised out of ``Runner.run()`` by a second stop signal, once every held run was handed
    back (``tether worker`` exits 130)."""


@dataclass
class ActiveRun:
    run: RunRecord
    token: str
    deadline: float
    lost: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)
    process: subprocess.Popen[bytes] | None = None
    #: The futures of the coroutines the run's async steps run on the runner's event loop (one,
    #: or one per call of a fan-out running at once): cancelling one cancels its coroutine's task
    #: (see ``_cancel_coroutine``).
    coroutines: set[concurrent.futures.Future[Any]] = field(default_factory=set)
    #: Set once the run's fate is written (cancelled, handed back) or its claim is lost: an async
    #: step's coroutine, running or about to, is cancelled.
    coroutine_cancelled: threading.Event = field(default_factory=threading.Event)
    #: The run's workflow, once loaded and checked against the reserved definition.
    workflow: Workflow | None = None
    #: When the run's deadline (``Workflow(timeout_s=)``) passes, on the runner's clock.
    run_deadline: float | None = None
    #: The node this run's thread executes now (for the stop message).
    step: str | None = None
    #: When that node's step began (on the runner's clock), for the duration its log lines give.
    step_started: float = 0.0
    #: Whether the claim's own transaction already took the run up (see ``_take_up``).
    taken_up: bool = False
    #: Whether the run was completed (with its last node, see ``complete_node``).
    completed: bool = False
    #: The next node's attempt, when a transaction that came before it began it: the take-up of
    #: a run never claimed before (its first node), or the completion of the node before it
    #: (``begin_node`` hands it out instead of starting another).
    begun: Attempt | None = None
    #: The run's attempts, when the transaction that began ``begun`` knew them all (a run never
    #: claimed before has that one only); else the next step reads them.
    attempts: list[Attempt] | None = None

    def roll_back_marks(self) -> None:
        """The transaction that completed a node rolled back: the run is neither completed nor its
        next node begun."""
        self.completed, self.begun = False, None

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def provably_live(self, margin_ms: int, now: float) -> bool:
        return not self.lost.is_set() and now + margin_ms / 1000 < self.deadline


@dataclass
class Completion:
    """A node's completing writes, waiting to commit with a group (``Runner._complete_together``)."""

    active: ActiveRun
    complete: Callable[[], None]
    #: Whether a group took it and ended (written and read under the commit lock).
    done: bool = False
    #: Once done: True when committed with the group, False when the group wrote nothing, the
    #: group's ``CommitUnknown`` when its commit outcome is unknown.
    outcome: bool | CommitUnknown = False
