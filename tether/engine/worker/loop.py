"""The claim loop: claim for free slots, sweep timers, and wait idle until a change notice,
a lease lapse or the poll interval."""

from __future__ import annotations

import threading
from collections.abc import Callable

from tether.engine.cancels import CancelWatcher
from tether.engine.worker.core import RunnerCore
from tether.engine.worker.state import LAPSE_ASKED_PAST_S, LAPSE_MARGIN_MS, Abandoned
from tether.errors import TetherError


class ClaimLoop(RunnerCore):
    """The claim loop: claim for free slots, sweep timers, and wait idle until a change notice,
    a lease lapse or the poll interval."""

    def _run(self, stop_when: Callable[[], bool] | None) -> None:
        heartbeat = threading.Thread(target=self._heartbeat, name="tether-heartbeat", daemon=True)
        heartbeat.start()
        cancels = CancelWatcher(
            self.store,
            lambda: self.active_run_ids,
            self._on_cancel,
            self._wound_down,
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
                    self._trouble("claim", error)
                    started = None
                if self.clock.monotonic() - last_housekeeping > self._housekeeping_every:
                    last_housekeeping = self.clock.monotonic()
                    try:
                        self._housekeeping()
                    except TetherError as error:
                        self._trouble("sweep timers", error)
                if started:
                    idle_wait = 0.01
                    continue
                if started is False and not listening:
                    continue  # listen, then claim again
                if stop_when is not None and not self._busy and stop_when():
                    break
                self.clock.wait(self._wake, self._until_next_tick(self._until_next_lapse(idle_wait)))
                self._wake.clear()
                idle_wait = min(idle_wait * 2, self.config.poll_ms / 1000)
        finally:
            if listening:
                self.store.changes.unsubscribe("runs", self._wake)
            self._stopping.set()
            self._heartbeat_wake.set()  # a heartbeat with no run left ends now
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
            self._trouble("read lease expiries", error)
            return idle_wait
        if lapse_ms is None:
            return idle_wait
        return min(idle_wait, (lapse_ms + LAPSE_MARGIN_MS) / 1000)
