"""Heartbeat: the worker announcement and lease renewal of every held run."""

from __future__ import annotations

from tether.engine.worker.core import RunnerCore
from tether.errors import TetherError


class Heartbeat(RunnerCore):
    """Heartbeat: the worker announcement and lease renewal of every held run."""

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
            self._trouble("announce itself", error)

    def _retire(self) -> None:
        try:
            self.store.worker_retire(worker_id=self.runner_id)
        except TetherError as error:
            self._trouble("retire its announcement", error)

    def _heartbeat(self) -> None:
        interval = self.config.renew_interval_ms / 1000
        while not self._wound_down():
            if not self._stopping.is_set():
                self._announce()
            with self._lock:
                actives = list(self._active.values())
            for active in actives:
                sent = self.clock.monotonic()
                try:
                    # Ahead of this process's waiting writers: a renewal queued behind the run
                    # threads' steps could let the lease lapse under load.
                    with self.store.transaction(first=True):
                        renewed = self.store.renew(
                            run_id=active.run_id, claim_token=active.token, lease_ms=self.config.lease_ms
                        )
                except TetherError as error:
                    self._trouble(f"renew the lease on {active.run_id}", error)
                    continue
                if renewed:
                    active.deadline = sent + self.config.lease_ms / 1000
                else:
                    self.tally.add("leases_lost")
                    active.lost.set()
                    self._kill(active)
                    self._cancel_coroutine(active)
            # Sleep in short steps: a stopped runner with no run left exits at once, not after
            # a whole renew interval (up to 10 s with the default lease).
            # Woken early by a stop or a run let go: a stopped runner with no run left exits at
            # once, not after a whole renew interval (up to 10 s with the default lease).
            wake = self.clock.monotonic() + interval
            while not self._wound_down():
                left = wake - self.clock.monotonic()
                if left <= 0:
                    break
                self.clock.wait(self._heartbeat_wake, left)
                self._heartbeat_wake.clear()
