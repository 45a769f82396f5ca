"""How a runner hears that a run it holds was cancelled, and how a step sees it.

A cancel is a store operation (``Store.request_cancel``): once it commits, the store refuses to
begin any node or effect of the run. The holder hears of it by change notice (the request is a
journal event: ``NOTIFY`` on PostgreSQL, the data_version poll on SQLite), not at its next lease
renewal: ``CancelWatcher`` listens while the runner holds runs and asks the store which of them
have a cancel requested. The runner then kills a running command, sets the run's cancellation
signal (``Context.cancelled``) and ends the run ``cancelled`` under its claim.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tether.errors import TetherError
from tether.store import Store

log = logging.getLogger("tether.runner")

#: The longest the watcher waits without a notice before asking anyway (a lost notice costs at
#: most this much latency).
WATCH_POLL_S = 0.5
#: The shortest gap between two questions to the store: while the journal grows fast (a busy
#: runner), notices come every few milliseconds, and one read per gap is enough.
WATCH_GAP_S = 0.05


class StepCancelled(Exception):
    """Raised by ``Context.raise_if_cancelled()`` in a step whose run is being cancelled."""


class CancelWatcher:
    """A thread that calls ``on_cancel(run_id)`` for each held run whose cancel was requested.

    ``held()`` names the runs the runner holds; the watcher listens for notices only while it
    holds any (a SQLite watcher polls only while someone listens)."""

    def __init__(
        self,
        store: Store,
        held: Callable[[], list[str]],
        on_cancel: Callable[[str], None],
        stopped: Callable[[], bool],
    ) -> None:
        self.store = store
        self.held = held
        self.on_cancel = on_cancel
        self.stopped = stopped
        #: Set by the runner when it takes a run: a watcher not listening starts at once.
        self.nudge = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tether-cancels", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _watch(self) -> None:
        noticed = threading.Event()
        listening = False
        try:
            while not self.stopped():
                held = self.held()
                if bool(held) != listening:
                    listening = not listening
                    if listening:
                        self.store.changes.subscribe("events", noticed)
                        noticed.set()  # ask once now: a request may predate listening
                    else:
                        self.store.changes.unsubscribe("events", noticed)
                if not listening:
                    self.nudge.wait(WATCH_GAP_S)
                    self.nudge.clear()
                    continue
                noticed.wait(WATCH_POLL_S)
                noticed.clear()
                try:
                    requested = self.store.cancel_requests(self.held())
                except TetherError as error:
                    log.warning("could not read cancel requests: %s", error)
                    requested = []
                for run_id in requested:
                    try:
                        self.on_cancel(run_id)
                    except Exception:
                        log.exception("run %s: acting on its cancel failed", run_id)
                time.sleep(WATCH_GAP_S)
        finally:
            if listening:
                self.store.changes.unsubscribe("events", noticed)
