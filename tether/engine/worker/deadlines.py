"""Step and run deadlines: a step with a deadline runs its callable in a thread of its own, so the
run's thread can stop waiting for it; what becomes of a step, and of a run, past its deadline.

A callable cannot be killed: an abandoned one runs on in its thread until it returns, with its
context's cancellation signal set (``Context.cancelled``), and what it returns is dropped. Its
attempt was recorded ``timed_out`` before anything else of the run moved on, so the store
refuses to settle it again (``attempt_finish`` finishes active attempts only): a late result
can never be recorded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from tether.engine.context import Context
from tether.engine.graph import Node, Workflow, step_timeout_s
from tether.engine.worker.core import RunnerCore
from tether.engine.worker.state import ActiveRun, Parked
from tether.store import Attempt

log = logging.getLogger("tether.runner")

T = TypeVar("T")


class StepTimedOut(Exception):
    """A step passed its own deadline (the node's ``timeout_s``) and was abandoned."""


class RunTimedOut(Exception):
    """A step was abandoned because its run passed the run's deadline (``Workflow(timeout_s=)``)."""


def routes(wf: Workflow, node_id: str, exit_name: str) -> bool:
    """Whether ``exit_name`` of ``node_id`` is routed: by its own ``node.exit`` edge or, for a
    terminal node of an included sub-graph, by the including node's (as ``route`` resolves)."""
    while True:
        if f"{node_id}.{exit_name}" in wf.edges:
            return True
        if node_id in wf.edges or "/" not in node_id:
            return False
        node_id = node_id.rsplit("/", 1)[0]


def run_timed_out_message(run_id: str, timeout_s: float | None) -> str:
    """The error a run that passed its deadline ends with."""
    limit = "" if timeout_s is None else f" ({timeout_s:g} s)"
    return f"Workflow run {run_id} passed its deadline{limit} and was stopped"


class Deadlines(RunnerCore):
    """Step and run deadlines (see the module's docstring)."""

    def needs_deadline(self, active: ActiveRun, node: Node) -> bool:
        """Whether a step of ``node`` runs under a deadline (its own or its run's)."""
        return active.run_deadline is not None or step_timeout_s(node) is not None

    def call_with_deadline(self, active: ActiveRun, node: Node, ctx: Context, call: Callable[[], T]) -> T:
        """``call()`` under the step's deadline: its value (or its exception) when it returns in
        time. Past the node's deadline raises ``StepTimedOut``, past the run's ``RunTimedOut``,
        having set the step's cancellation signal and left the call running in its thread."""
        own = step_timeout_s(node)
        if own is None and active.run_deadline is None:
            return call()  # no deadline: no thread either
        started = self.clock.monotonic()
        limits = [d for d in (None if own is None else started + own, active.run_deadline) if d is not None]
        deadline = min(limits)
        done = threading.Event()
        outcome: list[T] = []
        raised: list[BaseException] = []

        def work() -> None:
            try:
                outcome.append(call())
            # BaseException too: whatever the step raises is the step's failure (see compute).
            except BaseException as error:
                raised.append(error)
            finally:
                done.set()

        threading.Thread(target=work, name=f"tether-step-{active.run_id}-{node.id}", daemon=True).start()
        while not done.is_set() and self.clock.monotonic() < deadline:
            self.clock.wait(done, deadline - self.clock.monotonic())
        if done.is_set():
            if raised:
                raise raised[0]
            return outcome[0]
        if ctx.abandon_signal is not None:
            ctx.abandon_signal.set()
        log.warning(
            "run %s node %s abandoned at its %s deadline",
            active.run_id,
            node.id,
            "run's" if deadline == active.run_deadline else "step's",
            extra=self._fields(active, node=node.id, attempt=ctx.attempt),
        )
        if active.run_deadline is not None and deadline == active.run_deadline:
            raise RunTimedOut(f"workflow run {active.run_id} passed its deadline")
        raise StepTimedOut(f"timed out after {own:g} s" if own is not None else "timed out")

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
        """Record the attempt ``timed_out``; then follow the node's ``timeout`` edge when the graph
        has one (returns: the run goes on there), else retry it like a failure or fail the run
        (raises ``Parked``)."""
        workflow = active.workflow
        if workflow is not None and routes(workflow, attempt.node_id, "timeout"):
            store = self.store
            store.attempt_finish(
                run_id=active.run_id,
                claim_token=active.token,
                attempt_id=attempt.attempt_id,
                status="timed_out",
                exit_name="timeout",
                error_message=error,
            )
            log.info(
                "run %s node %s %s; following its timeout exit",
                active.run_id,
                node.id,
                error,
                extra=self._fields(active, node=node.id, attempt=failures + 1),
            )
            return
        self.fail_node(active, node, attempt, error, failures, retries, backoff_s, status="timed_out")

    def time_out_run(self, active: ActiveRun) -> None:
        """End a held run whose deadline passed ``timed_out`` under its claim: its running step's
        attempt is recorded timed out, what waits for a person closed. Raises ``Parked``."""
        limit = None if active.workflow is None else active.workflow.timeout_s
        self._kill(active)
        self.ensure(
            self.store.time_out(
                run_id=active.run_id,
                claim_token=active.token,
                error_message=run_timed_out_message(active.run_id, limit),
            )
        )
        log.info("run %s timed out", active.run_id, extra=self._fields(active, node=active.step))
        raise Parked("run timed out")
