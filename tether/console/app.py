"""The console's ASGI application: the API, the pages, health, and the gate in front of them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from tether.client import Tether
from tether.console import api, pages
from tether.console.auth import ASGIApp, ConsoleConfig, Guard, Message, Receive, Scope, Send
from tether.console.metrics import Metrics
from tether.console.notify import Notifier
from tether.errors import TetherError

STATIC = Path(__file__).parent / "static"
#: Sent with every response: no inline script or style, no framing, no sniffing, no referrer to
#: other sites (``no-referrer`` would make browsers send ``Origin: null``, which the gate refuses).
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers if scope["type"] == "http" else send)


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when the store answers a read."""
    tether: Tether = request.app.state.tether
    try:
        await run_in_threadpool(tether.store.list_revision)
    except TetherError as error:
        return JSONResponse(
            {"status": "unavailable", "error": {"code": error.code, "message": error.message}}, 503
        )
    return JSONResponse({"status": "ready"})


async def on_tether_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, TetherError)
    if request.url.path.startswith(api.PREFIX):
        return api.error_response(error)
    return pages.error_page(request, error)


async def on_http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
    return JSONResponse({"error": {"code": code, "message": str(error.detail)}}, error.status_code)


async def metrics(request: Request) -> Response:
    """Prometheus' text format (``tether.console.metrics``); a scraper sends a token like any caller."""
    collected: Metrics = request.app.state.metrics
    body = await run_in_threadpool(collected.render)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def route_table() -> list[BaseRoute]:
    """Every route; the ``Guard`` in front of them lets only ``auth.PUBLIC_PATHS`` through unsigned."""
    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *api.routes(),
        *pages.routes(),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]


def create_app(config: ConsoleConfig, tether: Tether | None = None) -> Starlette:
    """The console over ``tether`` (or a client opened from ``config``, closed at shutdown)."""
    if not config.operator_tokens and not config.read_tokens:
        raise TetherError("The console needs at least one token (TETHER_API_TOKEN)")
    owned = tether is None
    client = tether or Tether(
        config.store, folder=config.folder, project=config.project, migrate=config.migrate
    )

    notifier = None if config.webhooks is None else Notifier(client, config.webhooks)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if notifier is not None:
            notifier.start()
        try:
            yield
        finally:
            if notifier is not None:
                await run_in_threadpool(notifier.stop)
            if owned:
                client.store.close()

    app = Starlette(
        routes=route_table(),
        middleware=[Middleware(SecurityHeaders), Middleware(Guard, config=config)],
        exception_handlers={TetherError: on_tether_error, HTTPException: on_http_error},
        lifespan=lifespan,
    )
    app.state.tether = client
    app.state.config = config
    app.state.metrics = Metrics(client, notifier)
    app.state.notifier = notifier
    return app
