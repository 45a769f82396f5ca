"""Driving a run: the durable step cursor and the dispatch to the node handlers."""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

from tether.engine.context import Context
from tether.engine.graph import Workflow, is_item
from tether.engine.nodes import HANDLERS
from tether.engine.worker.core import RunnerCore
from tether.engine.worker.progress import ProgressReporter
from tether.engine.worker.state import ActiveRun, Parked
from tether.errors import CancelRequested, ClaimLost, LeaseUnproven, StoreBusy, StoreUnavailable
from tether.store import Attempt
from tether.values import Json

log = logging.getLogger("tether.runner")

#: The exits a step that did not complete leaves by, when its graph routes them.
ROUTED_FAILURES = ("error", "timeout")


class Driving(RunnerCore):
    """Driving a run: the durable step cursor and the dispatch to the node handlers."""

    def _execute(self, active: ActiveRun) -> None:
        try:
            with self.tracing.run(active.run_id, active.run.workflow_name, self.runner_id):
                self._drive(active)
        except Parked as parked:
            # Waiting for a person, sleeping, backing off, failed: the run is let go until then.
            log.info(
                "run %s released: %s", active.run_id, parked, extra=self._fields(active, node=active.step)
            )
        except ClaimLost as lost:
            # An expected refusal: another runner (or a cancel) took the run; nothing was written.
            self.tally.add("stale_writes_refused")
            log.debug("run %s let go: %s", active.run_id, lost, extra=self._fields(active, node=active.step))
        except CancelRequested:
            # A cancel committed before this step could begin: end the run under this claim.
            self._cancel_held(active)
        except (LeaseUnproven, StoreBusy, StoreUnavailable) as error:
            # Passing trouble, not a broken run: hand the run back for any runner to retry.
            log.warning("run %s handed back: %s", active.run_id, error)
            self._hand_back(active)
        except BaseException as error:
            # Whatever a step or a bug raises ends here: the run thread lives on for the next run.
            if self.store.closed:
                log.debug("run %s: its store was closed under it (%s)", active.run_id, error)
                return
            log.exception("run %s: unexpected error", active.run_id)
            self._release_after_error(active, error)
        finally:
            with self._lock:
                self._active.pop(active.run_id, None)
            self._heartbeat_wake.set()
            self._cancel_if_requested(active)

    def _drive(self, active: ActiveRun) -> None:
        run_id, token = active.run_id, active.token
        store = self.store
        if not active.taken_up:
            with store.transaction():
                if not self._take_up(active):
                    return
        workflow = active.workflow
        assert workflow is not None
        while True:
            if active.completed:
                log.info("run %s completed", run_id, extra=self._fields(active))
                return
            if active.cancelled.is_set() or active.lost.is_set():
                return
            if self._stopping.is_set():
                with store.transaction():
                    if active.begun is not None:  # begun ahead, never run: not a takeover
                        store.attempt_finish(
                            run_id=run_id,
                            claim_token=token,
                            attempt_id=active.begun.attempt_id,
                            status="interrupted",
                            error_message="its runner stopped before the node ran",
                        )
                    self._give_back(active)
                log.info("run %s handed back (its runner is stopping)", run_id, extra=self._fields(active))
                return
            attempts, active.attempts = active.attempts or store.attempts(run_id), None
            node_id, failures, waiting = self._cursor(workflow, attempts)
            if node_id is None:
                completed = [a for a in attempts if a.status == "completed"]
                self._finish(active, completed[-1].output if completed else None)
                log.info("run %s completed", run_id, extra=self._fields(active))
                return
            if waiting is None and failures == 0 and self._past_step_bound(active, workflow, attempts):
                return
            current = workflow.nodes[node_id]
            if active.run_deadline is not None and self.clock.monotonic() >= active.run_deadline:
                self.time_out_run(active)
            ctx = Context(
                run_id=run_id,
                node_id=node_id,
                input=active.run.input,
                outputs=self._outputs(attempts),
                attempt=failures + 1,
                origin_session_id=active.run.origin_session_id,
                cancel_signal=active.cancelled,
                progress_sink=ProgressReporter(self.store, active, node_id, failures + 1, self.clock),
                # Only for a step with a deadline: it is set when the step is abandoned.
                abandon_signal=threading.Event() if self.needs_deadline(active, current) else None,
                schedule=_schedule_of(active.run.launch_options),
            )
            handler = HANDLERS[current.kind]
            active.step, active.step_started = node_id, self.clock.monotonic()
            # The fields are built only when INFO is on: this is the hot path of every step.
            told = log.isEnabledFor(logging.INFO)
            if told:
                log.info(
                    "run %s node %s (%s) attempt %d %s",
                    run_id,
                    node_id,
                    current.kind,
                    ctx.attempt,
                    "resumed" if waiting is not None else "started",
                    extra=self._fields(active, node=node_id, attempt=ctx.attempt),
                )
            with self.tracing.step(run_id, workflow.name, node_id, current.kind, ctx.attempt):
                handler(self, active, workflow, current, ctx, failures, waiting)
            if told:
                took = self.clock.monotonic() - active.step_started
                log.info(
                    "run %s node %s finished in %.3f s",
                    run_id,
                    node_id,
                    took,
                    extra=self._fields(active, node=node_id, attempt=ctx.attempt, duration_s=round(took, 6)),
                )

    def call_step(self, active: ActiveRun, fn: Callable[..., Any], *args: Any) -> Any:
        """Call a node function in this step's thread. When it returns an awaitable (an ``async
        def`` function's coroutine), run that on the runner's event loop and wait for its
        result. Once the run is cancelled (or handed back, abandoning the step) the coroutine's
        task is cancelled, and this raises ``CancelledError``."""
        value = fn(*args)
        if not inspect.isawaitable(value):
            return value
        future = self._step_loop.submit(value)
        active.coroutines.add(future)
        try:
            # A cancel or a hand-back that came before the future was recorded did not see it.
            if active.coroutine_cancelled.is_set():
                future.cancel()
            return future.result()
        finally:
            active.coroutines.discard(future)

    def _past_step_bound(self, active: ActiveRun, workflow: Workflow, attempts: list[Attempt]) -> bool:
        """Fail the run (``stepLimit``) when it completed as many steps as its workflow allows
        (``max_steps``) and is about to enter one more: a cycle that never ends stops here."""
        steps = sum(1 for a in attempts if a.status == "completed" and not is_item(a.node_id))
        if steps < workflow.max_steps:
            return False
        store, run_id, token = self.store, active.run_id, active.token
        # A node begun ahead with the step before is settled with the run (it never ran).
        active.begun = None
        with store.transaction():
            self.ensure(
                store.fail(
                    run_id=run_id,
                    claim_token=token,
                    error_code="stepLimit",
                    error_message=(
                        f"Workflow run {run_id} stopped after {steps} steps, the bound of workflow "
                        f"{workflow.name} (max_steps={workflow.max_steps}): a cycle in its graph may "
                        "never end; raise Workflow(max_steps=...) if the run needs more steps"
                    ),
                )
            )
        log.info(
            "run %s failed: step bound %d reached", run_id, workflow.max_steps, extra=self._fields(active)
        )
        return True

    @staticmethod
    def _cursor(workflow: Workflow, attempts: list[Attempt]) -> tuple[str | None, int, Attempt | None]:
        """The node to run next, failed tries of it since it was entered, and its waiting attempt.
        The tries of a fan-out's items are not steps of the graph: the fan-out node's own attempt
        is (it completes once all its items did)."""
        current: str | None = workflow.entry(workflow.start)
        failures = 0
        waiting = None
        for attempt in attempts:
            if is_item(attempt.node_id):
                continue
            # A failed or timed-out attempt that left by its node's ``error`` or ``timeout`` exit
            # is routed like a completed one.
            if attempt.status == "completed" or attempt.exit_name in ROUTED_FAILURES:
                target = workflow.route(attempt.node_id, attempt.exit_name or "ok")
                current = None if target is None else workflow.entry(target)
                failures, waiting = 0, None
            elif attempt.node_id == current:
                if attempt.status in ("failed", "timed_out"):
                    failures += 1
                elif attempt.status == "waiting":
                    waiting = attempt
        return current, failures, waiting

    @staticmethod
    def _outputs(attempts: list[Attempt]) -> dict[str, Json]:
        """Each node's output: its last completed attempt's, or the error of a step that left by
        its ``error`` or ``timeout`` exit (``{"error": ...}``: the exception and its traceback)."""
        return {
            a.node_id: a.output if a.status == "completed" else {"error": a.error_message}
            for a in attempts
            if (a.status == "completed" or a.exit_name in ROUTED_FAILURES) and not is_item(a.node_id)
        }


def _schedule_of(launch_options: Json) -> Json:
    """What a schedule's run is told of its tick (see ``tether.engine.worker.scheduling``)."""
    return launch_options.get("schedule") if isinstance(launch_options, dict) else None
