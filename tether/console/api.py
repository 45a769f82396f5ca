"""The JSON HTTP API under ``/api/v1``, and the OpenAPI document that describes it.

Every endpoint is one row of ``ENDPOINTS``: the routes and the OpenAPI document are both built from
that table, so they cannot drift apart. Store calls block, so they run in the thread pool.
Errors are ``{"error": {"code": ..., "message": ...}}`` with the library's message; the HTTP status
comes from ``ERROR_STATUSES`` (the one place that maps ``TetherError.code`` to a status).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tether import __version__ as tether_version
from tether.client import Tether, WaitTimeout
from tether.console import actions, views
from tether.console.auth import Principal
from tether.errors import (
    ClaimLost,
    Conflict,
    IllegalTransition,
    InconsistentState,
    InvalidInput,
    NotFound,
    SchemaOutdated,
    SchemaTooNew,
    StoreBusy,
    StoreUnavailable,
    TetherError,
)
from tether.values import Json

PREFIX = "/api/v1"
#: HTTP status per error type (the first match in order wins).
ERROR_STATUSES: list[tuple[type[TetherError], int]] = [
    (NotFound, 404),
    (InvalidInput, 422),
    (Conflict, 409),
    (IllegalTransition, 409),
    (InconsistentState, 409),
    (ClaimLost, 409),
    (WaitTimeout, 504),
    (StoreBusy, 503),
    (StoreUnavailable, 503),
    (SchemaOutdated, 503),
    (SchemaTooNew, 503),
    (TetherError, 500),
]
#: How long a journal stream waits for a change notice before it reads anyway, and between
#: keep-alive comments when nothing happens.
STREAM_POLL_S = 1.0
#: How often a journal stream looks at its change notice while it waits.
NOTICE_CHECK_S = 0.1
KEEPALIVE_S = 15.0


def error_status(error: TetherError) -> int:
    return next(status for kind, status in ERROR_STATUSES if isinstance(error, kind))


def error_response(error: TetherError) -> JSONResponse:
    return JSONResponse({"error": {"code": error.code, "message": error.message}}, error_status(error))


def client(request: Request) -> Tether:
    tether: Tether = request.app.state.tether
    return tether


def principal(request: Request) -> Principal:
    found: Principal = request.state.principal
    return found


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidInput(f"The request body is not valid JSON: {error}") from None
    except RecursionError:
        raise InvalidInput("The request body nests too deeply") from None
    if not isinstance(body, dict):
        raise InvalidInput("The request body must be a JSON object")
    return body


def flag(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


# -- handlers --------------------------------------------------------------------------------
async def list_runs(request: Request) -> Response:
    query = request.query_params
    offset, limit = views.page_numbers(query.get("offset"), query.get("limit"))
    found = await run_in_threadpool(
        views.list_runs,
        client(request),
        status=query.get("status") or None,
        workflow=query.get("workflow") or None,
        search=query.get("q") or None,
        offset=offset,
        limit=limit,
    )
    return JSONResponse(found)


async def list_revision(request: Request) -> Response:
    current = await run_in_threadpool(client(request).store.list_revision)
    return JSONResponse({"total": current.total, "revision": current.revision})


async def start_run(request: Request) -> Response:
    body = await json_body(request)
    started = await run_in_threadpool(actions.start, client(request), body)
    return JSONResponse(started, 200 if started["adopted"] else 201)


async def get_run(request: Request) -> Response:
    return JSONResponse(
        await run_in_threadpool(views.run_detail, client(request), request.path_params["run_id"])
    )


def _events(tether: Tether, run_id: str | None, after: int, limit: int) -> list[Any]:
    if run_id is not None:
        views.require_view(tether, run_id)
    events: list[Any] = views.plain(tether.store.events_after(after, run_id=run_id, limit=limit))
    return events


def _after(request: Request) -> int:
    text = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    try:
        after = int(text)
    except ValueError:
        raise InvalidInput("after (or Last-Event-ID) must be a journal sequence number") from None
    if after < 0:
        raise InvalidInput("after (or Last-Event-ID) must not be negative")
    return after


async def run_events(request: Request) -> Response:
    run_id = request.path_params.get("run_id")
    _, limit = views.page_numbers(None, request.query_params.get("limit") or "500")
    events = await run_in_threadpool(_events, client(request), run_id, _after(request), limit)
    return JSONResponse({"events": events})


async def stream_events(request: Request) -> Response:
    """The journal as Server-Sent Events from ``Last-Event-ID`` (or ``?after=``): each event's
    ``id`` is its journal sequence, so a reconnecting browser resumes without loss. ``?follow=0``
    ends the stream once the backlog is sent."""
    tether = client(request)
    run_id = request.path_params.get("run_id")
    after = _after(request)
    follow = request.query_params.get("follow", "1") != "0"
    if run_id is not None:
        await run_in_threadpool(views.require_view, tether, run_id)
    return StreamingResponse(
        _event_stream(tether, run_id, after, follow),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


async def _event_stream(tether: Tether, run_id: str | None, after: int, follow: bool) -> AsyncIterator[bytes]:
    store = tether.store
    yield b"retry: 2000\n\n"
    with store.changes.subscription("events") as changed:
        quiet = 0.0
        while True:
            changed.clear()
            batch = await run_in_threadpool(store.events_after, after, run_id=run_id, limit=500)
            for event in batch:
                after = event.seq
                data = json.dumps(views.plain(event), separators=(",", ":"))
                yield f"id: {event.seq}\ndata: {data}\n\n".encode()
            if len(batch) == 500:
                continue
            if not follow:
                return
            # Wait on the change notice without holding a worker thread: a thread per open page
            # would soon exhaust the pool that every other request needs.
            waited = 0.0
            while not changed.is_set() and waited < STREAM_POLL_S:
                await anyio.sleep(NOTICE_CHECK_S)
                waited += NOTICE_CHECK_S
            quiet = 0.0 if changed.is_set() else quiet + waited
            if quiet >= KEEPALIVE_S:
                quiet = 0.0
                yield b": keep-alive\n\n"


async def run_action(request: Request) -> Response:
    body = await json_body(request)
    done = await run_in_threadpool(
        actions.run_action,
        client(request),
        request.path_params["run_id"],
        request.path_params["action"],
        body,
    )
    return JSONResponse(done)


async def send_event(request: Request) -> Response:
    body = await json_body(request)
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput("The body must name the event as name (and may carry its payload)")
    sent = await run_in_threadpool(
        functools.partial(
            client(request).send_event,
            request.path_params["run_id"],
            name,
            body.get("payload"),
            actor_id=principal(request).actor,
        )
    )
    return JSONResponse({"event": views.plain(sent)}, status_code=201)


async def list_decisions(request: Request) -> Response:
    run_id = request.query_params.get("run_id") or None
    open_only = not flag(request.query_params.get("all"))
    found = await run_in_threadpool(client(request).decisions, run_id, open_only=open_only)
    return JSONResponse({"decisions": views.plain(found)})


async def answer_decision(request: Request) -> Response:
    body = await json_body(request)
    if "response" not in body:
        raise InvalidInput("The body must hold the answer as response")
    done = await run_in_threadpool(
        actions.answer,
        client(request),
        request.path_params["decision_id"],
        body["response"],
        principal(request).actor,
    )
    return JSONResponse(done)


async def list_requests(request: Request) -> Response:
    query = request.query_params
    status = None if flag(query.get("all")) else (query.get("status") or "pending")
    found = await run_in_threadpool(
        client(request).store.requests, run_id=query.get("run_id") or None, status=status
    )
    return JSONResponse({"requests": views.plain(found)})


async def submit_request(request: Request) -> Response:
    body = await json_body(request)
    if "payload" not in body:
        raise InvalidInput("The body must hold the answer as payload")
    payload: Json = body["payload"]
    done = await run_in_threadpool(
        actions.submit, client(request), request.path_params["request_id"], payload
    )
    return JSONResponse(done)


async def list_effects(request: Request) -> Response:
    query = request.query_params
    found = await run_in_threadpool(
        client(request).store.effects, run_id=query.get("run_id") or None, status=query.get("status") or None
    )
    return JSONResponse({"effects": views.plain(found)})


async def resolve_effect(request: Request) -> Response:
    body = await json_body(request)
    outcome = body.get("outcome")
    if not isinstance(outcome, str):
        raise InvalidInput("outcome must be 'applied', 'rejected' or 'retry'")
    done = await run_in_threadpool(
        actions.resolve_effect,
        client(request),
        request.path_params["effect_id"],
        outcome,
        principal(request).actor,
    )
    return JSONResponse(done)


async def get_inbox(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(views.inbox, client(request)))


async def list_schedules(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(views.schedules, client(request)))


async def schedule_action(request: Request) -> Response:
    await json_body(request)  # a body, if any, must still be a JSON object
    done = await run_in_threadpool(
        actions.schedule_action,
        client(request),
        request.path_params["name"],
        request.path_params["action"],
    )
    return JSONResponse(done)


async def list_workflows(request: Request) -> Response:
    registry = client(request).registry
    rows = [
        {"name": n, "digest": registry.get(n).digest, "description": registry.get(n).description}
        for n in registry.names()
    ]
    return JSONResponse({"workflows": rows})


def notifications_of(request: Request) -> dict[str, Any]:
    notifier = request.app.state.notifier
    if notifier is None:
        return {"urls": [], "pending": [], "recent": []}
    view: dict[str, Any] = notifier.view()
    return view


async def list_notifications(request: Request) -> Response:
    return JSONResponse(notifications_of(request))


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_document())


# -- the table -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    handler: Callable[[Request], Awaitable[Response]]
    summary: str
    body: str | None = None
    query: tuple[str, ...] = ()
    stream: bool = False


ENDPOINTS = [
    Endpoint(
        "GET",
        "/runs",
        list_runs,
        "List runs, newest first, each with its human status (summary); status filters by queue "
        "status, or waiting_for_event for the runs parked at a wait_for_event node",
        query=("status", "workflow", "q", "offset", "limit"),
    ),
    Endpoint("POST", "/runs", start_run, "Start a run (idempotent by run_id)", body="StartRun"),
    Endpoint(
        "GET", "/runs/revision", list_revision, "The run list's revision (changes when any run changes)"
    ),
    Endpoint("GET", "/runs/{run_id}", get_run, "A run with its steps, attempts, result and open questions"),
    Endpoint("GET", "/runs/{run_id}/events", run_events, "A run's journal", query=("after", "limit")),
    Endpoint(
        "GET",
        "/runs/{run_id}/events/stream",
        stream_events,
        "A run's journal as Server-Sent Events",
        query=("after", "follow"),
        stream=True,
    ),
    Endpoint(
        "POST",
        "/runs/{run_id}/events",
        send_event,
        "Send an event into a run (its wait_for_event node takes it, now or when it gets there)",
        body="SendEvent",
    ),
    Endpoint(
        "POST",
        "/runs/{run_id}/{action}",
        run_action,
        "cancel, pause, resume or restart a run",
        body="RunAction",
    ),
    Endpoint("GET", "/events", run_events, "The journal of all runs", query=("after", "limit")),
    Endpoint(
        "GET",
        "/events/stream",
        stream_events,
        "The journal of all runs as Server-Sent Events",
        query=("after", "follow"),
        stream=True,
    ),
    Endpoint(
        "GET", "/decisions", list_decisions, "Decisions (open ones unless all=1)", query=("run_id", "all")
    ),
    Endpoint(
        "POST", "/decisions/{decision_id}/answer", answer_decision, "Answer an open decision", body="Answer"
    ),
    Endpoint(
        "GET",
        "/requests",
        list_requests,
        "Input requests (pending unless told)",
        query=("run_id", "status", "all"),
    ),
    Endpoint(
        "POST",
        "/requests/{request_id}/submit",
        submit_request,
        "Answer a pending input request",
        body="Submit",
    ),
    Endpoint("GET", "/effects", list_effects, "Effects", query=("run_id", "status")),
    Endpoint(
        "POST", "/effects/{effect_id}/resolve", resolve_effect, "Resolve an ambiguous effect", body="Resolve"
    ),
    Endpoint("GET", "/inbox", get_inbox, "Everything waiting for a person"),
    Endpoint(
        "GET",
        "/schedules",
        list_schedules,
        "The schedules by name: cron, zone, next tick (next_due_at), paused, last run",
    ),
    Endpoint(
        "POST",
        "/schedules/{name}/{action}",
        schedule_action,
        "pause, resume or remove a schedule (remove: only one added at run time)",
    ),
    Endpoint("GET", "/workflows", list_workflows, "The workflows this console can start"),
    Endpoint(
        "GET", "/notifications", list_notifications, "Webhook deliveries: the outbox and the latest sent"
    ),
    Endpoint("GET", "/openapi.json", openapi, "This document"),
]

BODIES: dict[str, dict[str, Any]] = {
    "StartRun": {
        "type": "object",
        "required": ["workflow"],
        "properties": {
            "workflow": {"type": "string"},
            "input": {},
            "run_id": {"type": "string"},
            "session_id": {"type": "string"},
        },
    },
    "RunAction": {
        "type": "object",
        "description": "restart only: a new input and run id, and from_node to fork the run at "
        "that node (reusing the outputs its parent recorded before it)",
        "properties": {"input": {}, "new_run_id": {"type": "string"}, "from_node": {"type": "string"}},
    },
    "Answer": {"type": "object", "required": ["response"], "properties": {"response": {}}},
    "SendEvent": {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string"}, "payload": {}},
    },
    "Submit": {"type": "object", "required": ["payload"], "properties": {"payload": {}}},
    "Resolve": {
        "type": "object",
        "required": ["outcome"],
        "properties": {"outcome": {"type": "string", "enum": ["applied", "rejected", "retry"]}},
    },
    "Error": {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            }
        },
    },
}


def routes() -> list[Route]:
    return [Route(PREFIX + e.path, e.handler, methods=[e.method]) for e in ENDPOINTS]


def openapi_document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for e in ENDPOINTS:
        parameters: list[dict[str, Any]] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in re.findall(r"{(\w+)}", e.path)
        ]
        parameters += [{"name": name, "in": "query", "schema": {"type": "string"}} for name in e.query]
        if e.stream:
            parameters.append({"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}})
        media = "text/event-stream" if e.stream else "application/json"
        operation: dict[str, Any] = {
            "summary": e.summary,
            "operationId": e.handler.__name__
            + ("_all" if "{run_id}" not in e.path and "events" in e.path else ""),
            "parameters": parameters,
            "responses": {
                "200": {"description": "OK", "content": {media: {}}},
                "default": {
                    "description": "An error",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                },
            },
        }
        if e.body is not None:
            operation["requestBody"] = {
                "required": e.body != "RunAction",
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{e.body}"}}},
            }
        paths.setdefault(PREFIX + e.path, {})[e.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "Tether console API", "version": tether_version},
        "paths": paths,
        "components": {
            "schemas": BODIES,
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"token": []}],
    }
