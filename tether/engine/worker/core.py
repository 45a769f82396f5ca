"""State shared by the runner's services, and the calls they make on each other."""

from __future__ import annotations

import logging
import queue
import socket
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from tether.engine.cancels import CancelWatcher
from tether.engine.clock import Clock, SystemClock
from tether.engine.context import Context
from tether.engine.graph import Node
from tether.engine.registry import Registry
from tether.engine.tracing import Tracing, tracing
from tether.engine.worker.config import RunnerConfig
from tether.engine.worker.state import HOUSEKEEPING_MIN_S, ActiveRun, Completion, Tally, kill_group
from tether.engine.worker.steploop import StepLoop
from tether.errors import ClaimLost, TetherError
from tether.store import Attempt, RunRecord, Store
from tether.values import Json

log = logging.getLogger("tether.runner")

T = TypeVar("T")


class RunnerCore(ABC):
    """What the runner's services share: the store, the registry, the runs held and the locks
    guarding them. Each service (a mixin in this package) implements one job; ``Runner``
    assembles them (tether/engine/runner.py)."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        runner_id: str | None = None,
        config: RunnerConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        #: The name an operator gave (``--runner-id``): a label that several processes may share.
        self.label = runner_id or f"host-{socket.gethostname()}"
        #: This runner's own identity, the label and an instance id: claims fence by it, so two
        #: processes started with one label never take each other's live runs as their own.
        self.runner_id = f"{self.label}#{uuid.uuid4().hex[:12]}"
        self.config = config or RunnerConfig()
        #: What this runner did, counted (``Tally.NAMES``).
        self.tally = Tally()
        #: Spans of the runs and steps executed (no-ops unless ``config.tracing``).
        self.tracing: Tracing = tracing(self.config.tracing)
        #: The runner's own timing (see tether.engine.clock); the store keeps its own clock.
        self.clock: Clock = clock or SystemClock()
        #: Wakes the heartbeat between renewals: set by a stop and by a run let go.
        self._heartbeat_wake = threading.Event()
        self._active: dict[str, ActiveRun] = {}
        #: The threads that execute runs: started as runs need them, at most twice the
        #: concurrency (the runs claimed with a group of completions may be launched before the
        #: completing runs' threads are idle), kept for the next run, ended by a ``None`` each
        #: when the runner stops.
        self._threads: list[threading.Thread] = []
        self._runs: queue.SimpleQueue[ActiveRun | None] = queue.SimpleQueue()
        #: Threads on their way to take the next run handed out, less the runs handed out that
        #: no thread was free for (below 0 while runs wait for a thread to come back).
        self._idle_threads = 0
        #: Runs handed to run threads and not yet let go with the claim attempt that follows them
        #: (a run thread claims the next run itself): while above 0, the runner is not idle.
        self._busy = 0
        self._claiming = threading.Lock()
        #: Completions waiting for the next group commit (see ``_complete_together``), and the lock
        #: that one group's commit holds.
        self._completions: list[Completion] = []
        self._committing = threading.Lock()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        #: Set by a second stop signal: ``run()`` stops waiting for running steps and hands every
        #: held run back at once.
        self._abandoning = threading.Event()
        #: Whether ``run()`` raises ``Abandoned`` once it handed the runs back (a second signal does;
        #: a ``stop(timeout=...)`` that abandoned steps does not).
        self._abandon_raises = False
        #: Set once ``run()`` began, and once it returned (``stop(timeout=...)``, ``join()``).
        self._ran = threading.Event()
        self._finished = threading.Event()
        self._started = False
        self._thread: threading.Thread | None = None
        #: The signal handlers ``install_signal_handlers()`` replaced, to chain to and restore.
        self._previous_handlers: dict[int, Any] = {}
        #: Set once the runner saw its store closed (it stops, and says so once).
        self._store_closed = threading.Event()
        self._wake = threading.Event()
        self._housekeeping_every = min(1.0, max(HOUSEKEEPING_MIN_S, self.config.poll_ms / 1000))
        #: When a group commit last asked whether a session answer waits for validation.
        self._validations_asked_at = 0.0
        #: Whether the last claim for free slots found no run to claim (the claim loop listens
        #: for notices only then; written under ``_claiming``).
        self._found_none = False
        #: Hears cancel requests for the runs held (while ``run()`` runs).
        self._cancels: CancelWatcher | None = None
        #: Where ``async def`` node functions run (started by the first one).
        self._step_loop = StepLoop(f"tether-steps-{self.label}")
        #: Whether the schedules the loaded workflows declare were written (the first sweep
        #: does), and when (on the runner's clock) the next of their schedules is due (see
        #: tether.engine.worker.scheduling).
        self._schedules_declared = False
        self._next_tick_at: float | None = None
        #: When (on the runner's clock) the schedules were last looked at.
        self._schedules_swept_at = float("-inf")

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

    def running_steps(self) -> list[str]:
        """The runs held, as ``run_id`` (with the node begun last, when known)."""
        with self._lock:
            actives = list(self._active.values())
        return [a.run_id + (f" (node {a.step})" if a.step else "") for a in actives if not a.completed]

    @staticmethod
    def ensure(done: bool) -> None:
        """A release or terminal move that wrote nothing means the claim is gone: stop, and roll back
        the enclosing transaction so no partial step commits."""
        if not done:
            raise ClaimLost("the claim on this run is no longer live; nothing was written")

    @staticmethod
    def _kill(active: ActiveRun) -> None:
        """Kill a running command with every process it started (its own process group)."""
        process = active.process
        if process is not None and process.poll() is None:
            kill_group(process)

    @staticmethod
    def _cancel_coroutine(active: ActiveRun) -> None:
        """Cancel a running async step's coroutine. Called once the run's fate is written (ended
        cancelled, handed back) or its claim is known lost: the step's thread wakes at once, and
        its writes must find the claim gone rather than race the write that ends it."""
        active.coroutine_cancelled.set()
        for coroutine in list(active.coroutines):
            coroutine.cancel()

    def _active_for(self, record: RunRecord, token: str, claimed_at: float | None = None) -> ActiveRun:
        return ActiveRun(record, token, (claimed_at or self.clock.monotonic()) + self.config.lease_ms / 1000)

    def _start(self, record: RunRecord, token: str, claimed_at: float | None = None) -> None:
        self._launch(self._active_for(record, token, claimed_at))

    def _fields(self, active: ActiveRun, **more: object) -> dict[str, object]:
        """The structured fields of a log record about a held run (``extra=``, see tether.logs)."""
        return {
            "run_id": active.run_id,
            "workflow": active.run.workflow_name,
            "runner_id": self.runner_id,
            **more,
        }

    def _wound_down(self) -> bool:
        """Whether the runner's helper threads (heartbeat, cancel watcher) may end: it is
        stopping and holds no run, or it abandoned the runs it held."""
        if self._store_closed.is_set():
            return True
        return self._stopping.is_set() and (self._abandoning.is_set() or not self.active_run_ids)

    def _trouble(self, doing: str, error: TetherError) -> None:
        """Log a store refusal of a background chore, unless the store was closed under the
        runner: then say so once and stop (no warning on every poll)."""
        if self.store.closed:
            if not self._store_closed.is_set():
                self._store_closed.set()
                log.warning("runner %s: its store was closed; stopping", self.label)
            self._stopping.set()
            self._abandoning.set()
            self._wake.set()
            self._heartbeat_wake.set()
            return
        log.warning("runner %s could not %s: %s", self.runner_id, doing, error)

    @property
    def stopping(self) -> bool:
        """Whether the runner is stopping: it claims nothing more and gives its runs back."""
        return self._stopping.is_set()

    # -- what each service offers the others -------------------------------------------------
    @abstractmethod
    def _cancel_held(self, active: ActiveRun) -> None:
        """See ``tether.engine.worker.cancelling``."""

    @abstractmethod
    def _cancel_if_requested(self, active: ActiveRun) -> None:
        """See ``tether.engine.worker.cancelling``."""

    @abstractmethod
    def _claim_batch(self, exclude: list[str], free: int, asked_at: float) -> tuple[bool, list[ActiveRun]]:
        """See ``tether.engine.worker.claiming``."""

    @abstractmethod
    def _claim_some(self) -> bool | None:
        """See ``tether.engine.worker.claiming``."""

    @abstractmethod
    def _claim_transaction(self) -> AbstractContextManager[list[ActiveRun]]:
        """See ``tether.engine.worker.claiming``."""

    @abstractmethod
    def _executable(self, run_id: str) -> bool:
        """See ``tether.engine.worker.claiming``."""

    @abstractmethod
    def _execute(self, active: ActiveRun) -> None:
        """See ``tether.engine.worker.drive``."""

    @abstractmethod
    def _finish(self, active: ActiveRun, output: Json) -> None:
        """See ``tether.engine.worker.completion``."""

    @abstractmethod
    def _give_back(self, active: ActiveRun) -> None:
        """See ``tether.engine.worker.recovery``."""

    @abstractmethod
    def _hand_back(self, active: ActiveRun) -> None:
        """See ``tether.engine.worker.recovery``."""

    @abstractmethod
    def _fire_schedules(self) -> None:
        """See ``tether.engine.worker.scheduling``."""

    @abstractmethod
    def _until_next_tick(self, wait_s: float) -> float:
        """See ``tether.engine.worker.scheduling``."""

    @abstractmethod
    def _housekeeping(self) -> None:
        """See ``tether.engine.worker.housekeeping``."""

    @abstractmethod
    def _release_after_error(self, active: ActiveRun, error: BaseException) -> None:
        """See ``tether.engine.worker.recovery``."""

    @abstractmethod
    def _retire(self) -> None:
        """See ``tether.engine.worker.heartbeat``."""

    @abstractmethod
    def _run(self, stop_when: Callable[[], bool] | None) -> None:
        """See ``tether.engine.worker.loop``."""

    @abstractmethod
    def _take_up(self, active: ActiveRun) -> bool:
        """See ``tether.engine.worker.recovery``."""

    @abstractmethod
    def _validation_waits(self, exclude: list[str]) -> bool:
        """See ``tether.engine.worker.claiming``."""

    @abstractmethod
    def begin_node(self, active: ActiveRun, node_id: str, timeout_ms: int | None = None) -> Attempt:
        """See ``tether.engine.worker.completion``."""

    @abstractmethod
    def complete_node(self, active: ActiveRun, attempt: Attempt, output: Json, exit_name: str = "ok") -> None:
        """See ``tether.engine.worker.completion``."""

    @abstractmethod
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
        """See ``tether.engine.worker.completion``."""

    @abstractmethod
    def needs_deadline(self, active: ActiveRun, node: Node) -> bool:
        """See ``tether.engine.worker.deadlines``."""

    @abstractmethod
    def call_with_deadline(self, active: ActiveRun, node: Node, ctx: Context, call: Callable[[], T]) -> T:
        """See ``tether.engine.worker.deadlines``."""

    @abstractmethod
    def time_out_node(
        self,
        active: ActiveRun,
        node: Node,
        attempt: Attempt,
        error: str,
        failures: int,
        retries: int,
        backoff_s: float,
    ) -> None:
        """See ``tether.engine.worker.deadlines``."""

    @abstractmethod
    def time_out_run(self, active: ActiveRun) -> None:
        """See ``tether.engine.worker.deadlines``."""

    @abstractmethod
    def resume_running(self, active: ActiveRun) -> None:
        """See ``tether.engine.worker.completion``."""

    @abstractmethod
    def _launch(self, active: ActiveRun) -> None:
        """See ``tether.engine.worker.claiming``."""

    @abstractmethod
    def _heartbeat(self) -> None:
        """See ``tether.engine.worker.heartbeat``."""

    @abstractmethod
    def _on_cancel(self, run_id: str) -> None:
        """See ``tether.engine.worker.cancelling``."""
