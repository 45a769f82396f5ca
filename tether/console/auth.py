"""Who may call the console, deny by default.

One ASGI middleware (``Guard``) stands in front of every route:

- the ``Host`` header must name one of the configured hosts, and a state-changing request that
  carries an ``Origin`` (or a browser's ``Sec-Fetch-Site: cross-site``) must come from one of them;
- request bodies are capped (``max_body_bytes``) and read whole before the route sees them;
- every path but the few in ``PUBLIC_PATHS`` (health, login, static files) needs a principal: a
  bearer token (``Authorization: Bearer ...``) or the session cookie a token login sets;
- a read-only principal may only read (GET/HEAD); an operator may also change things;
- a state-changing request authenticated by the cookie must carry the session's CSRF token, in the
  ``X-CSRF-Token`` header or in the ``csrf`` field of a form.

Tokens are compared in constant time, every configured token each time. The session cookie is
HTTP-only and ``SameSite=Strict``, signed with a key of this process (a restart signs users out).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs, quote, urlsplit

from tether.console.notify import WebhookConfig

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

Role = Literal["read", "operator"]
SESSION_COOKIE = "tether_session"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Paths served to anyone (exact paths, and everything under the prefixes).
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/login"})
PUBLIC_PREFIXES = ("/static/",)


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


@dataclass
class ConsoleConfig:
    """How the console is reached and who may use it.

    ``operator_tokens`` may read and act; ``read_tokens`` may only read. ``allowed_hosts`` are the
    host names (no port) the ``Host`` and ``Origin`` headers may carry; ``"*"`` allows any (behind a
    proxy that checks them). ``public_url`` is the console's address as people reach it (links in
    notifications). ``secure_cookies`` marks the session cookie ``Secure`` (serve over HTTPS)."""

    store: str = "sqlite:///.tether/tether.db"
    folder: str | None = None
    project: str = "default"
    migrate: bool = True
    operator_tokens: tuple[str, ...] = ()
    read_tokens: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")
    public_url: str = "http://127.0.0.1:8080"
    max_body_bytes: int = 1 << 20
    session_seconds: int = 12 * 3600
    secure_cookies: bool = False
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    #: Webhook notifications, or None for none.
    webhooks: WebhookConfig | None = None


def new_token() -> str:
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: its role, how it came in, and its session's nonce (cookie only)."""

    role: Role
    via: Literal["token", "cookie"]
    nonce: str = ""

    @property
    def actor(self) -> str:
        return "console-operator" if self.role == "operator" else "console-reader"


def token_role(config: ConsoleConfig, token: str) -> Role | None:
    """The role of ``token``: every configured token is compared, in constant time."""
    given = token.encode("utf-8")
    operator = read = False
    for candidate in config.operator_tokens:
        operator |= hmac.compare_digest(given, candidate.encode("utf-8"))
    for candidate in config.read_tokens:
        read |= hmac.compare_digest(given, candidate.encode("utf-8"))
    if operator:
        return "operator"
    return "read" if read else None


def _sign(config: ConsoleConfig, text: str) -> str:
    return hmac.new(config.secret, text.encode("ascii"), hashlib.sha256).hexdigest()


def session_cookie(config: ConsoleConfig, role: Role) -> str:
    """A signed cookie value: role, expiry and a nonce the CSRF token is derived from."""
    body = json.dumps(
        {"r": role, "e": int(time.time()) + config.session_seconds, "n": secrets.token_hex(16)},
        separators=(",", ":"),
    )
    encoded = base64.urlsafe_b64encode(body.encode("utf-8")).decode("ascii").rstrip("=")
    return f"{encoded}.{_sign(config, encoded)}"


def read_session(config: ConsoleConfig, value: str) -> Principal | None:
    encoded, _, signature = value.partition(".")
    if not encoded or not hmac.compare_digest(
        signature.encode("ascii", "replace"), _sign(config, encoded).encode()
    ):
        return None
    try:
        body = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
        role, expires, nonce = body["r"], int(body["e"]), str(body["n"])
    except (ValueError, KeyError, TypeError):
        return None
    if role not in ("read", "operator") or expires < time.time():
        return None
    return Principal(role, "cookie", nonce)


def csrf_token(config: ConsoleConfig, principal: Principal) -> str:
    """The CSRF token of a cookie session (empty for a bearer token, which needs none)."""
    return _sign(config, f"csrf|{principal.nonce}") if principal.via == "cookie" else ""


def host_name(value: str) -> str:
    """The host part of a ``Host`` header or an origin's netloc, lower case, without the port."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def host_allowed(config: ConsoleConfig, host: str) -> bool:
    return "*" in config.allowed_hosts or host_name(host) in {h.lower() for h in config.allowed_hosts}


def headers_of(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def cookies_of(header: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name:
            found.setdefault(name, value)
    return found


def authenticate(config: ConsoleConfig, headers: dict[str, str]) -> Principal | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token:
        role = token_role(config, token.strip())
        return None if role is None else Principal(role, "token")
    cookie = cookies_of(headers.get("cookie", "")).get(SESSION_COOKIE)
    return None if cookie is None else read_session(config, cookie)


async def send_json(
    send: Send, status: int, code: str, message: str, extra: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def wants_html(path: str, headers: dict[str, str]) -> bool:
    return not path.startswith("/api/") and "text/html" in headers.get("accept", "")


class Guard:
    """The console's gate (see the module docstring); the principal goes to ``scope["state"]``."""

    def __init__(self, app: ASGIApp, config: ConsoleConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        config = self.config
        headers = headers_of(scope)
        method, path = scope["method"], scope["path"]
        if not host_allowed(config, headers.get("host", "")):
            await send_json(
                send, 400, "host_not_allowed", "The Host header names a host this console does not serve"
            )
            return
        unsafe = method not in SAFE_METHODS
        if unsafe:
            origin = headers.get("origin")
            if origin is not None and (origin == "null" or not host_allowed(config, urlsplit(origin).netloc)):
                await send_json(send, 403, "origin_not_allowed", "Requests from another origin are refused")
                return
            if headers.get("sec-fetch-site") == "cross-site":
                await send_json(send, 403, "origin_not_allowed", "Requests from another site are refused")
                return
        try:
            declared = int(headers.get("content-length", "0") or "0")
        except ValueError:
            declared = 0
        if declared > config.max_body_bytes:
            await send_json(
                send, 413, "body_too_large", f"Request bodies are limited to {config.max_body_bytes} bytes"
            )
            return
        body = b""
        if unsafe:
            chunks: list[bytes] = []
            size = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > config.max_body_bytes:
                    await send_json(
                        send,
                        413,
                        "body_too_large",
                        f"Request bodies are limited to {config.max_body_bytes} bytes",
                    )
                    return
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            body = b"".join(chunks)
        principal = authenticate(config, headers)
        state = scope.setdefault("state", {})
        state["principal"] = principal
        if not is_public(path):
            if principal is None:
                if wants_html(path, headers) and not unsafe:
                    location = "/login?next=" + quote(path, safe="/")
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 303,
                            "headers": [(b"location", location.encode())],
                        }
                    )
                    await send({"type": "http.response.body", "body": b""})
                    return
                await send_json(
                    send,
                    401,
                    "unauthenticated",
                    "A token is required: Authorization: Bearer TOKEN, or sign in",
                    ((b"www-authenticate", b"Bearer"),),
                )
                return
            if unsafe and principal.role != "operator":
                await send_json(send, 403, "forbidden", "This token may only read")
                return
            if unsafe and principal.via == "cookie" and not self._csrf_ok(principal, headers, body):
                await send_json(
                    send, 403, "csrf_failed", "The form's CSRF token is missing or wrong; reload the page"
                )
                return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay if unsafe else receive, send)

    def _csrf_ok(self, principal: Principal, headers: dict[str, str], body: bytes) -> bool:
        expected = csrf_token(self.config, principal).encode("ascii")
        given = headers.get(CSRF_HEADER, "")
        if not given and headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            try:
                given = parse_qs(body.decode("utf-8"), max_num_fields=1000).get(CSRF_FIELD, [""])[0]
            except (UnicodeDecodeError, ValueError):
                return False
        return bool(given) and hmac.compare_digest(given.encode("utf-8", "replace"), expected)
