"""Deny by default: every route but health and login refuses a caller without a token (enumerated
from the route table, so a route added later without protection fails here), read-only tokens only
read, cookie sessions need their CSRF token, foreign hosts and origins are refused, bodies are
capped, and hostile run data is rendered as text."""

from __future__ import annotations

import re

from starlette.routing import Mount, Route

from tests.console.conftest import OPERATOR, READER, Console
from tether.console.auth import SESSION_COOKIE

#: The only (method, path) pairs served without a token.
PUBLIC = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/login"), ("POST", "/login")}


def route_table(console: Console) -> list[tuple[str, str]]:
    """Every (method, concrete path) the app serves, path parameters filled in."""
    pairs = []
    for route in console.app.routes:
        if isinstance(route, Mount):
            pairs.append(("GET", route.path + "/console.css"))
            continue
        assert isinstance(route, Route), f"unexpected route type {type(route).__name__}"
        path = re.sub(
            r"{(\w+)}", lambda m: "cancel" if m.group(1) == "action" else "x-" + m.group(1), route.path
        )
        pairs += [(method, path) for method in sorted(route.methods or ()) if method != "HEAD"]
    return pairs


def test_every_route_but_health_and_login_refuses_without_a_token(console: Console) -> None:
    table = route_table(console)
    assert len(table) > 25
    served_openly = set()
    for method, path in table:
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token"},
            {"Cookie": f"{SESSION_COOKIE}=forged.sig"},
        ):
            response = console.anonymous.request(method, path, headers=headers)
            if response.status_code in (401, 303) and (
                response.status_code == 401 or response.headers["location"].startswith("/login")
            ):
                continue
            served_openly.add((method, path))
    # POST /login is public too, but without a valid token it answers 401 with the login form.
    assert served_openly == (PUBLIC - {("POST", "/login")}) | {("GET", "/static/console.css")}
    # Pages send a browser to the login; the API answers 401 with a JSON error.
    page = console.anonymous.get("/inbox", headers={"Accept": "text/html"})
    assert (page.status_code, page.headers["location"]) == (303, "/login?next=/inbox")
    api = console.anonymous.get("/api/v1/runs")
    assert api.status_code == 401 and api.json()["error"]["code"] == "unauthenticated"
    assert api.headers["www-authenticate"] == "Bearer"


def test_a_read_only_token_reads_but_never_changes(console: Console) -> None:
    run_id = console.start("napping")
    assert console.reader.get("/api/v1/runs").json()["total"] == 1
    assert console.reader.get(f"/runs/{run_id}").status_code == 200
    changing = [(m, p) for m, p in route_table(console) if m != "GET" and (m, p) not in PUBLIC]
    assert len(changing) >= 10
    for method, path in changing:
        response = console.reader.request(method, path.replace("x-run_id", run_id), json={})
        assert response.status_code == 403, (method, path)
        assert response.json()["error"]["code"] == "forbidden"
    assert console.status(run_id)[0] == "queued"


def test_cookie_sessions_need_the_csrf_token(console: Console) -> None:
    run_id = console.start("napping")
    browser, csrf = console.browser()
    cookie = browser.cookies.jar
    (stored,) = [c for c in cookie if c.name == SESSION_COOKIE]
    assert stored.has_nonstandard_attr("HttpOnly")
    assert stored.get_nonstandard_attr("SameSite", "").lower() == "strict"

    missing = browser.post(f"/runs/{run_id}/cancel", data={"next": f"/runs/{run_id}"})
    assert (missing.status_code, missing.json()["error"]["code"]) == (403, "csrf_failed")
    wrong = browser.post(f"/runs/{run_id}/cancel", data={"csrf": "0" * 64})
    assert wrong.status_code == 403
    api_without = browser.post(f"/api/v1/runs/{run_id}/cancel")
    assert api_without.status_code == 403
    assert console.status(run_id)[0] == "queued"

    done = browser.post(f"/runs/{run_id}/cancel", data={"csrf": csrf, "next": f"/runs/{run_id}"})
    assert done.status_code == 303 and done.headers["location"].startswith(f"/runs/{run_id}?notice=")
    assert console.status(run_id)[0] == "cancelled"
    restarted = browser.post(f"/api/v1/runs/{run_id}/restart", headers={"X-CSRF-Token": csrf}, json={})
    assert restarted.status_code == 200

    # Another session's CSRF token does not fit this one.
    _, other_csrf = console.browser()
    assert other_csrf != csrf
    assert (
        browser.post(f"/api/v1/runs/{run_id}/restart", headers={"X-CSRF-Token": other_csrf}).status_code
        == 403
    )


def test_a_read_only_login_gets_a_read_only_session(console: Console) -> None:
    browser, csrf = console.browser(READER)
    run_id = console.start("napping")
    page = browser.get(f"/runs/{run_id}")
    assert page.status_code == 200 and "/cancel" not in page.text
    refused = browser.post(f"/runs/{run_id}/cancel", data={"csrf": csrf})
    assert refused.status_code == 403


def test_login_refuses_a_wrong_token_and_never_redirects_off_site(console: Console) -> None:
    wrong = console.anonymous.post("/login", data={"token": "guess", "next": "/"})
    assert wrong.status_code == 401 and "That token is not valid" in wrong.text
    assert SESSION_COOKIE not in wrong.cookies
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
        response = console.anonymous.post("/login", data={"token": OPERATOR, "next": target})
        assert (response.status_code, response.headers["location"]) == (303, "/")


def test_foreign_host_and_origin_are_refused(console: Console) -> None:
    host = console.api.get("/api/v1/runs", headers={"Host": "evil.example"})
    assert (host.status_code, host.json()["error"]["code"]) == (400, "host_not_allowed")
    assert console.anonymous.get("/healthz", headers={"Host": "evil.example:8080"}).status_code == 400
    assert console.api.get("/api/v1/runs", headers={"Host": "localhost:8080"}).status_code == 200

    body = {"workflow": "napping", "run_id": "from-elsewhere"}
    for headers in (
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
    ):
        response = console.api.post("/api/v1/runs", json=body, headers=headers)
        assert (response.status_code, response.json()["error"]["code"]) == (403, "origin_not_allowed")
    assert console.api.get("/api/v1/runs").json()["total"] == 0
    same = console.api.post("/api/v1/runs", json=body, headers={"Origin": "http://testserver"})
    assert same.status_code == 201


def test_request_bodies_are_capped(console: Console) -> None:
    limit = console.config.max_body_bytes
    padding = "x" * (limit + 1)
    declared = console.api.post("/api/v1/runs", json={"workflow": "napping", "input": padding})
    assert (declared.status_code, declared.json()["error"]["code"]) == (413, "body_too_large")

    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"workflow": "napping", "input": "'
        for _ in range(limit // 65536 + 1):
            yield b"x" * 65536
        yield b'"}'

    streamed = console.api.post(
        "/api/v1/runs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert streamed.status_code == 413
    assert console.api.get("/api/v1/runs").json()["total"] == 0


def test_hostile_run_data_is_rendered_as_text(console: Console) -> None:
    console.engine.runner()
    run_id = console.start("hostile")
    console.wait_status(run_id, "done")
    page = console.api.get(f"/runs/{run_id}")
    assert page.status_code == 200
    assert "<script>alert" not in page.text
    assert "&lt;script&gt;alert(" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    error = console.api.get("/runs/<i>nope")
    assert error.status_code == 404 and "<i>nope" not in error.text and "&lt;i&gt;nope" in error.text
