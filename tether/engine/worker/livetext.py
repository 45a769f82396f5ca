"""The text a model streams while an agent step's turn runs, passed on to the store at a bounded
rate (``agent.text`` journal entries; see ``tether.store.turns``)."""

from __future__ import annotations

import logging
import threading

from tether.engine.clock import Clock
from tether.engine.worker.state import ActiveRun
from tether.errors import TetherError
from tether.store import Store
from tether.store.turns import TEXT_PIECE_LIMIT

log = logging.getLogger("tether.runner")

#: The shortest time between two entries of one turn's streamed text: a model streams a token at
#: a time, the journal gets about two entries a second, each with the text since the last one.
TEXT_EVERY_S = 0.5


class LiveTextReporter:
    """Gathers the text a model streams in one turn (``reporter(piece)``, the provider's
    ``on_text``) and records what came since the last entry when ``every_s`` has passed, in a
    transaction of its own under the run's claim. An entry that cannot be recorded (the claim
    lost, the store busy) is carried by the next one: streamed text never fails a step. The
    rest of the text is not flushed at the end: the recorded turn supersedes it."""

    def __init__(
        self,
        store: Store,
        active: ActiveRun,
        *,
        attempt_id: str,
        node_id: str,
        conversation: str,
        index: int,
        clock: Clock,
        every_s: float = TEXT_EVERY_S,
    ) -> None:
        self.store, self.active, self.clock, self.every_s = store, active, clock, every_s
        self.attempt_id, self.node_id = attempt_id, node_id
        self.conversation, self.index = conversation, index
        self._lock = threading.Lock()
        self._pieces: list[str] = []
        #: How much of the text the journal has.
        self._sent = 0
        self._last: float | None = None

    @property
    def text(self) -> str:
        with self._lock:
            return "".join(self._pieces)

    def __call__(self, piece: str) -> None:
        if not isinstance(piece, str) or not piece:
            return
        with self._lock:
            self._pieces.append(piece)
            now = self.clock.monotonic()
            if self._last is not None and now - self._last < self.every_s:
                return
            if self.active.lost.is_set() or self.active.cancelled.is_set():
                return
            self._last = now
            text = "".join(self._pieces)
            self._pieces = [text]
            offset = self._sent
            new = text[offset : offset + TEXT_PIECE_LIMIT]
            try:
                self.store.agent_text_record(
                    run_id=self.active.run_id,
                    claim_token=self.active.token,
                    attempt_id=self.attempt_id,
                    node_id=self.node_id,
                    conversation=self.conversation,
                    index=self.index,
                    offset=offset,
                    text=new,
                )
            except TetherError as error:
                log.debug(
                    "run %s node %s: streamed text not recorded: %s", self.active.run_id, self.node_id, error
                )
                return
            self._sent = offset + len(new)
