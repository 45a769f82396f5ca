"""The tools ``tether mcp`` offers an agent: each one's name, description, input schema and call.

Every call goes through the public client (``tether.client.Tether``), which holds the validation of
the command line; a refused call raises the client's ``TetherError`` and writes nothing. The
arguments are first checked against the tool's input schema (``InvalidInput`` naming each wrong
argument). This module knows nothing of the protocol: ``tether.mcp.server`` serves the catalogue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tether.client import Tether
from tether.engine.schema import errors as schema_errors
from tether.errors import Conflict, InvalidInput, NotFound
from tether.store import Attempt, Decision, InteractiveRequest, QueueStatus, RunRecord, RunView
from tether.values import Json

#: The longest ``get_run`` waits for a run to settle, in seconds.
MAX_WAIT_S = 60
#: A failed step's error text (its traceback) is cut to its last this many characters.
MAX_ERROR_CHARS = 4000
#: How often ``get_run`` looks at a run it waits for, in seconds.
WAIT_POLL_S = 0.5

STATUSES = [str(s) for s in QueueStatus]

RUN_ID = {
    "type": "string",
    "minLength": 1,
    "maxLength": 200,
    "description": "The run's id, as start_run or list_runs returned it.",
}


def _schema(properties: Mapping[str, Json], required: tuple[str, ...] = ()) -> dict[str, Json]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class Tool:
    """One tool: ``call(tether, arguments, actor)`` returns a JSON object for the agent."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Json]
    call: Callable[[Tether, dict[str, Any], str], dict[str, Json]]
    #: Whether the tool changes runs (left out by ``--read-only``).
    writes: bool = False
    #: Whether it may end work that cannot be taken back (a cancel).
    destructive: bool = False
    #: Whether calling it again with the same arguments changes nothing more.
    idempotent: bool = True


# -- shapes of the answers ---------------------------------------------------------------------
def _attempt(attempt: Attempt) -> dict[str, Json]:
    step: dict[str, Json] = {
        "step": attempt.node_id,
        "status": attempt.status,
        "attempt": attempt.attempt_number,
        "started_at": attempt.started_at,
        "finished_at": attempt.finished_at,
    }
    if attempt.status == "completed":
        step["exit"] = attempt.exit_name
        step["output"] = attempt.output
    if attempt.error_message:
        step["error"] = attempt.error_message[-MAX_ERROR_CHARS:]
    return step


def _run(run: RunRecord) -> dict[str, Json]:
    return {
        "run_id": run.run_id,
        "workflow": run.workflow_name,
        "status": run.status,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "error": None if run.error_code is None else {"code": run.error_code, "message": run.error_message},
    }


def _decision(decision: Decision) -> dict[str, Json]:
    request = decision.request if isinstance(decision.request, dict) else {}
    options = request.get("options")
    return {
        "kind": "decision",
        "decision_id": decision.decision_id,
        "run_id": decision.run_id,
        "step": decision.node_id,
        "question": request.get("question"),
        "options": options,
        "schema": request.get("schema"),
        "deadline_at": decision.deadline_at,
        "created_at": decision.created_at,
        "how_to_answer": (
            f"answer_decision with response one of {', '.join(options)}"
            if options
            else "answer_decision with a response matching the schema"
        ),
    }


def _request(request: InteractiveRequest) -> dict[str, Json]:
    payload = request.payload if isinstance(request.payload, dict) else {}
    return {
        "kind": "input",
        "request_id": request.request_id,
        "run_id": request.run_id,
        "session_id": request.target_session_id,
        "prompt": payload.get("prompt"),
        "schema": payload.get("schema"),
        "created_at": request.created_at,
        "how_to_answer": "submit_input with a payload matching the schema",
    }


# -- reading -----------------------------------------------------------------------------------
def list_workflows(tether: Tether, arguments: dict[str, Any], actor: str) -> dict[str, Json]:
    found = []
    for name in tether.registry.names():
        workflow = tether.registry.get(name)
        found.append(
            {
                "name": workflow.name,
                "description": workflow.description,
                "start": workflow.start,
                "nodes": [{"id": node.id, "kind": node.kind} for node in workflow.nodes.values()],
                "input_schema": workflow.input_schema,
                "needs_session": bool(workflow.needs_session),
            }
        )
    return {"workflows": found}


def get_run(tether: Tether, arguments: dict[str, Any], actor: str) -> dict[str, Json]:
    run_id = arguments["run_id"]
    deadline = time.monotonic() + float(arguments.get("wait_seconds", 0))
    # Woken by the store's change notices; read again at least every WAIT_POLL_S seconds.
    with tether.store.changes.subscription("events") as changed:
        while True:
            changed.clear()
            view = tether.view(run_id)
            left = deadline - time.monotonic()
            if _settled(view) or left <= 0:
                break
            changed.wait(min(WAIT_POLL_S, left))
    result = tether.result(run_id)
    record = tether.store.get_run(run_id)
    waiting = [_decision(d) for d in tether.decisions(run_id)]
    waiting += [_request(r) for r in tether.store.requests(run_id=run_id, status="pending")]
    return {
        "run_id": view.run_id,
        "workflow": view.workflow_name,
        "status": view.status,
        "state": view.run_state_status,
        "paused": view.paused,
        "finished": result.finished,
        "input": None if record is None else record.input,
        "result": result.result if view.status == "done" else None,
        "error": None
        if view.error_code is None
        else {"code": view.error_code, "message": view.error_message},
        "waiting_for": waiting,
        "steps": [_attempt(a) for a in tether.store.attempts(run_id)],
        "created_at": view.created_at,
        "finished_at": view.finished_at,
    }


def _settled(view: RunView) -> bool:
    """Whether a run stands still until someone acts: finished, waiting for a person, paused, or
    parked for an operator."""
    return (
        view.status in ("done", "failed", "cancelled")
        or view.run_state_status == "waiting"
        or view.paused
        or (view.status == "parked" and view.error_code is not None)
    )


def list_runs(tether: Tether, arguments: dict[str, Any], actor: str) -> dict[str, Json]:
    runs = tether.runs(
        status=arguments.get("status"), workflow=arguments.get("workflow"), limit=arguments.get("limit", 20)
    )
    return {"runs": [_run(r) for r in runs]}


def list_waiting(tether: Tether, arguments: dict[str, Any], actor: str) -> dict[str, Json]:
    run_id = arguments.get("run_id")
    if run_id is not None:
        tether.view(run_id)
    decisions = [_decision(d) for d in tether.decisions(run_id)]
    requests = [_request(r) for r in tether.store.requests(run_id=run_id, status="pending")]
    return {"decisions": decisions, "input_requests": requests}


# -- acting ------------------------------------------------------------------------------------
def start_run(tether: Tether, arguments: dict[str, Any], actor: str) -> dict[str, Json]:
    workflow = tether.registry.get(arguments["workflow"])
    run_id = arguments.get("run_id")
    if run_id is not None:
        existing = tether.store.get_run_view(run_id)
        if existing is not None and existing.workflow_name != workflow.name:
            raise Conflict(
                f"Run id {run_id} is already used by a run of workflow {existing.workflow_name}: "
                "choose another run_id (reusing one returns the existing run only for the same "
                "workflow and input)"
            )
    try:
        run = tether.start(
            workflow.name, arguments.get("input"), run_id=run_id, session_id=arguments.get("session_id")
        )
    except Conflict as error:
        if "preparation conflicts" not in str(error):
            raise
        raise Conflict(
            f"Run id {run_id} is already used by a run with a different input or definition: "
            "choose another run_id (reusing one returns the existing run only for the same "
            "workflow and input)"
        ) from None
    return {"run_id": run.run_id, "workflow": run.workflow_name, "status": run.status, "adopted": run.adopted}


def answer_decision(tether: Tether, arguments: dict[str, Any], actor: str) -> dict[str, Json]:
    decision = tether.answer(arguments["decision_id"], arguments["response"], actor_id=actor)
    return {"decision_id": decision.decision_id, "run_id": decision.run_id, "outcome": decision.outcome}


def submit_input(tether: Tether, arguments: dict[str, Any], actor: str) -> dict[str, Json]:
    request_id = arguments["request_id"]
    session_id = arguments.get("session_id")
    if session_id is None:
        pending = [r for r in tether.store.requests(status="pending") if r.request_id == request_id]
        if not pending:
            known = [r for r in tether.store.requests() if r.request_id == request_id]
            if known:
                raise Conflict(f"Input request {request_id} is {known[0].status}, not pending")
            raise NotFound(f"Input request not found: {request_id}")
        session_id = pending[0].target_session_id
    submission = tether.submit(request_id, session_id, arguments["payload"])
    return {"request_id": request_id, "session_id": session_id, "outcome": submission.outcome}


def cancel_run(tether: Tether, arguments: dict[str, Any], actor: str) -> dict[str, Json]:
    outcome = tether.cancel(arguments["run_id"], actor_id=actor)
    return {"run_id": arguments["run_id"], "outcome": outcome}


def pause_run(tether: Tether, arguments: dict[str, Any], actor: str) -> dict[str, Json]:
    tether.pause(arguments["run_id"])
    return {"run_id": arguments["run_id"], "outcome": "paused"}


def resume_run(tether: Tether, arguments: dict[str, Any], actor: str) -> dict[str, Json]:
    tether.resume(arguments["run_id"], actor_id=actor)
    return {"run_id": arguments["run_id"], "outcome": "resumed"}


# -- the catalogue -----------------------------------------------------------------------------
TOOLS: tuple[Tool, ...] = (
    Tool(
        "list_workflows",
        "List workflows",
        "List the workflows this server can start: each one's name, description, steps (id and kind: "
        "compute, decision, input, effect, ...) and input_schema (the JSON Schema start_run checks the "
        "input against; null when any input goes). needs_session: the workflow asks its origin session "
        "for input, so start it with a session_id.",
        _schema({}),
        list_workflows,
    ),
    Tool(
        "start_run",
        "Start a workflow run",
        "Start a durable run of a workflow; a worker process executes it in the background (this tool "
        "returns at once: follow it with get_run). Pass run_id to make the call idempotent: starting "
        "the same workflow with the same input and run_id again returns the existing run "
        "(adopted: true) instead of starting a second one, so retry freely after an error.",
        _schema(
            {
                "workflow": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The workflow's name, as list_workflows gives it.",
                },
                "input": {
                    "description": "The run's input, any JSON value; it must match the workflow's "
                    "input_schema when it has one."
                },
                "run_id": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 200,
                    "description": "An id of your choosing (letters, digits, '.', '_' and '-', starting "
                    "with a letter or digit). Omit it to get a fresh one.",
                },
                "session_id": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The origin session of an interactive run (a workflow with "
                    "needs_session); its input requests are answered with submit_input.",
                },
            },
            ("workflow",),
        ),
        start_run,
        writes=True,
    ),
    Tool(
        "get_run",
        "Get a run",
        "A run's status, result or error, the steps it took (each one's status, output, error) and "
        "what it waits for (open decisions and input requests). status is the queue status (queued, "
        "starting, running, parked, done, failed, cancelled); state is where the workflow stands "
        "(queued, running, waiting: for a person or an operator, completed, failed, timed_out, "
        "cancelled); finished is true once it can change no more. With wait_seconds "
        "it first waits, up to that long, until the run finishes, waits for a person, or is paused.",
        _schema(
            {
                "run_id": RUN_ID,
                "wait_seconds": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": MAX_WAIT_S,
                    "default": 0,
                    "description": f"Wait up to this many seconds (at most {MAX_WAIT_S}) for the run "
                    "to finish or need a person before answering.",
                },
            },
            ("run_id",),
        ),
        get_run,
    ),
    Tool(
        "list_runs",
        "List runs",
        "Runs, newest first, optionally only those in some statuses or of one workflow.",
        _schema(
            {
                "status": {
                    "type": "array",
                    "items": {"type": "string", "enum": STATUSES},
                    "minItems": 1,
                    "uniqueItems": True,
                    "description": 'Only runs in one of these queue statuses, for example ["parked"] or '
                    '["done", "failed"].',
                },
                "workflow": {"type": "string", "minLength": 1, "description": "Only runs of this workflow."},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 500,
                    "default": 20,
                    "description": "At most this many runs.",
                },
            }
        ),
        list_runs,
    ),
    Tool(
        "list_waiting",
        "List what waits for a person",
        "The open decisions (a question with options or a JSON schema, answered with answer_decision) "
        "and pending input requests (a prompt with a JSON schema, answered with submit_input) of all "
        "runs, or of one run. A run waiting for either continues once it is answered.",
        _schema({"run_id": {**RUN_ID, "description": "Only what this run waits for."}}),
        list_waiting,
    ),
    Tool(
        "answer_decision",
        "Answer a decision",
        "Answer an open decision of a run; the run then continues. For a decision with options the "
        "response is one of the option names (a string); for one with a schema, a JSON value matching "
        "it. A decision is answered once: a second answer is refused.",
        _schema(
            {
                "decision_id": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The decision's id, from list_waiting or get_run.",
                },
                "response": {"description": "An option name, or JSON matching the decision's schema."},
            },
            ("decision_id", "response"),
        ),
        answer_decision,
        writes=True,
        idempotent=False,
    ),
    Tool(
        "submit_input",
        "Submit input to a run",
        "Answer a run's pending input request with a payload matching its schema; the run then "
        "continues with it.",
        _schema(
            {
                "request_id": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The input request's id, from list_waiting or get_run.",
                },
                "payload": {"description": "The answer: JSON matching the request's schema."},
                "session_id": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The run's origin session; by default the session the request targets.",
                },
            },
            ("request_id", "payload"),
        ),
        submit_input,
        writes=True,
        idempotent=False,
    ),
    Tool(
        "cancel_run",
        "Cancel a run",
        "Cancel a run: no step of it begins once the cancel is committed, and a running step is told "
        "to stop. outcome is cancelled (done at once) or requested (its worker ends it shortly). A "
        "finished run cannot be cancelled.",
        _schema({"run_id": RUN_ID}, ("run_id",)),
        cancel_run,
        writes=True,
        destructive=True,
    ),
    Tool(
        "pause_run",
        "Pause a run",
        "Pause a run that waits for its session's input: its deadline clock stops until resume_run.",
        _schema({"run_id": RUN_ID}, ("run_id",)),
        pause_run,
        writes=True,
    ),
    Tool(
        "resume_run",
        "Resume a run",
        "Resume a paused run, or put a parked run back in the queue for a worker.",
        _schema({"run_id": RUN_ID}, ("run_id",)),
        resume_run,
        writes=True,
    ),
)


def offered(*, read_only: bool = False) -> list[Tool]:
    """The tools a server offers: all, or with ``read_only`` only those that change nothing."""
    return [tool for tool in TOOLS if not (read_only and tool.writes)]


def call(
    tether: Tether, name: str, arguments: Mapping[str, Any] | None, *, actor: str, read_only: bool = False
) -> dict[str, Json]:
    """Call the tool ``name``: its arguments checked against its input schema first (``InvalidInput``
    naming each wrong one); a writing tool refused in read-only mode, before anything is read."""
    tool = next((t for t in TOOLS if t.name == name), None)
    if tool is None:
        raise NotFound(
            f"Unknown tool {name!r} (known: {', '.join(t.name for t in offered(read_only=read_only))})"
        )
    if read_only and tool.writes:
        raise Conflict(
            f"Tool {name} changes runs, and this server is read-only (tether mcp --read-only): "
            f"it offers only {', '.join(t.name for t in offered(read_only=True))}"
        )
    given = dict(arguments or {})
    problems = schema_errors(given, tool.input_schema)
    if problems:
        raise InvalidInput(
            f"Invalid arguments for {name}: " + "; ".join(p.removeprefix("$.") for p in problems)
        )
    return tool.call(tether, given, actor)
