"""Fixtures for the console suite: the console app over a fresh store per backend (SQLite and
PostgreSQL, ``store_url`` from ``tests/pg.py``), real runners in background threads (the engine
suite's ``Engine``), and HTTP clients holding an operator token, a read-only token or none.

Requests go through Starlette's ``TestClient`` to the real ASGI app: the gate, the routes, the
client and the store are all the real ones.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    # Starlette 1.x prefers httpx2 for its test client; httpx (what the dev extra installs) works.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from tests import pg
from tests.console import workflows
from tests.engine.conftest import Engine, wait_until
from tether import open_store
from tether.console import ConsoleConfig, create_app

OPERATOR = "operator-token-for-tests"
READER = "reader-token-for-tests"
HOSTS = ("testserver", "127.0.0.1", "localhost")

pg_database = pg.pg_database
store_url = pg.store_url

__all__ = ["Console", "wait_until"]


class Console:
    """The app, the engine under it, and clients: ``api`` (operator token), ``reader``, ``anonymous``."""

    def __init__(self, engine: Engine, **config: Any) -> None:
        self.engine = engine
        self.client = engine.client
        self.config = ConsoleConfig(
            operator_tokens=(OPERATOR,), read_tokens=(READER,), allowed_hosts=HOSTS, **config
        )
        self.app = create_app(self.config, engine.client)
        self.api = TestClient(self.app, headers={"Authorization": f"Bearer {OPERATOR}"})
        self.reader = TestClient(self.app, headers={"Authorization": f"Bearer {READER}"})
        self.anonymous = TestClient(self.app, follow_redirects=False)

    def browser(self, token: str = OPERATOR) -> tuple[TestClient, str]:
        """A cookie session after a token login, and its CSRF token (read from a page)."""
        session = TestClient(self.app, follow_redirects=False)
        response = session.post("/login", data={"token": token, "next": "/inbox"})
        assert response.status_code == 303, response.text
        page = session.get("/inbox")
        marker = 'name="csrf-token" content="'
        start = page.text.index(marker) + len(marker)
        return session, page.text[start : page.text.index('"', start)]

    def start(self, workflow: str, **body: Any) -> str:
        response = self.api.post("/api/v1/runs", json={"workflow": workflow, **body})
        assert response.status_code in (200, 201), response.text
        run_id: str = response.json()["run_id"]
        return run_id

    def status(self, run_id: str) -> tuple[str, str]:
        run = self.api.get(f"/api/v1/runs/{run_id}").json()["run"]
        return run["status"], run["run_state_status"]

    def wait_status(self, run_id: str, status: str) -> None:
        wait_until(lambda: self.status(run_id)[0] == status, what=f"run {run_id} to be {status}")


@pytest.fixture
def console(store_url: str, tmp_path: Path) -> Iterator[Console]:
    store = open_store(store_url)
    engine = Engine(store, tmp_path)
    engine.register(*workflows.ALL)
    try:
        yield Console(engine)
    finally:
        engine.stop_all()
        store.close()
