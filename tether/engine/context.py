"""What a node function sees of its run: the run's input, the outputs before it, its attempt, its
run's cancellation signal, and a way to report its progress."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tether.engine.cancels import StepCancelled
from tether.store.progress import check_progress
from tether.values import Json


@dataclass(frozen=True)
class Context:
    """What a node function sees. A long step should look at ``cancelled`` (or call
    ``raise_if_cancelled()``) now and then: once its run is cancelled, or the step passed its
    deadline (the node's ``timeout_s`` or the run's), its result is not recorded and the sooner
    it returns, the sooner its thread is free."""

    run_id: str
    node_id: str
    input: Json
    outputs: Mapping[str, Json]
    attempt: int
    origin_session_id: str | None
    cancel_signal: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    #: Where ``progress`` reports go (the runner's, rate-limited); None outside a runner.
    progress_sink: Callable[[float, float | None, str | None], None] | None = field(
        default=None, repr=False, compare=False
    )
    #: Set when the runner abandoned this step at its deadline.
    abandon_signal: threading.Event | None = field(default=None, repr=False, compare=False)
    #: For a run a schedule started: the schedule's ``name``, the ``tick`` (ISO 8601 UTC) it runs
    #: for, and the ticks it ``missed`` before it (catch-up ``one``) with their ``missed_count``.
    schedule: Json = None

    @property
    def cancelled(self) -> bool:
        """Whether the run is being cancelled or the step was abandoned at its deadline (either
        way the step's result will not be recorded)."""
        return self.cancel_signal.is_set() or (
            self.abandon_signal is not None and self.abandon_signal.is_set()
        )

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report how far the step has come: ``done`` of ``total`` (None when unknown), with a
        short message. ``tether watch``, ``show`` and the console show the latest report, with an
        estimate of the time left. Reports are recorded at most about once a second (the last
        one, ``done == total``, always), so calling this in a tight loop is cheap. A report never
        fails the step: a bad value raises ``InvalidInput`` here, before anything is recorded."""
        counted, whole, text = check_progress(done, total, message)
        if self.progress_sink is not None:
            self.progress_sink(counted, whole, text)

    def raise_if_cancelled(self) -> None:
        """Raise ``StepCancelled`` when the run is being cancelled or the step passed its deadline."""
        if self.cancel_signal.is_set():
            raise StepCancelled(f"workflow run {self.run_id} is being cancelled")
        if self.abandon_signal is not None and self.abandon_signal.is_set():
            raise StepCancelled(f"node {self.node_id} of workflow run {self.run_id} passed its deadline")
