"""A step's progress reports (``ctx.progress``), passed on to the store at a bounded rate."""

from __future__ import annotations

import logging

from tether.engine.clock import Clock
from tether.engine.worker.state import ActiveRun
from tether.errors import TetherError
from tether.store import Store

log = logging.getLogger("tether.runner")

#: The shortest time between two recorded reports of one step (the first report, and one that
#: reaches its total, are always recorded): a step may report in a tight loop, the journal gets
#: about one entry a second.
PROGRESS_EVERY_S = 1.0


class ProgressReporter:
    """Records a step's progress reports in the store, each in its own transaction under the run's
    claim, dropping those that come sooner than ``every_s`` after the last one recorded. A report
    that cannot be recorded (the claim lost, the store busy) is dropped: progress never fails a
    step."""

    def __init__(
        self,
        store: Store,
        active: ActiveRun,
        node_id: str,
        attempt: int,
        clock: Clock,
        every_s: float = PROGRESS_EVERY_S,
    ) -> None:
        self.store, self.active, self.node_id, self.attempt = store, active, node_id, attempt
        self.clock, self.every_s = clock, every_s
        self._last: float | None = None

    def __call__(self, done: float, total: float | None, message: str | None) -> None:
        now = self.clock.monotonic()
        final = total is not None and done >= total
        if self._last is not None and now - self._last < self.every_s and not final:
            return
        if self.active.lost.is_set() or self.active.cancelled.is_set():
            return
        self._last = now
        try:
            self.store.record_progress(
                run_id=self.active.run_id,
                claim_token=self.active.token,
                node_id=self.node_id,
                attempt=self.attempt,
                done=done,
                total=total,
                message=message,
            )
        except TetherError as error:
            log.debug("run %s node %s: progress not recorded: %s", self.active.run_id, self.node_id, error)
