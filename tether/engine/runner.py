"""The runner: claims runs, renews their leases, executes their nodes, and hands them off.

Every node outcome is committed in one store transaction that re-checks the live claim, so a
runner whose lease was taken over can never write. The durable state of a run is its attempts:
the next node is the route out of the last completed attempt, so a new runner continues from the
last committed node after a crash (an interrupted attempt simply runs again).

``Runner`` assembles the services of ``tether.engine.worker`` (one job each) and the node
handlers of ``tether.engine.nodes`` (one module per node kind).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from tether.engine.context import Context
from tether.engine.worker.cancelling import Cancelling
from tether.engine.worker.claiming import Claiming
from tether.engine.worker.completion import Completing
from tether.engine.worker.config import RunnerConfig
from tether.engine.worker.deadlines import Deadlines
from tether.engine.worker.drive import Driving
from tether.engine.worker.heartbeat import Heartbeat
from tether.engine.worker.housekeeping import Housekeeping
from tether.engine.worker.loop import ClaimLoop
from tether.engine.worker.recovery import Recovery
from tether.engine.worker.scheduling import Scheduling
from tether.engine.worker.state import Abandoned, ActiveRun
from tether.errors import InvalidInput, LeaseUnproven, TetherError

__all__ = ["Abandoned", "ActiveRun", "Context", "LeaseUnproven", "Runner", "RunnerConfig"]

log = logging.getLogger("tether.runner")

#: Of a stop's timeout, at most this long is kept for handing back the runs whose steps did not
#: finish in time (a fifth of the timeout when that is shorter).
STOP_HANDBACK_S = 2.0


class Runner(
    ClaimLoop,
    Claiming,
    Completing,
    Deadlines,
    Heartbeat,
    Housekeeping,
    Scheduling,
    Recovery,
    Cancelling,
    Driving,
):
    """A worker that drains the store's queue. ``run()`` blocks until ``stop()`` (or a signal)."""

    def start(self, *, name: str | None = None) -> threading.Thread:
        """Run in a background thread (a daemon: it never keeps the process alive) and return it.
        ``stop(timeout=...)`` ends it; ``join()`` waits for it."""
        with self._lock:
            if self._started:
                raise InvalidInput(f"runner {self.label} was already started; a runner runs once")
            self._started = True
        thread = threading.Thread(
            target=self._run_in_background, name=name or f"tether-runner-{self.label}", daemon=True
        )
        self._thread = thread
        thread.start()
        return thread

    def _run_in_background(self) -> None:
        try:
            self.run()
        except Abandoned:
            pass  # every held run was handed back; nothing to report to nobody
        except BaseException:
            log.exception("runner %s stopped on an unexpected error", self.label)

    def stop(self, timeout: float | None = None) -> bool:
        """Stop claiming; running nodes finish (commands are interrupted) and every held run is
        handed back for another runner. Without ``timeout``, returns at once (``join()`` waits).
        With one, waits up to ``timeout`` seconds for the runner to finish; steps still running
        near the end are abandoned: their runs are handed back at once and their late results
        refused (fenced out by the claim). True when the runner finished within the timeout."""
        self._stopping.set()
        self._wake.set()
        self._heartbeat_wake.set()
        if timeout is None:
            return self._finished.is_set()
        deadline = time.monotonic() + max(0.0, timeout)
        # Most of the time for the steps to finish by themselves; the rest to hand back the ones
        # that did not.
        graceful = deadline - min(max(0.0, timeout) * 0.2, STOP_HANDBACK_S)
        if not self._finished.wait(max(0.0, graceful - time.monotonic())) and self._ran.is_set():
            held = self.running_steps()
            if held:
                log.warning(
                    "runner %s: %s still running at the stop timeout; handing them back now",
                    self.label,
                    ", ".join(held),
                )
            self._abandoning.set()
            self._heartbeat_wake.set()
            self._wake.set()
        return self._finished.wait(max(0.0, deadline - time.monotonic()))

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the runner finished (``run()`` returned); True when it did within
        ``timeout`` seconds (forever without one)."""
        return self._finished.wait(timeout)

    def install_signal_handlers(self) -> None:
        """First SIGINT or SIGTERM: stop claiming, say which steps the runner waits for, and hand
        each run back at its next step boundary. A second: hand every run back at once (running
        steps are abandoned; their late writes are refused) by raising ``Abandoned`` out of
        ``run()`` (``tether worker`` then exits 130).

        The application's own handlers stay: each signal is handled here, then passed on to the
        handler installed before (unless that was Python's default, which would raise
        ``KeyboardInterrupt`` at an arbitrary point, or ``SIG_IGN``). ``restore_signal_handlers()``
        puts the earlier handlers back. Python delivers signals to the main thread only: called
        from another thread, this raises ``InvalidInput`` (call ``stop()`` from the application's
        own handler instead)."""
        if threading.current_thread() is not threading.main_thread():
            raise InvalidInput(
                "install_signal_handlers() must be called from the main thread (Python delivers "
                "signals only there); from another thread, call runner.stop() from the "
                "application's own signal handling instead"
            )
        signals = 0

        def handle(signum: int, frame: FrameType | None) -> None:
            # Nothing raised here: an exception at an arbitrary point of the main thread could
            # leave a lock held. The main thread raises ``Abandoned`` where it waits (``_run``).
            nonlocal signals
            signals += 1
            if signals > 1:
                log.warning("runner %s: handing every run back now", self.label)
                self._abandon_raises = True
                self._abandoning.set()
                self._heartbeat_wake.set()
                self._wake.set()
            else:
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
            previous = self._previous_handlers.get(signum)
            if callable(previous) and previous is not signal.default_int_handler:
                previous(signum, frame)

        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous_handlers.setdefault(signum, signal.getsignal(signum))
            signal.signal(signum, handle)

    def restore_signal_handlers(self) -> None:
        """Put back the handlers ``install_signal_handlers()`` found (main thread only)."""
        for signum, previous in list(self._previous_handlers.items()):
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            del self._previous_handlers[signum]

    def idle_for_good(self) -> bool:
        """Whether nothing this runner could execute is queued or coming due (a durable sleep, a
        retry's backoff): ``tether worker --until-idle`` stops then. Runs waiting for a person do
        not keep it alive."""
        try:
            return not self.store.work_coming(definition_digests=self.registry.digests())
        except TetherError as error:
            self._trouble("read the queue", error)
            return False

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
            self._cancel_coroutine(active)

    def run(self, *, stop_when: Callable[[], bool] | None = None) -> None:
        """Claim and execute runs until stopped (or until ``stop_when()`` holds while idle).
        A second stop signal hands every held run back at once and raises ``Abandoned``; a
        ``stop(timeout=...)`` that had to abandon steps hands their runs back and returns."""
        self._ran.set()
        try:
            self._run(stop_when)
        except Abandoned:
            if not self._store_closed.is_set():  # a closed store takes no hand-back
                self.abandon()
                self._retire()
            if self._abandon_raises:
                raise
        finally:
            # After the runs were handed back: a coroutine still running is abandoned, cancelled.
            self._step_loop.stop()
            self._finished.set()
