"""The store contract suite's fixtures: every test gets a fresh store for a backend URL.

``store`` is parametrized over the available backends, so a later backend runs this suite
unchanged. Time is driven with ``at(ms)``; tests never sleep.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tether import open_store
from tether.store import RunRecord, Store
from tether.values import definition_digest

BACKENDS = ["sqlite"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = 30_000


def at(ms: int = 0) -> datetime:
    """T0 plus ``ms`` milliseconds (every test runs on this fixed clock)."""
    return T0 + timedelta(milliseconds=ms)


SOURCE = {"kind": "builtin", "id": "demo", "revision": "1"}
SNAPSHOT = {"name": "demo", "nodes": ["a"]}
DIGEST = definition_digest(SNAPSHOT)


def reserve_args(run_id: str = "run-1", **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "run_id": run_id,
        "workflow_name": "demo",
        "workflow_source_ref": "builtin:demo",
        "workflow_source": SOURCE,
        "definition_digest": DIGEST,
        "definition_snapshot": SNAPSHOT,
        "input": {"n": 1},
        "origin_session_id": "session-1",
        "now": at(0),
    }
    args.update(overrides)
    return args


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/tether.db"


@pytest.fixture
def open_at(store_url: str) -> Iterator[Callable[..., Store]]:
    """Open more stores on the same database (another project, the global view)."""
    opened: list[Store] = []

    def _open(project: str | None = "default") -> Store:
        store = open_store(store_url, project=project)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def store(open_at: Callable[..., Store]) -> Store:
    return open_at()


@pytest.fixture
def reserve(store: Store) -> Callable[..., RunRecord]:
    """Reserve a run with sensible defaults; keyword overrides go to ``store.reserve``."""

    def _reserve(run_id: str = "run-1", **overrides: Any) -> RunRecord:
        return store.reserve(**reserve_args(run_id, **overrides))

    return _reserve


@pytest.fixture
def claimed(store: Store, reserve: Callable[..., RunRecord]) -> Callable[..., RunRecord]:
    """Reserve (unless it exists) and claim a run as ``host-a`` with token ``tok-<run>``."""

    def _claimed(run_id: str = "run-1", *, now: int = 0, running: bool = True, **overrides: Any) -> RunRecord:
        if store.get_run(run_id) is None:
            reserve(run_id, **overrides)
        record = store.claim(
            run_id=run_id, runner_id="host-a", claim_token=f"tok-{run_id}", lease_ms=LEASE, now=at(now)
        )
        assert record is not None
        if running:
            assert store.mark_running(run_id=run_id, claim_token=f"tok-{run_id}", now=at(now))
        return record

    return _claimed


def snapshot(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, to assert that a refused call wrote nothing."""
    connection = sqlite3.connect(store.db.path)
    try:
        tables = [
            row[0]
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        return {
            table: sorted(connection.execute(f'SELECT * FROM "{table}"').fetchall(), key=repr)
            for table in sorted(tables)
        }
    finally:
        connection.close()


def rows(store: Store, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read rows straight from the database (tests check the stored layout by the spec)."""
    connection = sqlite3.connect(store.db.path)
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()
