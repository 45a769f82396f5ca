"""What a person may do from the console, shared by the API and the pages.

Each action goes through the client (``tether.client.Tether``), which holds the same validation as
the command line; the console adds only what the client leaves to its caller (finding an input
request's session, checking the answer against the request's schema).
"""

from __future__ import annotations

from typing import Any

from tether.client import Tether
from tether.engine.schema import errors as schema_errors
from tether.errors import Conflict, InvalidInput, NotFound
from tether.store import InteractiveRequest
from tether.values import Json

RUN_ACTIONS = ("cancel", "pause", "resume", "restart")
SCHEDULE_ACTIONS = ("pause", "resume", "remove")


def start(tether: Tether, body: dict[str, Any]) -> dict[str, Any]:
    workflow = body.get("workflow")
    if not isinstance(workflow, str) or not workflow:
        raise InvalidInput("workflow must name a workflow this console knows")
    run_id = body.get("run_id")
    session_id = body.get("session_id")
    for name, value in (("run_id", run_id), ("session_id", session_id)):
        if value is not None and not isinstance(value, str):
            raise InvalidInput(f"{name} must be a string")
    existed = run_id is not None and tether.store.get_run_view(run_id) is not None
    run = tether.start(workflow, body.get("input"), run_id=run_id, session_id=session_id)
    return {"run_id": run.run_id, "status": run.status, "adopted": existed}


def run_action(tether: Tether, run_id: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
    if action == "cancel":
        return {"run_id": run_id, "outcome": tether.cancel(run_id)}
    if action == "pause":
        tether.pause(run_id)
        return {"run_id": run_id, "outcome": "paused"}
    if action == "resume":
        tether.resume(run_id)
        return {"run_id": run_id, "outcome": "resumed"}
    if action == "restart":
        new_run_id, from_node = body.get("new_run_id"), body.get("from_node")
        for name, value in (("new_run_id", new_run_id), ("from_node", from_node)):
            if value is not None and not isinstance(value, str):
                raise InvalidInput(f"{name} must be a string")
        run = tether.restart(
            run_id,
            input=body.get("input"),
            new_run_id=new_run_id or None,
            from_node=from_node or None,
        )
        outcome = "forked" if from_node else "restarted"
        return {"run_id": run_id, "outcome": outcome, "new_run_id": run.run_id}
    raise NotFound(f"Unknown run action: {action}")


def schedule_action(tether: Tether, name: str, action: str) -> dict[str, Any]:
    """Pause, resume or remove a schedule through the client (``remove`` refuses a schedule
    declared in a workflow's code: pause it instead)."""
    if action not in SCHEDULE_ACTIONS:
        raise NotFound(f"Unknown schedule action: {action} (one of {', '.join(SCHEDULE_ACTIONS)})")
    tether.schedule(name)  # NotFound, before any change, for an unknown name
    if action == "remove":
        tether.remove_schedule(name)
        return {"name": name, "outcome": "removed", "changed": True}
    changed = tether.pause_schedule(name) if action == "pause" else tether.resume_schedule(name)
    outcome = "paused" if action == "pause" else "resumed"
    return {"name": name, "outcome": outcome if changed else f"{outcome} already", "changed": changed}


def answer(tether: Tether, decision_id: str, response: Json, actor: str) -> dict[str, Any]:
    decision = tether.answer(decision_id, response, actor_id=actor)
    return {"decision_id": decision.decision_id, "run_id": decision.run_id, "outcome": decision.outcome}


def find_request(tether: Tether, request_id: str) -> InteractiveRequest:
    for request in tether.store.requests(status="pending"):
        if request.request_id == request_id:
            return request
    for request in tether.store.requests():
        if request.request_id == request_id:
            raise Conflict(f"Input request {request_id} is {request.status}, not pending")
    raise NotFound(f"Input request not found: {request_id}")


def request_schema(request: InteractiveRequest) -> dict[str, Any] | None:
    schema = request.payload.get("schema") if isinstance(request.payload, dict) else None
    return schema if isinstance(schema, dict) else None


def submit(tether: Tether, request_id: str, payload: Json) -> dict[str, Any]:
    """Answer a pending input request for the session it targets, checked against its schema."""
    request = find_request(tether, request_id)
    schema = request_schema(request)
    if schema:
        problems = schema_errors(payload, schema)
        if problems:
            raise InvalidInput("Answer does not match the request's schema: " + "; ".join(problems))
    submission = tether.submit(request_id, request.target_session_id, payload)
    return {"request_id": request_id, "run_id": request.run_id, "outcome": submission.outcome}


def resolve_effect(tether: Tether, effect_id: str, outcome: str, actor: str) -> dict[str, Any]:
    effect = tether.store.effect_resolve(effect_id=effect_id, outcome=outcome, actor_id=actor)
    return {"effect_id": effect.effect_id, "run_id": effect.run_id, "status": effect.status}
