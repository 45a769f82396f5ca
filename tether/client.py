"""The client API: start runs, wait for results, control them, answer people's questions.

An application talks to Tether through ``Tether``; an interactive application (a chat, a notebook)
is the run's origin session and uses ``Session`` to receive the run's messages and answer its
input requests.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType

from tether.engine.agentloop import usage_by_node
from tether.engine.forking import plan_fork
from tether.engine.graph import Workflow, is_item
from tether.engine.providers import Usage
from tether.engine.registry import Registry, load_folder, load_module
from tether.engine.schedules import declared_specs
from tether.engine.schema import errors as schema_errors
from tether.errors import Conflict, DeadlinePassed, InvalidInput, NotFound, TetherError
from tether.errors import WaitTimeout as WaitTimeout
from tether.store import (
    AgentMessage,
    Attempt,
    ChildRun,
    Decision,
    Effect,
    InboxEvent,
    InteractiveRequest,
    Lineage,
    LiveText,
    ParentLink,
    Progress,
    QueueStatus,
    RunEvent,
    RunLimit,
    RunRecord,
    RunStatus,
    RunView,
    ScheduleRecord,
    ScheduleSpec,
    Store,
    Submission,
    WorkflowMessage,
    open_store,
)
from tether.store.states import QUEUE_TERMINAL
from tether.values import Json, canonical_json, require_json, require_run_id, require_text

log = logging.getLogger("tether.client")

DEFAULT_STORE = "sqlite:///.tether/tether.db"


@dataclass(frozen=True)
class Started(RunRecord):
    """The run ``start`` reserved or adopted: its ``RunRecord`` and ``adopted`` (True when a run
    with that ``run_id`` existed already and this call wrote nothing)."""

    adopted: bool = field(default=False, compare=False)

    @property
    def reserved(self) -> bool:
        return not self.adopted


@dataclass(frozen=True)
class RunResult:
    """Where a run ended (or stands): queue status, durable status, the output of the node that
    ran last, the error; ``outputs`` holds each node's output (by node id, its last completed
    attempt's) and ``result`` the run's declared result (``Workflow(output=...)``; the last
    node's output when the workflow declares none or is not loaded here)."""

    run_id: str
    status: QueueStatus
    run_state_status: RunStatus
    output: Json
    error_code: str | None
    error_message: str | None
    outputs: dict[str, Json] = field(default_factory=dict)
    result: Json = None

    @property
    def finished(self) -> bool:
        return self.status in QUEUE_TERMINAL


class Tether:
    """A handle on one store and the workflows this process knows."""

    def __init__(
        self,
        store: Store | str = DEFAULT_STORE,
        *,
        workflows: Iterable[Workflow] = (),
        folder: str | Path | None = None,
        modules: Sequence[str] = (),
        project: str = "default",
        migrate: bool = True,
    ) -> None:
        if isinstance(modules, str):
            raise InvalidInput("modules must be a list of module names")
        self._owns_store = not isinstance(store, Store)
        self.store = (
            store if isinstance(store, Store) else open_store(store, project=project, migrate=migrate)
        )
        try:
            self.registry = Registry(workflows)
            if folder is not None:
                load_folder(folder, self.registry)
            for module in modules:
                load_module(module, self.registry)
        except BaseException:
            if self._owns_store:
                self.store.close()
            raise

    def close(self) -> None:
        """Close the store, when this client opened it (from a URL); a ``Store`` passed in stays
        open for its owner."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Tether:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # -- starting and waiting ----------------------------------------------------------------
    def start(
        self,
        workflow: str | Workflow,
        input: Json = None,
        *,
        run_id: str | None = None,
        session_id: str | None = None,
        launch_options: Json = None,
    ) -> Started:
        """Reserve a run (idempotent by ``run_id``: the same call twice adopts the first run;
        ``Started.adopted`` tells which happened).

        With ``session_id`` the run is interactive and belongs to that session; without, it is
        headless, and a workflow with input or notify nodes (which talk to the session) is
        refused. A ``Workflow`` object is registered first: a different definition already
        registered under its name is refused (``Conflict``; ``registry.add(..., replace=True)``
        to swap it). An input that does not match the workflow's ``input_schema`` is refused
        (``InvalidInput`` naming the field, nothing written); with a pydantic model, the run's
        input is the model's validated ``model_dump(mode="json")``."""
        if isinstance(workflow, Workflow):
            self.registry.add(workflow)
            workflow = workflow.name
        if not isinstance(workflow, str) or not workflow:
            raise InvalidInput("workflow must be a workflow name or a Workflow object")
        definition = self.registry.get(workflow)
        if session_id is not None and (not isinstance(session_id, str) or not session_id.strip()):
            raise InvalidInput("session_id must be a non-empty string (or None for a headless run)")
        if session_id is None and definition.needs_session:
            raise InvalidInput(
                f"Workflow {definition.name} talks to its run's session (nodes "
                f"{', '.join(definition.needs_session)}): start it with a session_id"
            )
        run_id = require_run_id(f"run-{uuid.uuid4()}" if run_id is None else run_id)
        require_json("input", input)
        require_json("launch_options", launch_options)
        input = definition.check_input(input)
        limit = _run_limit(definition, input)
        prepared = self.store.reserve_or_adopt(
            run_id=run_id,
            workflow_name=definition.name,
            workflow_source_ref=f"workflow:{definition.name}",
            workflow_source=self.registry.source(definition.name),
            definition_digest=definition.digest,
            definition_snapshot=definition.snapshot(),
            input=input,
            launch_options=launch_options,
            origin_session_id=session_id or f"client-{run_id}",
            execution_mode="interactive" if session_id else "headless",
            limit=limit,
        )
        adopted = prepared.state == "adopted"
        log.info(
            "run %s %s (workflow %s)",
            run_id,
            "adopted" if adopted else "reserved",
            definition.name,
            extra={"run_id": run_id, "workflow": definition.name, "adopted": adopted},
        )
        return _started(prepared.run, adopted=adopted)

    def runs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        workflow: str | None = None,
        limit: int | None = 100,
    ) -> list[RunRecord]:
        """Runs newest first: with ``status`` only those in that queue status (one or a list),
        with ``workflow`` only runs of that workflow, at most ``limit`` (None: all)."""
        statuses = [status] if isinstance(status, str) else None if status is None else list(status)
        if workflow is not None and (not isinstance(workflow, str) or not workflow):
            raise InvalidInput("workflow must be a non-empty workflow name")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidInput("limit must be a whole number from 0, or None")
        if workflow is None:
            return self.store.list_runs(statuses=statuses, limit=limit)
        found = [r for r in self.store.list_runs(statuses=statuses) if r.workflow_name == workflow]
        return found if limit is None else found[:limit]

    def result(self, run_id: str) -> RunResult:
        view = self.store.get_run_view(run_id)
        if view is None:
            raise NotFound(f"Workflow run not found: {run_id}")
        completed = [
            a for a in self.store.attempts(run_id) if a.status == "completed" and not is_item(a.node_id)
        ]
        last = completed[-1].output if completed else None
        outputs = {a.node_id: a.output for a in completed}
        result = last
        if view.workflow_name in self.registry:
            loaded = self.registry.get(view.workflow_name)
            if loaded.digest == view.definition_digest:
                result = loaded.result_of(outputs, last)
        return RunResult(
            run_id,
            QueueStatus(view.status),
            RunStatus(view.run_state_status),
            last,
            view.error_code,
            view.error_message,
            outputs,
            result,
        )

    def wait(self, run_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0) -> RunResult:
        """Block until the run is finished (done, failed or cancelled): woken by the store's change
        notices, and reading at least every ``poll_s`` seconds."""
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s < 0
        ):
            raise InvalidInput("timeout_s must be a non-negative number of seconds (or None)")
        if isinstance(poll_s, bool) or not isinstance(poll_s, int | float) or poll_s <= 0:
            raise InvalidInput("poll_s must be a positive number of seconds")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.store.changes.subscription("events") as changed:
            while True:
                changed.clear()
                result = self.result(run_id)
                if result.finished:
                    return result
                if deadline is not None and time.monotonic() > deadline:
                    raise WaitTimeout(f"Workflow run {run_id} is still {result.status} after {timeout_s} s")
                wait = poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic()))
                changed.wait(wait)

    # -- control -----------------------------------------------------------------------------
    def cancel(self, run_id: str, *, actor_id: str = "operator") -> str:
        """Cancel a run: at once when no runner holds it (``"cancelled"``); else the cancel is
        committed as a request (``"requested"``): from then on no node and no effect of the run
        begins, and its runner, told by change notice, stops the running step and ends the run
        ``cancelled`` (``wait`` to see it end). The child runs the run waits for (``child``
        nodes) are cancelled with it, in the same transaction."""
        try:
            outcome = self.store.request_cancel(run_id=require_run_id(run_id), actor_id=actor_id)
        except TetherError as error:
            log.debug("cancel of run %s refused: %s", run_id, error, extra={"run_id": run_id})
            raise
        log.info("run %s cancel %s by %s", run_id, outcome, actor_id, extra={"run_id": run_id})
        return outcome

    def pause(self, run_id: str) -> None:
        """Pause a run that waits for its session's input: its deadline clock stops."""
        if not self.store.pause_parked(run_id=run_id):
            view = self._view(run_id)
            raise Conflict(
                f"Workflow run {run_id} cannot be paused: only a parked run waiting for its session's input "
                f"can be (it is {view.status}/{view.run_state_status})"
            )

    def resume(self, run_id: str, *, accept_changes: bool = False, actor_id: str = "operator") -> None:
        """Resume a paused input wait, or put a parked run (no-progress, ambiguous effect settled,
        a decision answered) back in the queue.

        ``accept_changes=True``: move a run waiting for a worker with its (older) definition onto
        the definition of its workflow loaded here, continuing after its last completed node;
        refused (``Conflict``, nothing written) unless that node and the node after it exist in
        the new definition. A run whose decision was answered (or whose event came) counts that
        node as its last completed one: it must exist in the new definition as the same kind of
        node, be reached there the way the run reached it, and route the answer on. Journaled as
        ``run.definition_accepted``.

        A run that is already queued, or that waits for an open decision or an event not sent
        yet, is refused (``Conflict`` saying what it waits for): resuming it would change
        nothing."""
        if accept_changes:
            self._accept_changes(run_id, actor_id)
            return
        if self.store.resume_paused_interaction(run_id=run_id):
            return
        still = self._resume_changes_nothing(run_id)
        if still is not None:
            raise Conflict(f"Workflow run {run_id} was not resumed: {still}")
        if not self.store.request_resume(run_id=run_id):
            view = self._view(run_id)
            ambiguous = self.store.effects(run_id=run_id, status="ambiguous")
            why = (
                f"effect {ambiguous[0].effect_id} is ambiguous: resolve it first"
                if ambiguous
                else f"it is {view.status}/{view.run_state_status}"
            )
            raise Conflict(f"Workflow run {run_id} cannot be resumed: {why}")

    def _accept_changes(self, run_id: str, actor_id: str) -> None:
        view = self._view(run_id)
        workflow = self.registry.get(view.workflow_name)
        if workflow.digest == view.definition_digest:
            raise Conflict(
                f"Workflow run {run_id} already uses the definition of {workflow.name} loaded here; "
                "nothing to accept"
            )
        attempts = self.store.attempts(run_id)
        active = [a for a in attempts if a.status in ("pending", "running", "waiting")]
        answered: Attempt | None = None
        if active:
            answered = active[-1]
            exit_name = self._answer_exit(run_id, workflow, answered) if len(active) == 1 else None
            if exit_name is None:
                raise Conflict(
                    f"Workflow run {run_id} cannot move to the new definition: node {answered.node_id} "
                    f"is {answered.status}"
                    + (" and not answered yet" if answered.status == "waiting" else "")
                )
            self._check_reaches(run_id, workflow, attempts, answered, exit_name)
            self.store.accept_definition(
                run_id=run_id,
                definition_digest=workflow.digest,
                definition_snapshot=workflow.snapshot(),
                workflow_source=self.registry.source(workflow.name),
                continue_after=answered.node_id,
                answered_attempt_id=answered.attempt_id,
                actor_id=actor_id,
            )
            return
        completed = [a for a in attempts if a.status == "completed" and not is_item(a.node_id)]
        last = completed[-1] if completed else None
        if last is not None:
            if last.node_id not in workflow.nodes:
                raise Conflict(
                    f"Workflow run {run_id} cannot continue on the new definition of {workflow.name}: "
                    f"its last completed node {last.node_id} no longer exists (restart or cancel it)"
                )
            following = workflow.route(last.node_id, last.exit_name or "ok")
            if following is None or following not in workflow.nodes:
                raise Conflict(
                    f"Workflow run {run_id} cannot continue on the new definition of {workflow.name}: "
                    f"no node follows its last completed node {last.node_id} "
                    f"(exit {last.exit_name or 'ok'}) there (restart or cancel it)"
                )
        self.store.accept_definition(
            run_id=run_id,
            definition_digest=workflow.digest,
            definition_snapshot=workflow.snapshot(),
            workflow_source=self.registry.source(workflow.name),
            continue_after=None if last is None else last.node_id,
            actor_id=actor_id,
        )

    def _answer_exit(self, run_id: str, workflow: Workflow, waiting: Attempt) -> str | None:
        """The exit the run's waiting decision or event node leaves by on ``workflow`` now that
        what it waited for is in (the answer's option, ``ok``, or ``timeout`` for an event whose
        deadline passed); None while it still waits. ``Conflict`` when the new definition has no
        such node to take the answer."""
        decisions = [
            d
            for d in self.store.decisions(run_id=run_id, open_only=False)
            if d.node_id == waiting.node_id and d.created_at >= waiting.started_at
        ]
        node = workflow.nodes.get(waiting.node_id)
        if decisions:
            decision = decisions[-1]
            if decision.outcome != "accepted":
                return None
            if node is None or node.kind != "decision":
                raise Conflict(
                    f"Workflow run {run_id} cannot continue on the new definition of {workflow.name}: "
                    f"its answered decision {waiting.node_id} is no decision node there "
                    "(restart or cancel it)"
                )
            options = node.spec.get("options")
            if options and decision.response not in options:
                raise Conflict(
                    f"Workflow run {run_id} cannot continue on the new definition of {workflow.name}: "
                    f"the answer {canonical_json(decision.response)} to {waiting.node_id} is not one of its "
                    f"options there ({', '.join(map(str, options))}) (restart or cancel it)"
                )
            return str(decision.response) if options else "ok"
        wait = self.store.event_wait(run_id)
        if wait is None or wait.attempt_id != waiting.attempt_id:
            return None
        came = any(e.name == wait.name and e.taken_at is None for e in self.store.inbox(run_id))
        timed_out = wait.deadline_at is not None and wait.deadline_at <= self.store.now()
        if not came and not timed_out:
            return None
        if node is None or node.kind != "event" or node.spec.get("name") != wait.name:
            raise Conflict(
                f"Workflow run {run_id} cannot continue on the new definition of {workflow.name}: "
                f"{waiting.node_id} does not wait for event {wait.name} there (restart or cancel it)"
            )
        return "ok" if came else "timeout"

    def _check_reaches(
        self, run_id: str, workflow: Workflow, attempts: list[Attempt], answered: Attempt, exit_name: str
    ) -> None:
        """``Conflict`` unless ``workflow`` leads the run to its answered node the way the run
        went (from its last completed node, or from the start) and routes the answer's exit on
        to a node it has: a worker with the new definition then settles that node and goes on."""
        before = [
            a
            for a in attempts
            if not is_item(a.node_id) and (a.status == "completed" or a.exit_name in ("error", "timeout"))
        ]
        if before:
            target = workflow.route(before[-1].node_id, before[-1].exit_name or "ok")
            reached = None if target is None or target not in workflow.nodes else workflow.entry(target)
        else:
            reached = workflow.entry(workflow.start)
        if reached != answered.node_id:
            came_from = f"after {before[-1].node_id}" if before else "at its start"
            raise Conflict(
                f"Workflow run {run_id} cannot continue on the new definition of {workflow.name}: "
                f"it does not lead {came_from} to {answered.node_id}, where the run waited "
                "(restart or cancel it)"
            )
        following = workflow.route(answered.node_id, exit_name)
        if following is None or following not in workflow.nodes:
            raise Conflict(
                f"Workflow run {run_id} cannot continue on the new definition of {workflow.name}: "
                f"no node follows its answered node {answered.node_id} (exit {exit_name}) there "
                "(restart or cancel it)"
            )

    def _resume_changes_nothing(self, run_id: str) -> str | None:
        """What the run waits for when putting it back in the queue would change nothing: it is
        queued already, or a worker would find its decision still open or its event not sent
        and park it again. None when resuming may move it on."""
        view = self._view(require_run_id(run_id))
        if view.status == "queued" and not view.paused:
            note = self.waiting_notes([view]).get(run_id)
            if note is not None:
                return (
                    f"it is queued already, and {note}: start a worker with that definition, or "
                    f"move the run onto the one loaded now (tether resume {run_id} --accept-changes)"
                )
            return "it is queued already and waits for a worker to take it"
        if view.status != "parked" or view.run_state_status != "waiting" or view.paused or view.error_code:
            return None
        for decision in self.store.decisions(run_id=run_id, open_only=True):
            return (
                f"it waits for decision {decision.decision_id} (tether answer {decision.decision_id} ANSWER)"
            )
        wait = self.store.event_wait(run_id)
        if wait is not None:
            came = any(e.name == wait.name and e.taken_at is None for e in self.store.inbox(run_id))
            timed_out = wait.deadline_at is not None and wait.deadline_at <= self.store.now()
            if not came and not timed_out:
                return f"it waits for event {wait.name} (tether event send {run_id} {wait.name})"
        return None

    def restart(
        self,
        run_id: str,
        *,
        input: Json = None,
        new_run_id: str | None = None,
        from_node: str | None = None,
        actor_id: str = "operator",
    ) -> RunRecord:
        """Start a new run linked to a finished one (its restart: one per run), on the
        workflow's definition loaded here, pinned to the parent's exact revision; ``input``
        defaults to the parent's.

        ``from_node``: fork at that node: the new run reuses the outputs of the nodes the parent
        completed before it first entered the node (they are not run again, their effects not
        applied again) and starts executing there. Refused, writing nothing, for a node the
        workflow does not have (``InvalidInput``), one the parent never reached, a reused node
        the workflow no longer has, or a path the current definition no longer takes
        (``Conflict``). Journaled in the new run as ``run.forked``; ``lineage`` reads it."""
        parent = self.store.get_run(require_run_id(run_id))
        if parent is None:
            raise NotFound(f"Workflow run not found: {run_id}")
        if parent.status not in QUEUE_TERMINAL:
            raise Conflict(
                f"Workflow run {run_id} is {parent.status}: only a finished run can be restarted "
                "(wait for it to finish, or cancel it)"
            )
        later = self.store.lineage(run_id).child_run_id
        if later is not None:
            raise Conflict(
                f"Workflow run {run_id} was already restarted as {later}: a run has one restart "
                f"(restart or fork {later} instead)"
            )
        if input is not None:
            require_json("input", input)
        definition = self.registry.get(parent.workflow_name)
        revision = self.store.run_revision(run_id)
        given = parent.input if input is None else definition.check_input(input)
        reservation = dict(
            run_id=require_run_id(new_run_id or f"{parent.root_run_id}-r{parent.restart_number + 1}"),
            workflow_name=definition.name,
            workflow_source_ref=f"workflow:{definition.name}",
            workflow_source=self.registry.source(definition.name),
            definition_digest=definition.digest,
            definition_snapshot=definition.snapshot(),
            input=given,
            launch_options=parent.launch_options,
            origin_session_id=self.store.run_origin(run_id) or "",
            execution_mode=parent.execution_mode,
            limit=_run_limit(definition, given),
        )
        if from_node is None:
            return self.store.reserve(
                **reservation, parent_run_id=run_id, lineage_kind="restart", parent_run_revision=revision
            )
        reused = plan_fork(definition, self.store.attempts(run_id), run_id, from_node)
        child = self.store.run_fork(
            **reservation,
            parent_run_id=run_id,
            parent_run_revision=revision,
            from_node=definition.entry(from_node),
            copy_nodes=[a.node_id for a in reused],
            actor_id=actor_id,
        )
        log.info(
            "run %s forked from %s at %s (reusing %d outputs)",
            child.run_id,
            run_id,
            from_node,
            len(reused),
            extra={"run_id": child.run_id, "parent_run_id": run_id, "node": from_node},
        )
        return child

    def lineage(self, run_id: str) -> Lineage:
        """The run's place in its restart family: the run it restarts (and for a fork, the node
        it started at and the nodes whose outputs it reused) and the run that restarts it."""
        return self.store.lineage(require_run_id(run_id))

    def children(self, run_id: str) -> list[ChildRun]:
        """The child runs the run's ``child`` nodes started, oldest first, each with the node
        that started it, whether that node waits for it, and its status (``NotFound`` for an
        unknown run)."""
        self._view(require_run_id(run_id))
        return self.store.children(run_id)

    def parent(self, run_id: str) -> ParentLink | None:
        """The run (and its node) that started this one as a child run; None when it is not a
        child run (``NotFound`` for an unknown run)."""
        self._view(require_run_id(run_id))
        return self.store.parent_of(run_id)

    def resolve_effect(self, effect_id: str, outcome: str, *, actor_id: str = "operator") -> Effect:
        """An operator's decision on an ambiguous effect (``applied``, ``rejected`` or ``retry``);
        in the same transaction the run goes back in the queue once no effect of it is ambiguous
        any more, so it continues (or fails, for ``rejected``) without a separate resume."""
        with self.store.transaction():
            effect = self.store.effect_resolve(effect_id=effect_id, outcome=outcome, actor_id=actor_id)
            # Refused, writing nothing, while another effect of the run is still ambiguous, or
            # for a finished run.
            self.store.request_resume(run_id=effect.run_id)
        log.info(
            "effect %s of run %s resolved %s by %s",
            effect_id,
            effect.run_id,
            outcome,
            actor_id,
            extra={"run_id": effect.run_id, "effect_id": effect_id},
        )
        return effect

    # -- events into runs --------------------------------------------------------------------
    def send_event(
        self, run_id: str, name: str, payload: Json = None, *, actor_id: str = "operator"
    ) -> InboxEvent:
        """Send an event into a run: a ``wait_for_event`` node of the run waiting for ``name``
        takes it (now, or when the run gets there: it is kept until then); each event is taken
        once. Refused, writing nothing, when the run's workflow has no such node
        (``InvalidInput``), the payload breaks the node's schema (``InvalidInput`` naming the
        field), or the run is finished (``Conflict``)."""
        run_id = require_run_id(run_id)
        if not isinstance(name, str) or not name:
            raise InvalidInput("name must be the non-empty name of an event the run waits for")
        require_json("payload", payload)
        snapshot = self.store.run_definition_snapshot(run_id)
        nodes = snapshot.get("nodes") if isinstance(snapshot, dict) else None
        waits = [
            node
            for node in (nodes.values() if isinstance(nodes, dict) else ())
            if isinstance(node, dict) and node.get("kind") == "event"
        ]
        matching = [node for node in waits if node.get("name") == name]
        if not matching:
            known = sorted({str(node.get("name")) for node in waits})
            raise InvalidInput(
                f"Workflow run {run_id} waits for no event named {name!r} "
                f"(its events: {', '.join(known) if known else 'none'})"
            )
        for node in matching:
            schema = node.get("schema")
            if isinstance(schema, dict):
                problems = schema_errors(payload, schema)
                if problems:
                    raise InvalidInput(f"Event {name} does not match its schema: " + "; ".join(problems))
        sent = self.store.event_send(run_id=run_id, name=name, payload=payload, sent_by=actor_id)
        log.info("event %s sent into run %s by %s", name, run_id, actor_id, extra={"run_id": run_id})
        return sent

    # -- schedules ---------------------------------------------------------------------------
    def add_schedule(
        self,
        workflow: str,
        cron: str,
        *,
        tz: str = "UTC",
        input: Json = None,
        name: str | None = None,
        catch_up: str = "skip",
    ) -> ScheduleRecord:
        """Add a cron schedule that starts a headless run of ``workflow`` (loaded here) with
        ``input`` at every tick of ``cron`` in the time zone ``tz``; named ``name`` (default: the
        workflow's name). Workers that loaded the workflow fire it, one run per tick however
        many run. ``catch_up``: what happens to ticks missed while no worker ran: ``skip`` (no
        run for them) or ``one`` (one run for all of them). A bad cron expression, zone, policy
        or input is refused (``InvalidInput``; the input is checked against the workflow's
        ``input_schema`` as ``start`` checks it), a name taken (``Conflict``); nothing is written."""
        if not isinstance(workflow, str) or not workflow:
            raise InvalidInput("workflow must be a workflow name")
        definition = self.registry.get(workflow)
        if definition.needs_session:
            raise InvalidInput(
                f"Workflow {definition.name} talks to its run's session (nodes "
                f"{', '.join(definition.needs_session)}): a scheduled run has none, so it cannot be scheduled"
            )
        require_json("input", input)
        definition.check_input(input)
        spec = ScheduleSpec(
            name=definition.name if name is None else name,
            workflow_name=definition.name,
            cron=cron,
            timezone=tz,
            input=input,
            catch_up=catch_up,
        )
        added = self.store.schedule_add(spec)
        log.info("schedule %s added (workflow %s, %s %s)", added.name, workflow, cron, tz)
        return added

    def schedules(self, *, workflow: str | None = None) -> list[ScheduleRecord]:
        """The schedules by name (declared by code and added at run time), with ``workflow`` only
        that workflow's."""
        if workflow is not None and (not isinstance(workflow, str) or not workflow):
            raise InvalidInput("workflow must be a non-empty workflow name")
        return self.store.schedules(workflow_name=workflow)

    def schedule(self, name: str) -> ScheduleRecord:
        """The schedule of that name (``NotFound`` for an unknown one)."""
        found = self.store.schedule(name)
        if found is None:
            raise NotFound(f"Schedule not found: {name} (`tether schedule list` shows them)")
        return found

    def pause_schedule(self, name: str) -> bool:
        """Pause a schedule: no tick fires until it is resumed. False when it was paused already."""
        return self.store.schedule_set_paused(name, True)

    def resume_schedule(self, name: str) -> bool:
        """Resume a paused schedule from its next tick (ticks that passed while it was paused
        start nothing). False when it was not paused."""
        return self.store.schedule_set_paused(name, False)

    def remove_schedule(self, name: str) -> None:
        """Delete a schedule added at run time (its runs stay); one declared in a workflow's code
        is refused (``Conflict``): remove it from the code, or pause it."""
        self.store.schedule_remove(name)
        log.info("schedule %s removed", name)

    def declare_schedules(self) -> list[str]:
        """Write the schedules the workflows loaded here declare (``Workflow(schedules=...)``),
        as a worker does when it starts: new and changed ones due from their next tick, the
        declared ones these workflows no longer have deleted. The names written or deleted."""
        changed: list[str] = []
        for name in self.registry.names():
            workflow = self.registry.get(name)
            changed += self.store.schedules_declare(name, declared_specs(name, workflow.schedules))
        return changed

    # -- people ------------------------------------------------------------------------------
    def decisions(self, run_id: str | None = None, *, open_only: bool = True) -> list[Decision]:
        return self.store.decisions(run_id=run_id, open_only=open_only)

    def answer(self, decision_id: str, response: Json, *, actor_id: str = "human") -> Decision:
        """Answer an open decision; the run continues on the next claim."""
        found = self.store.decisions(decision_id=decision_id)
        if not found:
            raise NotFound(f"Decision not found: {decision_id}")
        if found[0].outcome is not None:
            # Refuse before the store call: resolving a resolved decision stores the response blob.
            if found[0].provenance in ("timeout_policy", "expired_no_default"):
                closed = found[0].resolved_at.isoformat() if found[0].resolved_at else "its deadline"
                raise DeadlinePassed(
                    f"Decision {decision_id} closed at {closed}: "
                    + (
                        f"its deadline passed and the default {canonical_json(found[0].response)} applied"
                        if found[0].outcome == "accepted"
                        else f"{found[0].reason or 'its deadline passed'}; there is nothing to answer"
                    )
                )
            raise Conflict(f"Decision {decision_id} was already resolved")
        request = found[0].request if isinstance(found[0].request, dict) else {}
        options, schema = request.get("options"), request.get("schema")
        if options and response not in options:
            raise InvalidInput(f"Answer must be one of {', '.join(options)}")
        if schema:
            problems = schema_errors(response, schema)
            if problems:
                raise InvalidInput("Answer does not match the decision's schema: " + "; ".join(problems))
        resolved = self.store.decision_resolve(
            decision_id=decision_id,
            outcome="accepted",
            provenance="human",
            response=response,
            actor_id=actor_id,
        )
        if resolved is None:
            raise Conflict(f"Decision {decision_id} was already resolved")
        self.store.request_resume(run_id=resolved.run_id)
        log.info(
            "decision %s of run %s answered by %s",
            decision_id,
            resolved.run_id,
            actor_id,
            extra={"run_id": resolved.run_id, "decision_id": decision_id},
        )
        return resolved

    def submit(self, request_id: str, session_id: str, payload: Json) -> Submission:
        """Answer an input request of the session's run. The payload is checked against the
        request's schema at once (``InvalidInput`` naming the field, nothing written); the run
        then takes it up on its next claim."""
        if not isinstance(request_id, str) or not request_id:
            raise InvalidInput("request_id must be a non-empty string")
        if not isinstance(session_id, str) or not session_id:
            raise InvalidInput("session_id must be a non-empty string")
        found = [r for r in self.store.requests(session_id=session_id) if r.request_id == request_id]
        if found:
            body = found[0].payload if isinstance(found[0].payload, dict) else {}
            schema = body.get("schema")
            if isinstance(schema, dict):
                problems = schema_errors(payload, schema)
                if problems:
                    raise InvalidInput("Input does not match the request's schema: " + "; ".join(problems))
        return self.store.submit(request_id=request_id, session_id=session_id, payload=payload)

    def session(self, session_id: str) -> Session:
        return Session(self, session_id)

    # -- reading -----------------------------------------------------------------------------
    def events(
        self, after: int = 0, *, run_id: str | None = None, follow: bool = False, poll_s: float = 1.0
    ) -> Iterator[RunEvent]:
        """The journal after ``after``; with ``follow`` it waits for new events, woken by the
        store's change notices (push on PostgreSQL, a 2 to 20 ms poll on SQLite) and reading at least
        every ``poll_s`` seconds."""
        if not follow:
            while True:
                batch = self.store.events_after(after, run_id=run_id, limit=500)
                yield from batch
                if len(batch) < 500:
                    return
                after = batch[-1].seq
        with self.store.changes.subscription("events") as changed:
            while True:
                changed.clear()
                batch = self.store.events_after(after, run_id=run_id, limit=500)
                for event in batch:
                    after = event.seq
                    yield event
                if len(batch) < 500:
                    changed.wait(poll_s)

    def waiting_notes(self, views: Iterable[RunView]) -> dict[str, str]:
        """Why runs that wait for a worker are not taken: by run id, for each run waiting in the
        queue whose workflow no live worker has loaded at the run's definition (a worker claims
        only runs of the definitions it loaded)."""
        waiting = [v for v in views if _waits_for_a_worker(v)]
        if not waiting:
            return {}
        served = self.store.live_definition_digests()
        return {
            v.run_id: f"no live worker has workflow {v.workflow_name} at this definition "
            f"({v.definition_digest[:19]}...)"
            for v in waiting
            if v.definition_digest not in served
        }

    def progress(self, run_id: str) -> dict[str, Progress]:
        """The latest progress each step of the run reported (``ctx.progress``), by node id:
        ``done``, ``total``, ``message``, ``fraction`` and ``seconds_left``."""
        self._view(require_run_id(run_id))
        return self.store.latest_progress(run_id)

    def slot_waits(self, views: Iterable[RunView]) -> dict[str, str]:
        """Why runs that wait for a worker are not taken yet: by run id, for each run waiting in
        the queue under a concurrency limit whose slots other runs all hold (``waiting for a slot
        of customer_id=acme (1 of 1 in use)``)."""
        waiting = [v.run_id for v in views if _waits_for_a_worker(v)]
        if not waiting:
            return {}
        return {run_id: wait.text for run_id, wait in self.store.slot_waits(waiting).items()}

    def conversation(self, run_id: str, node_id: str | None = None) -> list[AgentMessage]:
        """The messages of the run's agent steps in the order they were recorded (one node's with
        ``node_id``): each prompt, model response, tool result and correction, with the node,
        the conversation (the attempt that began it) and its place in it."""
        self._view(require_run_id(run_id))
        if node_id is not None:
            require_text("node_id", node_id, limit=1000)
        return self.store.agent_messages(run_id, node_id=node_id)

    def live_text(self, run_id: str) -> dict[str, LiveText]:
        """The text the run's agent steps' models are streaming in turns not recorded yet, by
        node id: a live view (written at most a few times a second while a turn runs), which the
        recorded turn (``conversation``) supersedes. Empty when no turn is streaming."""
        self._view(require_run_id(run_id))
        return self.store.live_text(run_id)

    def usage(self, run_id: str) -> dict[str, Usage]:
        """The tokens the run's agent steps used, from their recorded turns, summed by node id
        (turns whose provider reported no usage count nothing; a run without agent steps gives
        ``{}``). ``sum(u.total for u in usage.values())`` is the run's total."""
        self._view(require_run_id(run_id))
        return usage_by_node(self.store.agent_messages(run_id))

    def due_at(self, run_ids: Iterable[str]) -> dict[str, datetime]:
        """When each of these runs, waiting for a worker, may be taken next: a queued run's start,
        a retry after its backoff, the end of a durable sleep (by run id; runs held, finished or
        waiting for a person are left out)."""
        ids = list(run_ids)
        for run_id in ids:
            require_run_id(run_id)
        return self.store.due_at(ids)

    def view(self, run_id: str) -> RunView:
        """The run as a viewer sees it (``NotFound`` for an unknown run)."""
        return self._view(run_id)

    def _view(self, run_id: str) -> RunView:
        view = self.store.get_run_view(run_id)
        if view is None:
            raise NotFound(f"Workflow run not found: {run_id}")
        return view


def _run_limit(definition: Workflow, input: Json) -> RunLimit | None:
    """The concurrency limit a run of ``definition`` with ``input`` counts against, if any
    (``InvalidInput`` naming the key when the input has no value for it)."""
    if definition.concurrency is None:
        return None
    return definition.concurrency.run_limit(definition.name, input)


def _waits_for_a_worker(view: RunView) -> bool:
    """Whether the run waits in the queue for any worker (not for a person, a pause, an operator)."""
    if view.status == "queued":
        return True
    return (
        view.status == "parked"
        and view.run_state_status != "waiting"
        and not view.paused
        and view.error_code is None
    )


class Session:
    """An origin session: the conversation an interactive run talks to."""

    def __init__(self, client: Tether, session_id: str) -> None:
        self.client = client
        self.session_id = session_id

    def start(self, workflow: str | Workflow, input: Json = None, *, run_id: str | None = None) -> Started:
        return self.client.start(workflow, input, run_id=run_id, session_id=self.session_id)

    def messages(self, *, pending_only: bool = True) -> list[WorkflowMessage]:
        return self.client.store.messages(
            session_id=self.session_id, status="pending" if pending_only else None
        )

    def ack(self, message_id: str) -> bool:
        return self.client.store.message_ack(session_id=self.session_id, message_id=message_id)

    def pending_inputs(self) -> list[InteractiveRequest]:
        return self.client.store.requests(session_id=self.session_id, status="pending")

    def submit(self, request_id: str, payload: Json) -> Submission:
        return self.client.submit(request_id, self.session_id, payload)


def _started(run: RunRecord, *, adopted: bool) -> Started:
    values = {name: getattr(run, name) for name in RunRecord.__dataclass_fields__}
    return Started(**values, adopted=adopted)
