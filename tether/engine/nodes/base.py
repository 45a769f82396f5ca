"""The one small interface between the runner and the node kinds.

A node handler executes one node of a run held by the runner: it begins the node's attempt,
does the node's work, and ends the attempt through the runner's ``StepHost`` calls (each a store
transaction that re-checks the live claim). A handler that releases the run (waiting, sleeping,
backing off, failed) raises ``Parked``; one that completes the node returns, and the runner's
drive loop goes on to the next node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from tether.engine.clock import Clock
from tether.engine.context import Context
from tether.engine.failures import summary
from tether.engine.graph import Node, Workflow
from tether.engine.registry import Registry
from tether.engine.worker.config import RunnerConfig
from tether.engine.worker.state import ActiveRun, Parked
from tether.store import Attempt, Store
from tether.values import Json

T = TypeVar("T")


class StepHost(Protocol):
    """What the runner offers a node handler."""

    store: Store
    config: RunnerConfig
    #: The workflows the runner loaded (a child node names its child workflow's source from it).
    registry: Registry
    clock: Clock

    @property
    def stopping(self) -> bool:
        """Whether the runner is stopping (a long step should give its run back)."""
        ...

    def begin_node(self, active: ActiveRun, node_id: str, timeout_ms: int | None = None) -> Attempt:
        """Begin the node's attempt (or hand out the one begun ahead with the node before it)."""
        ...

    def complete_node(self, active: ActiveRun, attempt: Attempt, output: Json, exit_name: str = "ok") -> None:
        """Finish the attempt completed, with its output and exit."""
        ...

    def fail_node(
        self,
        active: ActiveRun,
        node: Node,
        attempt: Attempt,
        error: str,
        failures: int,
        retries: int,
        backoff_s: float,
        *,
        raised: BaseException | None = None,
        status: str = "failed",
    ) -> None:
        """Finish the attempt failed: back off durably and retry, or fail the run (raises
        ``Parked``); after the last try, follow the node's ``error`` exit when routed (returns)."""
        ...

    def call_step(self, active: ActiveRun, fn: Callable[..., Any], *args: Any) -> Any:
        """Call a node function; an ``async def`` one runs on the runner's event loop while this
        thread waits (a cancel of the run cancels its task: ``CancelledError`` here)."""
        ...

    def needs_deadline(self, active: ActiveRun, node: Node) -> bool:
        """Whether a step of ``node`` runs under a deadline (its own or its run's)."""
        ...

    def call_with_deadline(self, active: ActiveRun, node: Node, ctx: Context, call: Callable[[], T]) -> T:
        """``call()`` under the step's deadline (the node's ``timeout_s``, the run's): raises
        ``StepTimedOut`` or ``RunTimedOut`` once it passed, leaving the call running."""
        ...

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
        """Finish the attempt ``timed_out``: follow the node's ``timeout`` edge when routed
        (returns), else retry or fail like ``fail_node`` (raises ``Parked``)."""
        ...

    def time_out_run(self, active: ActiveRun) -> None:
        """End the run ``timed_out`` (its deadline passed) under the claim; raises ``Parked``."""
        ...

    def ensure(self, done: bool) -> None:
        """Raise ``ClaimLost`` (rolling the transaction back) when a claim-checked write wrote nothing."""
        ...

    def resume_running(self, active: ActiveRun) -> None:
        """Move a run whose durable status is ``waiting`` back to ``running``."""
        ...


class NodeHandler(Protocol):
    """Executes one node of a held run: ``waiting`` is the node's attempt parked for a person,
    ``failures`` the failed tries of the node since it was entered."""

    def __call__(
        self,
        host: StepHost,
        active: ActiveRun,
        wf: Workflow,
        node: Node,
        ctx: Context,
        failures: int,
        waiting: Attempt | None,
    ) -> None: ...


def computed(node: Node, key: str, ctx: Context) -> Json:
    """A spec value of the node, or, when the workflow gave it as a function of the context
    (``node.hooks``), what that function returns for this step."""
    hook = node.hooks.get(key)
    return node.spec.get(key) if hook is None else hook(ctx)


def computed_text(node: Node, key: str, ctx: Context) -> str:
    """A text of the node's spec (a question, a prompt), computed when it is a function: a
    function's result must be a non-empty string."""
    value = computed(node, key, ctx)
    if not isinstance(value, str) or not value:
        raise TypeError(f"the {key} function of node {node.id} returned {value!r}, not a non-empty string")
    return value


def fail_step(
    host: StepHost,
    active: ActiveRun,
    node: Node,
    attempt: Attempt,
    error: BaseException,
    failures: int,
    retries: int,
    backoff_s: float,
) -> None:
    """What a step's own exception (``BaseException`` too: a step's ``sys.exit()`` is the step's
    failure, never the end of the runner's thread) does once its attempt began: after the run's
    cancel it ends the step quietly (raises ``Parked``); otherwise it is the attempt's failure,
    with its traceback: retried, routed on ``error``, or failing the run (``fail_node``)."""
    if active.cancelled.is_set():
        raise Parked("step ended by its run's cancel")
    host.fail_node(active, node, attempt, summary(error), failures, retries, backoff_s, raised=error)
