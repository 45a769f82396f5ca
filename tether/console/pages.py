"""The console's web pages: server-rendered (Jinja2, every value escaped), a little JavaScript.

Pages: the runs list (live), a run (steps coloured by state, each step's output and error, the
timeline of events, live), the inbox (decisions, input requests and ambiguous effects with forms),
the schedules (pause, resume and remove for operators), and the token login. Actions are plain
form posts that carry the session's CSRF token (the ``Guard`` checks it) and redirect back; the
JavaScript only asks for confirmation and refreshes the live parts.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from tether.console import actions, views
from tether.console.api import client, error_status, notifications_of, principal
from tether.console.auth import (
    SESSION_COOKIE,
    ConsoleConfig,
    csrf_token,
    session_cookie,
    token_role,
)
from tether.errors import InvalidInput, NotFound, TetherError
from tether.store import QueueStatus
from tether.values import Json

ENVIRONMENT = Environment(
    loader=PackageLoader("tether.console", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
)
ENVIRONMENT.filters["pretty"] = lambda value: json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
ENVIRONMENT.filters["when"] = lambda value: str(value or "")[:19].replace("T", " ")
QUEUE_STATUSES = tuple(s.value for s in QueueStatus)


def config_of(request: Request) -> ConsoleConfig:
    config: ConsoleConfig = request.app.state.config
    return config


def render(request: Request, template: str, status: int = 200, **values: Any) -> HTMLResponse:
    who = request.state.principal if hasattr(request.state, "principal") else None
    context = {
        "principal": who,
        "csrf": csrf_token(config_of(request), who) if who is not None else "",
        "path": request.url.path,
        "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        "request_notice": request.query_params.get("notice"),
        **values,
    }
    return HTMLResponse(ENVIRONMENT.get_template(template).render(context), status)


def local_path(value: str | None, default: str = "/") -> str:
    """A redirect target inside this console (never another site)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return default
    return value


async def form_of(request: Request) -> dict[str, list[str]]:
    body = await request.body()
    try:
        return parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=1000)
    except (UnicodeDecodeError, ValueError):
        raise InvalidInput("The form could not be read") from None


def first(form: dict[str, list[str]], name: str) -> str | None:
    values = form.get(name)
    return values[0] if values else None


# -- schema forms ----------------------------------------------------------------------------
def schema_fields(schema: Any) -> list[dict[str, Any]]:
    """Form fields for an object schema's properties; an empty list means one JSON text area."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return []
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return []
    required = set(schema.get("required") or ())
    fields = []
    for name, spec in properties.items():
        spec = spec if isinstance(spec, dict) else {}
        kind = spec.get("type")
        if "enum" in spec and isinstance(spec["enum"], list):
            control = "select"
        elif kind in ("string", "integer", "number", "boolean"):
            control = str(kind)
        else:
            control = "json"
        fields.append(
            {
                "name": str(name),
                "label": str(spec.get("title") or name),
                "description": str(spec.get("description") or ""),
                "control": control,
                "options": [json.dumps(v) for v in spec.get("enum", [])] if control == "select" else [],
                "required": name in required,
            }
        )
    return fields


def form_answer(schema: Any, form: dict[str, list[str]]) -> Json:
    """The JSON answer a schema form holds (the schema check itself is the client's)."""
    fields = schema_fields(schema)
    if not fields:
        text = first(form, "json") or ""
        try:
            value: Json = json.loads(text)
        except json.JSONDecodeError as error:
            raise InvalidInput(f"The answer is not valid JSON: {error.msg} at position {error.pos}") from None
        return value
    answer: dict[str, Json] = {}
    for field in fields:
        raw = first(form, "f." + field["name"])
        control = field["control"]
        if control == "boolean":
            answer[field["name"]] = raw is not None
            continue
        if raw is None or (raw == "" and not field["required"]):
            continue
        try:
            if control == "integer":
                answer[field["name"]] = int(raw)
            elif control == "number":
                answer[field["name"]] = float(raw)
            elif control in ("select", "json"):
                answer[field["name"]] = json.loads(raw)
            else:
                answer[field["name"]] = raw
        except ValueError:
            raise InvalidInput(f"{field['label']}: {raw!r} is not a valid {control}") from None
    return answer


def question_forms(decisions: list[dict[str, Any]], requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Form fields per open decision and pending request (by id), for the templates."""
    return {
        "decision_fields": {
            d["decision_id"]: schema_fields(
                d["request"].get("schema") if isinstance(d["request"], dict) else None
            )
            for d in decisions
        },
        "request_fields": {
            r["request_id"]: schema_fields(
                r["payload"].get("schema") if isinstance(r["payload"], dict) else None
            )
            for r in requests
        },
    }


# -- pages -----------------------------------------------------------------------------------
async def login_page(request: Request) -> Response:
    return render(request, "login.html", next=local_path(request.query_params.get("next")), failed=False)


async def login(request: Request) -> Response:
    form = await form_of(request)
    config = config_of(request)
    target = local_path(first(form, "next"))
    role = token_role(config, (first(form, "token") or "").strip())
    if role is None:
        return render(request, "login.html", 401, next=target, failed=True)
    response = RedirectResponse(target, 303)
    response.set_cookie(
        SESSION_COOKIE,
        session_cookie(config, role),
        max_age=config.session_seconds,
        httponly=True,
        samesite="strict",
        secure=config.secure_cookies,
        path="/",
    )
    return response


async def logout(request: Request) -> Response:
    response = RedirectResponse("/login", 303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


async def runs_page(request: Request) -> Response:
    query = request.query_params
    offset, limit = views.page_numbers(query.get("offset"), query.get("limit"))
    filters = {k: query.get(k) or "" for k in ("status", "workflow", "q")}
    found = await run_in_threadpool(
        views.list_runs,
        client(request),
        status=filters["status"] or None,
        workflow=filters["workflow"] or None,
        search=filters["q"] or None,
        offset=offset,
        limit=limit,
    )
    template = "runs_rows.html" if query.get("partial") else "runs.html"
    return render(
        request,
        template,
        listing=found,
        filters=filters,
        statuses=QUEUE_STATUSES,
        waiting_for_event=views.WAITING_FOR_EVENT,
        workflows=client(request).registry.names(),
        offset=offset,
        limit=limit,
    )


async def run_page(request: Request) -> Response:
    tether = client(request)
    run_id = request.path_params["run_id"]
    detail = await run_in_threadpool(views.run_detail, tether, run_id)
    decisions = [d for d in detail["decisions"] if d["outcome"] is None]
    requests = [r for r in detail["requests"] if r["status"] == "pending"]
    values = {
        "detail": detail,
        "run": detail["run"],
        "open_decisions": decisions,
        "pending_requests": requests,
        "ambiguous": [e for e in detail["effects"] if e["status"] == "ambiguous"],
        **question_forms(decisions, requests),
    }
    if request.query_params.get("partial"):
        return render(request, "run_live.html", **values)
    events = await run_in_threadpool(
        lambda: views.plain(tether.store.events_after(0, run_id=run_id, limit=2000))
    )
    return render(request, "run.html", events=events, last_seq=events[-1]["seq"] if events else 0, **values)


async def inbox_page(request: Request) -> Response:
    found = await run_in_threadpool(views.inbox, client(request))
    template = "inbox_items.html" if request.query_params.get("partial") else "inbox.html"
    return render(request, template, **found, **question_forms(found["decisions"], found["requests"]))


async def schedules_page(request: Request) -> Response:
    found = await run_in_threadpool(views.schedules, client(request))
    return render(request, "schedules.html", **found)


async def schedule_action(request: Request) -> Response:
    form = await form_of(request)
    name, action = request.path_params["name"], request.path_params["action"]
    result = await run_in_threadpool(actions.schedule_action, client(request), name, action)
    return done(form, "/schedules", f"{name}: {result['outcome']}")


async def notifications_page(request: Request) -> Response:
    return render(request, "notifications.html", outbox=notifications_of(request))


# -- actions ---------------------------------------------------------------------------------
def done(form: dict[str, list[str]], default: str, notice: str) -> Response:
    target = local_path(first(form, "next"), default)
    joiner = "&" if "?" in target else "?"
    return RedirectResponse(f"{target}{joiner}notice={quote(notice)}", 303)


async def run_action(request: Request) -> Response:
    form = await form_of(request)
    run_id, action = request.path_params["run_id"], request.path_params["action"]
    body: dict[str, Any] = {}
    for name in ("new_run_id", "from_node"):
        if action == "restart" and first(form, name):
            body[name] = first(form, name)
    result = await run_in_threadpool(actions.run_action, client(request), run_id, action, body)
    if action == "restart":
        target = quote(result["new_run_id"], safe="")
        return RedirectResponse(f"/runs/{target}?notice={result['outcome']}", 303)
    return done(form, f"/runs/{quote(run_id, safe='')}", f"{action}: {result['outcome']}")


async def answer_decision(request: Request) -> Response:
    form = await form_of(request)
    decision_id = request.path_params["decision_id"]
    tether = client(request)
    found = await run_in_threadpool(tether.store.decisions, decision_id=decision_id)
    if not found:
        raise NotFound(f"Decision not found: {decision_id}")
    question = found[0].request if isinstance(found[0].request, dict) else {}
    if question.get("options"):
        response: Json = first(form, "response")
    else:
        response = form_answer(question.get("schema"), form)
    await run_in_threadpool(actions.answer, tether, decision_id, response, principal(request).actor)
    return done(form, "/inbox", "answered")


async def submit_request(request: Request) -> Response:
    form = await form_of(request)
    request_id = request.path_params["request_id"]
    tether = client(request)
    pending = await run_in_threadpool(actions.find_request, tether, request_id)
    payload = form_answer(actions.request_schema(pending), form)
    await run_in_threadpool(actions.submit, tether, request_id, payload)
    return done(form, "/inbox", "submitted")


async def resolve_effect(request: Request) -> Response:
    form = await form_of(request)
    await run_in_threadpool(
        actions.resolve_effect,
        client(request),
        request.path_params["effect_id"],
        first(form, "outcome") or "",
        principal(request).actor,
    )
    return done(form, "/inbox", "resolved")


def error_page(request: Request, error: TetherError) -> HTMLResponse:
    return render(request, "error.html", error_status(error), error=error)


def routes() -> list[Route]:
    return [
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", runs_page, methods=["GET"]),
        Route("/runs/{run_id}", run_page, methods=["GET"]),
        Route("/runs/{run_id}/{action}", run_action, methods=["POST"]),
        Route("/inbox", inbox_page, methods=["GET"]),
        Route("/schedules", schedules_page, methods=["GET"]),
        Route("/schedules/{name}/{action}", schedule_action, methods=["POST"]),
        Route("/notifications", notifications_page, methods=["GET"]),
        Route("/decisions/{decision_id}/answer", answer_decision, methods=["POST"]),
        Route("/requests/{request_id}/submit", submit_request, methods=["POST"]),
        Route("/effects/{effect_id}/resolve", resolve_effect, methods=["POST"]),
    ]
