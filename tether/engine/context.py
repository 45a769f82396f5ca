"""What a node function sees of its run: the run's input, the outputs before it, its attempt, and
its run's cancellation signal."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from tether.engine.cancels import StepCancelled
from tether.values import Json


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
    #: For a run a schedule started: the schedule's ``name``, the ``tick`` (ISO 8601 UTC) it runs
    #: for, and the ticks it ``missed`` before it (catch-up ``one``) with their ``missed_count``.
    schedule: Json = None

    @property
    def cancelled(self) -> bool:
        """Whether the run is being cancelled (the step's result will not be recorded)."""
        return self.cancel_signal.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise ``StepCancelled`` when the run is being cancelled."""
        if self.cancel_signal.is_set():
            raise StepCancelled(f"workflow run {self.run_id} is being cancelled")
