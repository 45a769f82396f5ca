"""Acting on cancel requests for the runs held."""

from __future__ import annotations

import logging

from tether.engine.worker.core import RunnerCore
from tether.engine.worker.state import ActiveRun
from tether.errors import TetherError

log = logging.getLogger("tether.runner")


class Cancelling(RunnerCore):
    """Acting on cancel requests for the runs held."""

    def _on_cancel(self, run_id: str) -> None:
        """The cancel watcher heard that ``run_id``'s cancel was requested."""
        with self._lock:
            active = self._active.get(run_id)
        if active is not None and not active.completed:
            self._cancel_held(active)

    def _cancel_held(self, active: ActiveRun) -> None:
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
        self._cancel_coroutine(active)

    def _cancel_if_requested(self, active: ActiveRun) -> None:
        """A cancel requested while this runner held the run that the watcher did not act on yet
        (or whose cancel failed) would wait for the next claim once the run is released: cancel
        it now, under the claim if it still holds, else as nobody's run."""
        if active.completed or self.store.closed:
            return  # a request that came too late for a completed run has nothing left to cancel
        try:
            if self.store.cancel_requested(active.run_id) and not self.store.cancel(
                run_id=active.run_id, claim_token=active.token
            ):
                self.store.cancel(run_id=active.run_id)
        except TetherError:
            log.exception("run %s: a requested cancel could not be applied", active.run_id)
