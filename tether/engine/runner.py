"""The runner: claims runs, renews their leases, executes their nodes, and hands them off.

Every node outcome is committed in one store transaction that re-checks the live claim, so a
runner whose lease was taken over can never write. The durable state of a run is its attempts:
the next node is the route out of the last completed attempt, so a new runner continues from the
last committed node after a crash (an interrupted attempt simply runs again).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any

from tether.engine.cancels import CancelWatcher, StepCancelled
from tether.engine.failures import story, summary
from tether.engine.graph import Exit, Node, Workflow
from tether.engine.registry import Registry
from tether.engine.schema import errors as schema_errors
from tether.errors import (
    CancelRequested,
    ClaimLost,
    CommitUnknown,
    InconsistentState,
    InvalidInput,
    LeaseUnproven,
    NotFound,
    StoreBusy,
    StoreUnavailable,
    TetherError,
)
from tether.store import Attempt, RunRecord, Store
from tether.values import Json, canonical_json, require_lease_ms

log = logging.getLogger("tether.runner")


@dataclass(frozen=True)
class RunnerConfig:
    """How a runner paces itself. Times in milliseconds unless the name says otherwise."""

    lease_ms: int = 30_000
    #: Renew every active lease this often (well inside the lease).
    renew_ms: int | None = None
    #: Longest idle wait between claim attempts; the runner polls faster after finding work.
    poll_ms: int = 1000
    #: Runs executed in parallel.
    concurrency: int = 4
    #: A run whose runner died this many times while running it fails as a poison run.
    max_takeovers: int = 3
    #: An effect is applied only while the lease is provably live for at least this long.
    effect_margin_ms: int | None = None

    def __post_init__(self) -> None:
        for name in ("lease_ms", "poll_ms", "concurrency", "max_takeovers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput(f"RunnerConfig.{name} must be a whole number of at least 1")
        require_lease_ms(self.lease_ms)
        if self.renew_interval_ms * 2 > self.lease_ms:
            raise InvalidInput(
                "RunnerConfig.renew_ms must be at most half of lease_ms (renew well inside the lease)"
            )
        if self.effect_guard_ms < 0 or self.effect_guard_ms + self.renew_interval_ms >= self.lease_ms:
            raise InvalidInput(
                "RunnerConfig.effect_margin_ms plus the renew interval must stay below lease_ms, "
                "or no effect could ever be applied"
            )

    @property
    def renew_interval_ms(self) -> int:
        return self.renew_ms or max(1, self.lease_ms // 3)

    @property
    def effect_guard_ms(self) -> int:
        return self.effect_margin_ms if self.effect_margin_ms is not None else self.lease_ms // 3


@dataclass(frozen=True)
class Context:
    """What a node function sees. A long step should look at ``cancelled`` (or call
    ``raise_if_cancelled()``) now and then: once its run is cancelled, its result is not recorded
    and the sooner it returns, the sooner its worker's slot is free."""

    run_id: str
    node_id: str
    input: Json
    outputs: Mapping[str, Json]
    attempt: int
    origin_session_id: str | None
    cancel_signal: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """Whether the run is being cancelled (the step's result will not be recorded)."""
        return self.cancel_signal.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise ``StepCancelled`` when the run is being cancelled."""
        if self.cancel_signal.is_set():
            raise StepCancelled(f"workflow run {self.run_id} is being cancelled")


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill a command started in a session of its own, and every process in its group."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()


class _Parked(Exception):
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


class _TakeUpFailed(Exception):
    """A run claimed in a batch could not be taken up (unexpectedly: a bug or a broken workflow);
    the batch rolls back."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


class Abandoned(BaseException):
    """Raised out of ``Runner.run()`` by a second stop signal, once every held run was handed
    back (``tether worker`` exits 130)."""


@dataclass
class _Active:
    run: RunRecord
    token: str
    deadline: float
    lost: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)
    process: subprocess.Popen[bytes] | None = None
    #: The run's workflow, once loaded and checked against the reserved definition.
    workflow: Workflow | None = None
    #: The node this run's thread executes now (for the stop message).
    step: str | None = None
    #: Whether the claim's own transaction already took the run up (see ``_take_up``).
    taken_up: bool = False
    #: Whether the run was completed (with its last node, see ``_complete_node``).
    completed: bool = False
    #: The next node's attempt, when a transaction that came before it began it: the take-up of
    #: a run never claimed before (its first node), or the completion of the node before it
    #: (``_begin`` hands it out instead of starting another).
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

    def provably_live(self, margin_ms: int) -> bool:
        return not self.lost.is_set() and time.monotonic() + margin_ms / 1000 < self.deadline


@dataclass
class _Completion:
    """A node's completing writes, waiting to commit with a group (``Runner._complete_together``)."""

    active: _Active
    complete: Callable[[], None]
    #: Whether a group took it and ended (written and read under the commit lock).
    done: bool = False
    #: Once done: True when committed with the group, False when the group wrote nothing, the
    #: group's ``CommitUnknown`` when its commit outcome is unknown.
    outcome: bool | CommitUnknown = False


class Runner:
    """A worker that drains the store's queue. ``run()`` blocks until ``stop()`` (or a signal)."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        runner_id: str | None = None,
        config: RunnerConfig | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        #: The name an operator gave (``--runner-id``): a label that several processes may share.
        self.label = runner_id or f"host-{socket.gethostname()}"
        #: This runner's own identity, the label and an instance id: claims fence by it, so two
        #: processes started with one label never take each other's live runs as their own.
        self.runner_id = f"{self.label}#{uuid.uuid4().hex[:12]}"
        self.config = config or RunnerConfig()
        self._active: dict[str, _Active] = {}
        #: The threads that execute runs: started as runs need them, at most twice the
        #: concurrency (the runs claimed with a group of completions may be launched before the
        #: completing runs' threads are idle), kept for the next run, ended by a ``None`` each
        #: when the runner stops.
        self._threads: list[threading.Thread] = []
        self._runs: queue.SimpleQueue[_Active | None] = queue.SimpleQueue()
        #: Threads on their way to take the next run handed out, less the runs handed out that
        #: no thread was free for (below 0 while runs wait for a thread to come back).
        self._idle_threads = 0
        #: Runs handed to run threads and not yet let go with the claim attempt that follows them
        #: (a run thread claims the next run itself): while above 0, the runner is not idle.
        self._busy = 0
        self._claiming = threading.Lock()
        #: Completions waiting for the next group commit (see ``_complete_together``), and the lock
        #: that one group's commit holds.
        self._completions: list[_Completion] = []
        self._committing = threading.Lock()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        #: Set by a second stop signal: ``run()`` stops waiting for running steps and hands every
        #: held run back at once.
        self._abandoning = threading.Event()
        self._wake = threading.Event()
        self._housekeeping_every = min(1.0, max(HOUSEKEEPING_MIN_S, self.config.poll_ms / 1000))
        #: When a group commit last asked whether a session answer waits for validation.
        self._validations_asked_at = 0.0
        #: Whether the last claim for free slots found no run to claim (the claim loop listens
        #: for notices only then; written under ``_claiming``).
        self._found_none = False
        #: Hears cancel requests for the runs held (while ``run()`` runs).
        self._cancels: CancelWatcher | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; running nodes finish (commands are interrupted) and every held run is
        parked for another runner."""
        self._stopping.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        """First SIGINT or SIGTERM: stop claiming, say which steps the runner waits for, and hand
        each run back at its next step boundary. A second: hand every run back at once (running
        steps are abandoned; their late writes are refused) by raising ``Abandoned`` out of
        ``run()`` (``tether worker`` then exits 130)."""
        signals = 0

        def handle(signum: int, frame: FrameType | None) -> None:
            # Nothing raised here: an exception at an arbitrary point of the main thread could
            # leave a lock held. The main thread raises ``Abandoned`` where it waits (``_run``).
            nonlocal signals
            signals += 1
            if signals > 1:
                log.warning("runner %s: handing every run back now", self.label)
                self._abandoning.set()
                self._wake.set()
                return
            self.stop()
            waiting = self.running_steps()
            if waiting:
                log.warning(
                    "runner %s stopping: waiting for %s to finish, then handing the runs back "
                    "(signal again to hand them back at once)",
                    self.label,
                    ", ".join(waiting),
                )
            else:
                log.warning("runner %s stopping", self.label)

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def idle_for_good(self) -> bool:
        """Whether nothing this runner could execute is queued or coming due (a durable sleep, a
        retry's backoff): ``tether worker --until-idle`` stops then. Runs waiting for a person do
        not keep it alive."""
        try:
            return not self.store.work_coming(definition_digests=self.registry.digests())
        except TetherError as error:
            log.warning("runner %s could not read the queue: %s", self.runner_id, error)
            return False

    def running_steps(self) -> list[str]:
        """The runs held, as ``run_id`` (with the node begun last, when known)."""
        with self._lock:
            actives = list(self._active.values())
        return [a.run_id + (f" (node {a.step})" if a.step else "") for a in actives if not a.completed]

    def abandon(self) -> None:
        """Stop, and hand every held run back at once: its running attempt is recorded
        interrupted and the run parked for another runner, under this runner's claim; the step
        still running here can no longer write (its claim is gone). Commands are killed."""
        self.stop()
        with self._lock:
            actives = [a for a in self._active.values() if not a.completed]
        for active in actives:
            active.lost.set()
            self._kill(active)
            self._hand_back(active)
            log.warning("run %s handed back", active.run_id)

    @property
    def active_run_ids(self) -> list[str]:
        with self._lock:
            return list(self._active)

    def _free_slots(self) -> int:
        """Slots free for more runs: the concurrency less the runs held and not completed. A run
        a group completed frees its slot with that group: its thread lets the run go a moment
        later, and a claim in between must not count it (measured: counted, a quarter of the
        groups at concurrency 4 found no slot free and left their claims to transactions and
        commits of their own)."""
        with self._lock:
            held = sum(1 for active in self._active.values() if not active.completed)
        return self.config.concurrency - held

    def run(self, *, stop_when: Callable[[], bool] | None = None) -> None:
        """Claim and execute runs until stopped (or until ``stop_when()`` holds while idle).
        ``Abandoned`` (a second stop signal) hands every held run back at once and is raised on."""
        try:
            self._run(stop_when)
        except Abandoned:
            self.abandon()
            self._retire()
            raise

    def _run(self, stop_when: Callable[[], bool] | None) -> None:
        heartbeat = threading.Thread(target=self._heartbeat, name="tether-heartbeat", daemon=True)
        heartbeat.start()
        cancels = CancelWatcher(
            self.store,
            lambda: self.active_run_ids,
            self._on_cancel,
            lambda: self._stopping.is_set() and not self.active_run_ids,
        )
        self._cancels = cancels
        cancels.start()
        # A change notice (a new or requeued run) cuts the idle wait short, and so does the lapse
        # of another runner's lease (see _until_next_lapse); the wait still ends at poll_ms for
        # what neither announces (a timer that came due). Notices are listened to only while a
        # slot is free and the last claim found no run for it: while claims find runs, the next
        # claim comes with a completion (or a run thread's wake), and a notice would only wake
        # this loop for nothing (on SQLite, the watcher polls only while someone listens).
        # Listening starts before the claim reads the queue again, so no run queued after the
        # claim that found none goes unnoticed.
        listening = False
        idle_wait = 0.01
        last_housekeeping = 0.0
        try:
            while not self._stopping.is_set():
                if listening != (self._found_none and self._free_slots() > 0):
                    listening = not listening
                    if listening:
                        self.store.changes.subscribe("runs", self._wake)
                    else:
                        self.store.changes.unsubscribe("runs", self._wake)
                # The claim first: a run whose lease lapsed waits for no housekeeping. A store
                # refusal of either (a busy database, a run whose session slot another run holds)
                # must not end the runner, nor skip the other: the refused transaction wrote
                # nothing (a sweep's earlier transactions stand) and the next round tries again.
                try:
                    started = self._claim_some()
                except TetherError as error:
                    log.warning("runner %s could not claim: %s", self.runner_id, error)
                    started = None
                if time.monotonic() - last_housekeeping > self._housekeeping_every:
                    last_housekeeping = time.monotonic()
                    try:
                        self._housekeeping()
                    except TetherError as error:
                        log.warning("runner %s could not sweep timers: %s", self.runner_id, error)
                if started:
                    idle_wait = 0.01
                    continue
                if started is False and not listening:
                    continue  # listen, then claim again
                if stop_when is not None and not self._busy and stop_when():
                    break
                self._wake.wait(self._until_next_lapse(idle_wait))
                self._wake.clear()
                idle_wait = min(idle_wait * 2, self.config.poll_ms / 1000)
        finally:
            if listening:
                self.store.changes.unsubscribe("runs", self._wake)
            self._stopping.set()
            # No claim is under way once this lock is free, and none starts now that the runner
            # is stopping: no run thread is added after this list is taken.
            with self._claiming, self._lock:
                threads = list(self._threads)
            for _ in threads:
                self._runs.put(None)
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.05)
                    if self._abandoning.is_set():
                        raise Abandoned("stopped by a second signal")
            heartbeat.join(timeout=5)
            cancels.join(timeout=5)
            self._retire()

    def _until_next_lapse(self, idle_wait: float) -> float:
        """The idle wait in seconds, cut short to just past the moment the next lease another
        runner holds lapses (when this runner has a free slot to take that run over in, and the
        wait is longer than ``LAPSE_ASKED_PAST_S``)."""
        if idle_wait <= LAPSE_ASKED_PAST_S or self._free_slots() <= 0:
            return idle_wait
        try:
            lapse_ms = self.store.next_lease_lapse_ms(runner_id=self.runner_id)
        except TetherError as error:
            log.warning("runner %s could not read lease expiries: %s", self.runner_id, error)
            return idle_wait
        if lapse_ms is None:
            return idle_wait
        return min(idle_wait, (lapse_ms + LAPSE_MARGIN_MS) / 1000)

    # -- claiming ----------------------------------------------------------------------------
    def _claim_some(self) -> bool | None:
        """Claim runs for the free slots and hand them to run threads: whether any was claimed
        (False: the queue held none to claim), None when this call looked at no queue (no slot
        free, another thread claiming, the runner stopping). The claim loop and a run thread that
        just finished a run both call this, one at a time."""
        if not self._claiming.acquire(blocking=False):
            return None  # another thread is claiming for the same free slots
        try:
            return None if self._stopping.is_set() else self._claim_for_free_slots()
        finally:
            self._claiming.release()

    def _claim_for_free_slots(self) -> bool | None:
        free = self._free_slots()
        if free <= 0:
            return None
        token = str(uuid.uuid4())
        exclude = self.active_run_ids
        # The lease is judged from before the claim call: the store stamps it no earlier.
        asked_at = time.monotonic()
        for run_id in self._validations_due(exclude):
            record = self.store.claim_for_interaction_validation(
                run_id=run_id, runner_id=self.runner_id, claim_token=token, lease_ms=self.config.lease_ms
            )
            if record is not None:
                self._start(record, token, asked_at)
                return True
        # Claims for the free slots commit together, ahead of this process's other waiting writers
        # (first=True): a runner whose threads are busy still takes over an expired lease within
        # a poll. Should a take-up fail unexpectedly, the batch rolls back and that run is claimed
        # again alone; its thread takes it up and parks it as making no progress if it fails the
        # same way.
        try:
            with self._claim_transaction() as ready:
                claimed, taken = self._claim_batch(exclude, free, asked_at)
                ready.extend(taken)
        except _TakeUpFailed as failed:
            log.exception("run %s could not be taken up with its claim", failed.run_id)
            record = self.store.claim(
                run_id=failed.run_id,
                runner_id=self.runner_id,
                claim_token=token,
                lease_ms=self.config.lease_ms,
            )
            if record is not None:
                self._start(record, token, asked_at)
            return True
        return claimed

    @contextmanager
    def _claim_transaction(self) -> Iterator[list[_Active]]:
        """A write transaction ahead of this process's waiting writers, and a list for the runs
        the block claims and takes up: launched once it committed; should its commit's outcome
        be unknown, those whose claim landed. Nothing raises after the commit: what it wrote
        stands, and a run that cannot be started is left to its lease to lapse."""
        claimed: list[_Active] = []
        try:
            with self.store.transaction(first=True):
                yield claimed
        except CommitUnknown:
            self._launch_landed(claimed)
            raise
        for active in claimed:
            try:
                self._launch(active)
            except Exception:
                log.exception(
                    "run %s: claimed, but could not be started; its lease will lapse", active.run_id
                )

    def _claim_batch(self, exclude: list[str], free: int, asked_at: float) -> tuple[bool, list[_Active]]:
        """Claim up to ``free`` runs in the caller's transaction: whether any was claimed, and the
        ones to execute. New runs (up to CLAIM_BATCH) are taken up here too (nothing to
        settle: one commit for claim, take-up and first node); a takeover's take-up settles what
        the dead holder left, so its own thread does that after the claim, keeping the batch short
        however many runs a dead runner left."""
        seen: list[str] = []
        ready: list[_Active] = []
        fresh = 0
        while len(seen) < free and fresh < CLAIM_BATCH:
            token = str(uuid.uuid4())
            record = self.store.claim_next(
                runner_id=self.runner_id,
                claim_token=token,
                lease_ms=self.config.lease_ms,
                exclude_run_ids=[*exclude, *seen],
                # Only runs of the definitions loaded here: others wait for a worker that has them.
                definition_digests=self.registry.digests(),
            )
            if record is None:
                break
            seen.append(record.run_id)
            active = self._active_for(record, token, asked_at)
            if record.claim_generation != 1:
                ready.append(active)  # a takeover: its own thread takes it up
                continue
            fresh += 1
            active.taken_up = True
            try:
                taken_up = self._take_up(active)
            except TetherError:
                raise
            except Exception as error:
                raise _TakeUpFailed(record.run_id) from error
            if taken_up:
                ready.append(active)
        if free > 0:
            self._found_none = not seen
        return bool(seen), ready

    def _validation_waits(self, exclude: list[str]) -> bool:
        """Whether a group commit should leave its slots to the claim loop, which claims a session
        answer waiting for validation before any other run. Asked at most every housekeeping
        interval (a query, a round trip on PostgreSQL, that would otherwise come with every
        completion): an answer waits that much longer for a slot while runs keep completing."""
        now = time.monotonic()
        if now - self._validations_asked_at < self._housekeeping_every:
            return False
        self._validations_asked_at = now
        return bool(self._validations_due(exclude))

    def _validations_due(self, exclude: list[str]) -> list[str]:
        """The runs not in ``exclude`` whose session answer waits for validation (paused ones are
        not listed)."""
        return [
            run_id
            for run_id in self.store.runs_with_validating_submissions()
            if run_id not in exclude and self._executable(run_id)
        ]

    def _executable(self, run_id: str) -> bool:
        """Whether the run's definition is one this runner loaded (claims for a session's answer
        or an input deadline name a run; ``claim_next`` filters by definition itself)."""
        run = self.store.get_run(run_id)
        return run is not None and run.definition_digest in self.registry.digests()

    def _launch_landed(self, claimed: list[_Active]) -> None:
        """After a claim transaction whose commit had an unknown outcome (``CommitUnknown``): launch
        the runs whose claim landed (the token holds the lease; their take-up landed with it).
        The others were never claimed and stay queued for any runner."""
        for active in claimed:
            try:
                landed = self.store.verify_claim(run_id=active.run_id, claim_token=active.token)
            except TetherError as error:
                log.warning("run %s: whether its claim landed is unknown (%s)", active.run_id, error)
                continue  # if it did, its lease lapses and a runner takes it over
            if landed:
                self._launch(active)

    def _complete_together(self, active: _Active, complete: Callable[[], None]) -> bool:
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
        mine = _Completion(active, complete)
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

    def _commit_group(self, group: list[_Completion]) -> None:
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
                asked_at = time.monotonic()
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

    def _active_for(self, record: RunRecord, token: str, claimed_at: float | None = None) -> _Active:
        return _Active(record, token, (claimed_at or time.monotonic()) + self.config.lease_ms / 1000)

    def _start(self, record: RunRecord, token: str, claimed_at: float | None = None) -> None:
        self._launch(self._active_for(record, token, claimed_at))

    def _launch(self, active: _Active) -> None:
        """Hold the run (its slot taken, its lease renewed) and hand it to an idle run thread, or
        to a new one; with twice the concurrency in threads, to the first thread back (a
        thread still busy has a completed run to let go of)."""
        with self._lock:
            self._active[active.run_id] = active
            self._busy += 1
            thread = None
            if self._idle_threads <= 0 and len(self._threads) < 2 * self.config.concurrency:
                thread = threading.Thread(
                    target=self._work, name=f"tether-run-{len(self._threads) + 1}", daemon=True
                )
                self._threads.append(thread)
            else:
                self._idle_threads -= 1
        self._runs.put(active)
        if thread is not None:
            thread.start()
        if self._cancels is not None:
            self._cancels.nudge.set()

    def _work(self) -> None:
        """A run thread: execute the runs handed to it until the runner stops."""
        while True:
            active = self._runs.get()
            if active is None:
                return
            self._execute(active)
            with self._lock:
                self._idle_threads += 1
            # The slot this run held is free, unless runs were claimed with its completion: claim
            # the next run here (this thread then takes it up without a hand-off), else let the
            # claim loop try.
            claimed = not self._stopping.is_set() and self._claim_next_here()
            with self._lock:
                self._busy -= 1
            if not claimed and self._free_slots() > 0:
                self._wake.set()

    def _claim_next_here(self) -> bool:
        try:
            return bool(self._claim_some())
        except TetherError as error:
            log.warning("runner %s could not claim: %s", self.runner_id, error)
        except Exception:
            # This thread must stay alive to take the runs handed to it; the claim loop retries.
            log.exception("runner %s: claiming after a run failed", self.runner_id)
        return False

    def _housekeeping(self) -> None:
        """Apply decision defaults and input deadlines that expired; resume answered runs whose
        resume was refused while their session's active slot was taken."""
        for run_id in self.store.runs_awaiting_resume():
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
        claimed_at = time.monotonic()
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

    # -- heartbeat ---------------------------------------------------------------------------
    def _announce(self) -> None:
        """Tell the store this worker is live and which definitions it executes (``tether runs``
        says so of a queued run that no live worker can execute)."""
        try:
            self.store.worker_announce(
                worker_id=self.runner_id,
                label=self.label,
                definition_digests=self.registry.digests(),
                lease_ms=self.config.lease_ms,
            )
        except TetherError as error:
            log.warning("runner %s could not announce itself: %s", self.runner_id, error)

    def _retire(self) -> None:
        try:
            self.store.worker_retire(worker_id=self.runner_id)
        except TetherError as error:
            log.warning("runner %s could not retire its announcement: %s", self.runner_id, error)

    def _heartbeat(self) -> None:
        interval = self.config.renew_interval_ms / 1000
        while not (self._stopping.is_set() and not self.active_run_ids):
            if not self._stopping.is_set():
                self._announce()
            with self._lock:
                actives = list(self._active.values())
            for active in actives:
                sent = time.monotonic()
                try:
                    # Ahead of this process's waiting writers: a renewal queued behind the run
                    # threads' steps could let the lease lapse under load.
                    with self.store.transaction(first=True):
                        renewed = self.store.renew(
                            run_id=active.run_id, claim_token=active.token, lease_ms=self.config.lease_ms
                        )
                except TetherError as error:
                    log.warning("renewing %s failed: %s", active.run_id, error)
                    continue
                if renewed:
                    active.deadline = sent + self.config.lease_ms / 1000
                else:
                    active.lost.set()
                    self._kill(active)
            # Sleep in short steps: a stopped runner with no run left exits at once, not after
            # a whole renew interval (up to 10 s with the default lease).
            wake = time.monotonic() + interval
            while time.monotonic() < wake and not (self._stopping.is_set() and not self.active_run_ids):
                time.sleep(min(0.05, interval))

    def _on_cancel(self, run_id: str) -> None:
        """The cancel watcher heard that ``run_id``'s cancel was requested."""
        with self._lock:
            active = self._active.get(run_id)
        if active is not None and not active.completed:
            self._cancel_held(active)

    def _cancel_held(self, active: _Active) -> None:
        """Act on a committed cancel request for a held run: signal its step, kill its command,
        and end the run ``cancelled`` under this claim (an effect caught applying becomes
        ambiguous). A step still running finishes in the background; nothing it returns is
        recorded, as the claim is gone."""
        if active.cancelled.is_set():
            return
        active.cancelled.set()
        self._kill(active)
        try:
            if self.store.cancel(run_id=active.run_id, claim_token=active.token):
                log.info("run %s cancelled on request", active.run_id)
        except TetherError as error:
            # Its thread tries again once the step returns (``_execute``), or a takeover does.
            log.warning("run %s: cancelling it failed (%s)", active.run_id, error)

    @staticmethod
    def _kill(active: _Active) -> None:
        """Kill a running command with every process it started (its own process group)."""
        process = active.process
        if process is not None and process.poll() is None:
            _kill_group(process)

    # -- executing a run ---------------------------------------------------------------------
    def _execute(self, active: _Active) -> None:
        try:
            self._drive(active)
        except (_Parked, ClaimLost) as stop:
            log.debug("run %s released: %s", active.run_id, stop)
        except CancelRequested:
            # A cancel committed before this step could begin: end the run under this claim.
            self._cancel_held(active)
        except (LeaseUnproven, StoreBusy, StoreUnavailable) as error:
            # Passing trouble, not a broken run: hand the run back for any runner to retry.
            log.warning("run %s handed back: %s", active.run_id, error)
            self._hand_back(active)
        except Exception as error:
            log.exception("run %s: unexpected error", active.run_id)
            self._release_after_error(active, error)
        finally:
            with self._lock:
                self._active.pop(active.run_id, None)
            self._cancel_if_requested(active)

    def _cancel_if_requested(self, active: _Active) -> None:
        """A cancel requested while this runner held the run that the watcher did not act on yet
        (or whose cancel failed) would wait for the next claim once the run is released: cancel
        it now, under the claim if it still holds, else as nobody's run."""
        if active.completed:
            return  # a request that came too late for a completed run has nothing left to cancel
        try:
            if self.store.cancel_requested(active.run_id) and not self.store.cancel(
                run_id=active.run_id, claim_token=active.token
            ):
                self.store.cancel(run_id=active.run_id)
        except TetherError:
            log.exception("run %s: a requested cancel could not be applied", active.run_id)

    def _hand_back(self, active: _Active) -> None:
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
        except TetherError as error:
            log.warning("run %s could not be handed back (%s); its lease will lapse", run_id, error)

    def _give_back(self, active: _Active) -> None:
        """Park the run for another runner (inside the caller's transaction). A run whose durable
        status is still waiting though nothing holds it any more (a resume put it in the queue
        and this runner gives it back before a step moved it on) goes back to the queue: parked
        and waiting, it would look like a run waiting on a person, and no runner would claim it."""
        store = self.store
        self._ensure(store.park(run_id=active.run_id, claim_token=active.token))
        if store.run_status(active.run_id) == "waiting":
            store.request_resume(run_id=active.run_id)  # refused while a person is still awaited

    @staticmethod
    def _ensure(done: bool) -> None:
        """A release or terminal move that wrote nothing means the claim is gone: stop, and roll back
        the enclosing transaction so no partial step commits."""
        if not done:
            raise ClaimLost("the claim on this run is no longer live; nothing was written")

    def _release_after_error(self, active: _Active, error: Exception) -> None:
        detail = (
            f"Workflow runner failed before it committed workflow progress: {type(error).__name__}: {error}"
        )
        try:
            if not self.store.park_for_no_progress(
                run_id=active.run_id, claim_token=active.token, detail=detail
            ):
                self._ensure(self.store.park(run_id=active.run_id, claim_token=active.token))
        except TetherError:
            log.exception("run %s could not be parked", active.run_id)

    def _take_up(self, active: _Active) -> bool:
        """Settle what an earlier holder left and mark the run running; False when that ended or
        parked the run instead (nothing left to execute). Joins the caller's transaction.

        A run claimed for the first time (lease generation 1) had no earlier holder, so it has no
        attempts, effects or cancel requests to settle; its first node, when a compute node, is
        begun here too (one commit for the claim, the take-up and the node's start)."""
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
            self._ensure(store.park(run_id=run_id, claim_token=token))
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
            self._ensure(store.park_for_source_change(run_id=run_id, claim_token=token, detail=detail))
            return False
        active.workflow = workflow
        # Interrupt what a dead runner left running (and fail a run that keeps killing its
        # runners), then mark the run running.
        if not fresh and store.attempt_interrupt_active(run_id=run_id, claim_token=token):
            takeovers = sum(
                1
                for e in store.events_after(0, run_id=run_id, event_type="node.interrupted", limit=100_000)
                # Takeovers only: a graceful stop's interrupted attempt is not a runner dying.
                if isinstance(e.payload, dict) and "count" in e.payload
            )
            if takeovers >= self.config.max_takeovers:
                node = self._last_node(store.attempts(run_id))
                self._ensure(
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
            self._ensure(store.park_for_ambiguous_effect(run_id=run_id, claim_token=token))
            return False
        store.mark_running(run_id=run_id, claim_token=token)
        if queued:
            store.set_run_status(run_id=run_id, claim_token=token, status="running")
        first = workflow.entry(workflow.start)
        if fresh and workflow.nodes[first].kind == "compute":
            active.begun = store.attempt_start(run_id=run_id, claim_token=token, node_id=first)
            active.attempts = [active.begun]
        return True

    def _drive(self, active: _Active) -> None:
        run_id, token = active.run_id, active.token
        store = self.store
        if not active.taken_up:
            with store.transaction():
                if not self._take_up(active):
                    return
        workflow = active.workflow
        assert workflow is not None
        while True:
            if active.completed or active.cancelled.is_set() or active.lost.is_set():
                return
            if self._stopping.is_set():
                with store.transaction():
                    if active.begun is not None:  # begun ahead, never run: not a takeover
                        store.attempt_finish(
                            run_id=run_id,
                            claim_token=token,
                            attempt_id=active.begun.attempt_id,
                            status="interrupted",
                            error_message="its runner stopped before the node ran",
                        )
                    self._give_back(active)
                return
            attempts, active.attempts = active.attempts or store.attempts(run_id), None
            node_id, failures, waiting = self._cursor(workflow, attempts)
            if node_id is None:
                completed = [a for a in attempts if a.status == "completed"]
                self._finish(active, completed[-1].output if completed else None)
                return
            current = workflow.nodes[node_id]
            ctx = Context(
                run_id=run_id,
                node_id=node_id,
                input=active.run.input,
                outputs=self._outputs(attempts),
                attempt=failures + 1,
                origin_session_id=active.run.origin_session_id,
                cancel_signal=active.cancelled,
            )
            step = getattr(self, f"_step_{current.kind}")
            active.step = node_id
            step(active, workflow, current, ctx, failures, waiting)

    # -- durable cursor ----------------------------------------------------------------------
    @staticmethod
    def _cursor(workflow: Workflow, attempts: list[Attempt]) -> tuple[str | None, int, Attempt | None]:
        """The node to run next, failed tries of it since it was entered, and its waiting attempt."""
        current: str | None = workflow.entry(workflow.start)
        failures = 0
        waiting = None
        for attempt in attempts:
            if attempt.status == "completed":
                target = workflow.route(attempt.node_id, attempt.exit_name or "ok")
                current = None if target is None else workflow.entry(target)
                failures, waiting = 0, None
            elif attempt.node_id == current:
                if attempt.status in ("failed", "timed_out"):
                    failures += 1
                elif attempt.status == "waiting":
                    waiting = attempt
        return current, failures, waiting

    @staticmethod
    def _outputs(attempts: list[Attempt]) -> dict[str, Json]:
        return {a.node_id: a.output for a in attempts if a.status == "completed"}

    @staticmethod
    def _last_node(attempts: list[Attempt]) -> str:
        return attempts[-1].node_id if attempts else "(none)"

    def _finish(self, active: _Active, output: Json) -> None:
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
            self._ensure(store.complete(run_id=run_id, claim_token=token))

    def _resume_running(self, active: _Active) -> None:
        if self.store.run_status(active.run_id) == "waiting":
            self.store.set_run_status(run_id=active.run_id, claim_token=active.token, status="running")

    def _fail_node(
        self,
        active: _Active,
        node: Node,
        attempt: Attempt,
        error: str,
        failures: int,
        retries: int,
        backoff_s: float,
        *,
        raised: BaseException | None = None,
    ) -> None:
        """Finish a failed attempt: back off durably and retry, or fail the run. ``raised``: the
        exception, whose traceback (bounded) is kept with the attempt."""
        store, run_id, token = self.store, active.run_id, active.token
        tries = failures + 1
        with store.transaction():
            store.attempt_finish(
                run_id=run_id,
                claim_token=token,
                attempt_id=attempt.attempt_id,
                status="failed",
                error_message=error if raised is None else story(raised),
            )
            if tries <= retries:
                wake = self.store.now() + timedelta(seconds=backoff_s * 2 ** (tries - 1))
                self._ensure(store.park_until(run_id=run_id, claim_token=token, available_at=wake))
            else:
                self._ensure(
                    store.fail(
                        run_id=run_id,
                        claim_token=token,
                        error_code="nodeFailed",
                        error_message=f"Node {node.id} failed after {tries} attempt(s): {error}",
                    )
                )
        raise _Parked(f"node {node.id} failed")

    def _complete_node(self, active: _Active, attempt: Attempt, output: Json, exit_name: str = "ok") -> None:
        """Finish the attempt; in the same transaction (one commit instead of two), complete the
        run when the workflow ends after it, or begin the next node when that is a compute node
        (``_begin`` hands it out); unless the step holds a transaction of its own around this call
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
                        self._resume_running(active)
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

    def _begin(self, active: _Active, node_id: str, timeout_ms: int | None = None) -> Attempt:
        begun, active.begun = active.begun, None
        if begun is not None:
            if begun.node_id != node_id or timeout_ms is not None:
                raise InconsistentState(f"node {begun.node_id} was begun ahead, not {node_id}")
            return begun
        with self.store.transaction():
            self._resume_running(active)
            return self.store.attempt_start(
                run_id=active.run_id, claim_token=active.token, node_id=node_id, timeout_ms=timeout_ms
            )

    # -- node kinds --------------------------------------------------------------------------
    def _step_compute(
        self, active: _Active, wf: Workflow, node: Node, ctx: Context, failures: int, waiting: Attempt | None
    ) -> None:
        attempt = self._begin(active, ctx.node_id)
        assert node.fn is not None
        try:
            value = node.fn(ctx)
            exit_name, output = (value.name, value.output) if isinstance(value, Exit) else ("ok", value)
            canonical_json(output)
        except ClaimLost:
            raise
        except Exception as error:
            if active.cancelled.is_set():
                raise _Parked("step ended by its run's cancel") from None
            self._fail_node(
                active,
                node,
                attempt,
                summary(error),
                failures,
                int(node.spec["retries"]),
                float(node.spec["backoffS"]),
                raised=error,
            )
            return
        self._complete_node(active, attempt, output, exit_name)

    def _step_agent(
        self, active: _Active, wf: Workflow, node: Node, ctx: Context, failures: int, waiting: Attempt | None
    ) -> None:
        attempt = self._begin(active, ctx.node_id)
        schema = node.spec["schema"]
        assert isinstance(schema, dict)
        try:
            # Inside the try: a broken prompt function fails the attempt, not the runner.
            prompt = node.fn(ctx) if node.fn is not None else str(node.spec["prompt"])
            output = node.provider.complete(prompt, schema)
            canonical_json(output)
            problems = schema_errors(output, schema)
            if problems:
                raise ValueError("model output does not match the schema: " + "; ".join(problems[:5]))
        except Exception as error:
            if active.cancelled.is_set():
                raise _Parked("step ended by its run's cancel") from None
            self._fail_node(
                active,
                node,
                attempt,
                summary(error),
                failures,
                int(node.spec["retries"]),
                1.0,
                raised=error,
            )
            return
        self._complete_node(active, attempt, output)

    def _step_shell(
        self, active: _Active, wf: Workflow, node: Node, ctx: Context, failures: int, waiting: Attempt | None
    ) -> None:
        spec = node.spec
        attempt = self._begin(active, ctx.node_id)
        limit = int(spec["maxOutput"])
        env = {**os.environ, **dict(spec["env"] or {})}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                # A session of its own: a cancel or a stop kills the command's whole process group.
                process = subprocess.Popen(
                    list(spec["command"]),
                    cwd=spec["cwd"],
                    env=env,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            except OSError as error:
                self._fail_node(
                    active,
                    node,
                    attempt,
                    f"cannot start {spec['command']}: {error}",
                    failures,
                    int(spec["retries"]),
                    float(spec["backoffS"]),
                )
                return
            active.process = process
            deadline = time.monotonic() + float(spec["timeoutS"])
            timed_out = False
            while process.poll() is None:
                if self._stopping.is_set() or active.cancelled.is_set() or active.lost.is_set():
                    _kill_group(process)
                    process.wait()
                    active.process = None
                    if self._stopping.is_set() and not (active.cancelled.is_set() or active.lost.is_set()):
                        with self.store.transaction():
                            self.store.attempt_finish(
                                run_id=active.run_id,
                                claim_token=active.token,
                                attempt_id=attempt.attempt_id,
                                status="interrupted",
                                error_message="interrupted by runner shutdown",
                            )
                            self._ensure(self.store.park(run_id=active.run_id, claim_token=active.token))
                    raise _Parked("command interrupted")
                if time.monotonic() > deadline:
                    _kill_group(process)
                    process.wait()
                    timed_out = True
                    break
                time.sleep(0.02)
            active.process = None
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(limit + 1), err.read(limit + 1)
        output = {
            "exitCode": process.returncode,
            "stdout": stdout[:limit].decode("utf-8", "replace"),
            "stderr": stderr[:limit].decode("utf-8", "replace"),
            "truncated": len(stdout) > limit or len(stderr) > limit,
        }
        retries, backoff = int(spec["retries"]), float(spec["backoffS"])
        if timed_out:
            self._fail_node(
                active, node, attempt, f"timed out after {spec['timeoutS']} s", failures, retries, backoff
            )
        elif process.returncode == 0:
            self._complete_node(active, attempt, output, "ok")
        elif self._routes_error(wf, ctx.node_id):
            self._complete_node(active, attempt, output, "error")
        else:
            tail = output["stderr"][-500:] if isinstance(output["stderr"], str) else ""
            self._fail_node(
                active, node, attempt, f"exit status {process.returncode}: {tail}", failures, retries, backoff
            )

    @staticmethod
    def _routes_error(wf: Workflow, node_id: str) -> bool:
        """Whether an ``error`` exit of ``node_id`` is routed: by its own ``node.error`` edge or, for
        a terminal node of an included sub-graph, by the including node's (as ``route`` resolves)."""
        while True:
            if f"{node_id}.error" in wf.edges:
                return True
            if node_id in wf.edges or "/" not in node_id:
                return False
            node_id = node_id.rsplit("/", 1)[0]

    def _step_effect(
        self, active: _Active, wf: Workflow, node: Node, ctx: Context, failures: int, waiting: Attempt | None
    ) -> None:
        store, run_id, token = self.store, active.run_id, active.token
        visit = (
            sum(1 for a in store.attempts(run_id) if a.node_id == ctx.node_id and a.status == "completed") + 1
        )
        key = f"{run_id}:{ctx.node_id}:{visit}"
        attempt = self._begin(active, ctx.node_id)
        effect = store.effect_enqueue(
            run_id=run_id,
            claim_token=token,
            effect_type=str(node.spec["effectType"]),
            idempotency_key=key,
            payload={"nodeId": ctx.node_id},
        )
        if effect.status == "applied":
            self._complete_node(active, attempt, effect.result)
            return
        if effect.status != "pending":
            with store.transaction():
                store.attempt_finish(
                    run_id=run_id,
                    claim_token=token,
                    attempt_id=attempt.attempt_id,
                    status="failed",
                    error_message=f"effect {effect.status}",
                )
                self._ensure(
                    store.fail(
                        run_id=run_id,
                        claim_token=token,
                        error_code="effectRejected",
                        error_message=(
                            f"Effect {key} was {effect.status}: {effect.error_message or 'no detail'}"
                        ),
                    )
                )
            raise _Parked("effect not applied")
        if not active.provably_live(self.config.effect_guard_ms):
            raise LeaseUnproven(f"the lease on {run_id} cannot be proven live; effect {key} was not applied")
        store.effect_begin(run_id=run_id, claim_token=token, effect_id=effect.effect_id)
        assert node.fn is not None
        try:
            result = node.fn(ctx, key)
            canonical_json(result)
        except Exception as error:
            message = summary(error)
            with store.transaction():
                store.effect_finish(
                    run_id=run_id,
                    claim_token=token,
                    effect_id=effect.effect_id,
                    applied=False,
                    error_message=message,
                )
                store.attempt_finish(
                    run_id=run_id,
                    claim_token=token,
                    attempt_id=attempt.attempt_id,
                    status="failed",
                    error_message=story(error),
                )
                self._ensure(
                    store.fail(
                        run_id=run_id,
                        claim_token=token,
                        error_code="effectRejected",
                        error_message=f"Effect {key} was rejected: {message}",
                    )
                )
            raise _Parked("effect rejected") from None
        with store.transaction():
            store.effect_finish(
                run_id=run_id, claim_token=token, effect_id=effect.effect_id, applied=True, result=result
            )
            self._complete_node(active, attempt, result)

    def _step_decision(
        self, active: _Active, wf: Workflow, node: Node, ctx: Context, failures: int, waiting: Attempt | None
    ) -> None:
        store, run_id, token = self.store, active.run_id, active.token
        spec = node.spec
        if waiting is None:
            deadline = (
                None
                if spec["deadlineS"] is None
                else self.store.now() + timedelta(seconds=float(spec["deadlineS"]))
            )
            request = {
                "question": spec["question"],
                "options": spec["options"],
                "schema": spec["schema"],
                "default": spec["default"],
                "nodeId": ctx.node_id,
            }
            with store.transaction():
                attempt = self._begin(active, ctx.node_id)
                decision = store.decision_open(
                    run_id=run_id,
                    claim_token=token,
                    node_id=ctx.node_id,
                    request=request,
                    deadline_at=deadline,
                )
                store.set_run_status(
                    run_id=run_id,
                    claim_token=token,
                    status="waiting",
                    detail=f"waiting for decision {decision.decision_id}",
                )
                store.message_send(
                    run_id=run_id,
                    claim_token=token,
                    kind="decision",
                    payload={**request, "decisionId": decision.decision_id, "attemptId": attempt.attempt_id},
                )
                self._ensure(store.park(run_id=run_id, claim_token=token))
            raise _Parked("waiting for a decision")
        decisions = [
            d
            for d in store.decisions(run_id=run_id)
            if d.node_id == ctx.node_id and d.created_at >= waiting.started_at
        ]
        answered = decisions[-1] if decisions else None
        if answered is None or answered.outcome is None:
            self._ensure(store.park(run_id=run_id, claim_token=token))
            raise _Parked("decision still open")
        if answered.outcome == "accepted":
            exit_name = str(answered.response) if spec["options"] else "ok"
            with store.transaction():
                store.set_run_status(run_id=run_id, claim_token=token, status="running")
                self._complete_node(
                    active,
                    waiting,
                    {"response": answered.response, "provenance": answered.provenance},
                    exit_name,
                )
            return
        with store.transaction():
            store.attempt_finish(
                run_id=run_id,
                claim_token=token,
                attempt_id=waiting.attempt_id,
                status="timed_out",
                error_message=answered.reason,
            )
            self._ensure(
                store.fail(
                    run_id=run_id,
                    claim_token=token,
                    error_code="decisionExpired",
                    error_message=(
                        f"Decision {answered.decision_id} ended without an answer: {answered.reason}"
                    ),
                )
            )
        raise _Parked("decision expired")

    def _step_input(
        self, active: _Active, wf: Workflow, node: Node, ctx: Context, failures: int, waiting: Attempt | None
    ) -> None:
        store, run_id, token = self.store, active.run_id, active.token
        spec = node.spec
        if active.run.execution_mode != "interactive":
            attempt = self._begin(active, ctx.node_id)
            self._fail_node(
                active,
                node,
                attempt,
                "input nodes need an interactive run with an origin session",
                failures,
                0,
                1.0,
            )
            return
        if waiting is None:
            timeout = None if spec["timeoutS"] is None else int(float(spec["timeoutS"]) * 1000)
            with store.transaction():
                attempt = self._begin(active, ctx.node_id, timeout)
                request = store.request_open(
                    run_id=run_id,
                    claim_token=token,
                    attempt_id=attempt.attempt_id,
                    kind="input",
                    payload={"prompt": spec["prompt"], "schema": spec["schema"]},
                )
                store.interval_open(run_id=run_id, claim_token=token, attempt_id=attempt.attempt_id)
                store.message_send(
                    run_id=run_id,
                    claim_token=token,
                    kind="step",
                    payload={"prompt": spec["prompt"], "requestId": request.request_id},
                )
                self._ensure(store.park(run_id=run_id, claim_token=token))
            raise _Parked("waiting for input")
        requests = [r for r in store.requests(run_id=run_id) if r.attempt_id == waiting.attempt_id]
        if not requests:
            raise TetherError(f"input attempt {waiting.attempt_id} has no request")
        request = requests[-1]
        submissions = store.submissions(request.request_id)
        if request.status == "cancelled":
            if spec["default"] is not None:
                with store.transaction():
                    self._resume_running(active)
                    self._complete_node(
                        active, waiting, {"value": spec["default"], "provenance": "timeout_policy"}
                    )
                return
            with store.transaction():
                store.attempt_finish(
                    run_id=run_id,
                    claim_token=token,
                    attempt_id=waiting.attempt_id,
                    status="timed_out",
                    error_message="input deadline expired",
                )
                self._ensure(
                    store.fail(
                        run_id=run_id,
                        claim_token=token,
                        error_code="inputExpired",
                        error_message=f"Node {ctx.node_id}: the input deadline expired without an answer",
                    )
                )
            raise _Parked("input expired")
        if request.status == "settled":
            accepted = [s for s in submissions if s.outcome == "accepted"]
            with store.transaction():
                self._resume_running(active)
                self._complete_node(
                    active,
                    waiting,
                    {"value": accepted[-1].payload if accepted else None, "provenance": "human"},
                )
            return
        for submission in submissions:
            if submission.outcome != "validating":
                continue
            problems = [] if spec["schema"] is None else schema_errors(submission.payload, spec["schema"])
            with store.transaction():
                if problems:
                    store.submission_resolve(
                        run_id=run_id,
                        claim_token=token,
                        submission_id=submission.submission_id,
                        accepted=False,
                        receipt={"status": "rejected", "errors": problems},
                    )
                    store.message_send(
                        run_id=run_id,
                        claim_token=token,
                        kind="step",
                        payload={
                            "prompt": spec["prompt"],
                            "requestId": request.request_id,
                            "rejected": problems,
                        },
                    )
                    continue
                store.submission_resolve(
                    run_id=run_id, claim_token=token, submission_id=submission.submission_id, accepted=True
                )
                self._complete_node(active, waiting, {"value": submission.payload, "provenance": "human"})
            return
        with store.transaction():
            store.set_run_status(
                run_id=run_id, claim_token=token, status="waiting", detail="waiting for origin-session input"
            )
            self._ensure(store.park(run_id=run_id, claim_token=token))
        raise _Parked("still waiting for input")

    def _step_notify(
        self, active: _Active, wf: Workflow, node: Node, ctx: Context, failures: int, waiting: Attempt | None
    ) -> None:
        attempt = self._begin(active, ctx.node_id)
        try:
            payload: Any = node.fn(ctx) if node.fn is not None else {"text": node.spec["text"]}
            canonical_json(payload)
        except Exception as error:
            # A broken message function fails the node (like compute), not the runner.
            self._fail_node(active, node, attempt, summary(error), failures, 0, 1.0, raised=error)
            return
        with self.store.transaction():
            message = self.store.message_send(
                run_id=active.run_id, claim_token=active.token, kind="notification", payload=payload
            )
            self._complete_node(active, attempt, {"delivered": message is not None})

    def _step_sleep(
        self, active: _Active, wf: Workflow, node: Node, ctx: Context, failures: int, waiting: Attempt | None
    ) -> None:
        with self.store.transaction():
            attempt = self._begin(active, ctx.node_id)
            # The store's clock, as the attempt's finish is stamped: the sleep counts from there.
            wake = self.store.now() + timedelta(seconds=float(node.spec["seconds"]))
            self._complete_node(active, attempt, {"wakeAt": wake.isoformat()})
            self._ensure(
                self.store.park_until(run_id=active.run_id, claim_token=active.token, available_at=wake)
            )
        raise _Parked("sleeping")
