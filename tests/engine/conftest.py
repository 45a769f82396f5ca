"""Fixtures for the engine suite: a fresh store per test on each backend (SQLite and PostgreSQL,
``store_url`` from ``tests/pg.py``: without TETHER_TEST_PG_URL the PostgreSQL variants report
themselves skipped), a client on it, and real runners executing in background threads with short
leases and fast polling. Tests that take no store (graph building, providers, configuration
checks) are not parametrized: they run once. No test here is SQLite-only.

Every runner a test starts is stopped and joined in the fixture's teardown. Tests wait for
conditions with deadline-based polling (``wait_until``), never with fixed sleeps where a condition
can be observed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests import pg, waiting
from tests.store.conftest import rows
from tether import open_store
from tether.client import RunResult, Tether
from tether.engine.clock import Clock
from tether.engine.graph import Workflow
from tether.engine.registry import Registry
from tether.engine.runner import Runner, RunnerConfig
from tether.store import Attempt, Store

T = TypeVar("T")

LEASE_MS = 2000
POLL_MS = 20
RENEW_MS = 200
WAIT_S = 15.0


def wait_until(
    predicate: Callable[[], T], *, timeout: float = WAIT_S, interval: float = 0.01, what: str = "condition"
) -> T:
    """``tests.waiting.wait_until`` with the engine suite's deadline."""
    return waiting.wait_until(predicate, timeout=timeout, interval=interval, what=what)


class Latch:
    """Holds a node function until the test releases it (``entered`` tells that it is inside)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def hold(self, timeout: float = WAIT_S) -> None:
        self.entered.set()
        if not self.release.wait(timeout):
            raise TimeoutError("latch was never released")


class Engine:
    """A store, a client on it, and the runners a test started."""

    def __init__(self, store: Store, tmp_path: Path) -> None:
        self.store = store
        self.tmp_path = tmp_path
        self.client = Tether(store)
        self._runners: list[tuple[Runner, threading.Thread]] = []
        self.latches: list[Latch] = []

    # -- setup -------------------------------------------------------------------------------
    def register(self, *workflows: Workflow) -> None:
        for workflow in workflows:
            # Tests swap definitions under one name on purpose (changed workflows, versions).
            self.client.registry.add(workflow, replace=True)

    def latch(self) -> Latch:
        latch = Latch()
        self.latches.append(latch)
        return latch

    def runner(
        self,
        *,
        registry: Registry | None = None,
        workflows: Iterable[Workflow] | None = None,
        runner_id: str | None = None,
        clock: Clock | None = None,
        **config: Any,
    ) -> Runner:
        """Start a runner in a background thread (the client's registry unless told otherwise)."""
        if workflows is not None:
            registry = Registry(workflows)
        settings = {"lease_ms": LEASE_MS, "poll_ms": POLL_MS, "renew_ms": RENEW_MS, **config}
        runner = Runner(
            self.store,
            registry if registry is not None else self.client.registry,
            runner_id=runner_id,
            config=RunnerConfig(**settings),
            clock=clock,
        )
        thread = threading.Thread(target=runner.run, name=f"test-{runner.runner_id}", daemon=True)
        thread.start()
        self._runners.append((runner, thread))
        return runner

    def stop(self, runner: Runner, timeout: float = WAIT_S) -> None:
        for candidate, thread in self._runners:
            if candidate is runner:
                runner.stop()
                thread.join(timeout)
                assert not thread.is_alive(), f"runner {runner.runner_id} did not stop"

    def stop_all(self) -> None:
        for latch in self.latches:
            latch.release.set()
        for runner, _ in self._runners:
            runner.stop()
        for runner, thread in self._runners:
            thread.join(WAIT_S)
            assert not thread.is_alive(), f"runner {runner.runner_id} did not stop"

    # -- observing ---------------------------------------------------------------------------
    def wait(self, run_id: str, timeout: float = WAIT_S) -> RunResult:
        """Wait until the run is finished (done, failed or cancelled)."""
        return self.client.wait(run_id, timeout_s=timeout, poll_s=0.01)

    def attempts(self, run_id: str, node_id: str | None = None) -> list[Attempt]:
        found = self.store.attempts(run_id)
        return [a for a in found if node_id is None or a.node_id == node_id]

    def statuses(self, run_id: str) -> tuple[str, str]:
        """(queue status, durable run status)."""
        view = self.store.get_run_view(run_id)
        assert view is not None
        return view.status, view.run_state_status

    def wait_status(self, run_id: str, status: str, run_state: str | None = None) -> None:
        def reached() -> bool:
            queue, state = self.statuses(run_id)
            return queue == status and (run_state is None or state == run_state)

        wait_until(reached, what=f"run {run_id} to be {status}/{run_state or '*'}")

    def event_types(self, run_id: str) -> list[str]:
        return [e.type for e in self.store.events_after(0, run_id=run_id, limit=100_000)]

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        """Read rows straight from the database (for columns no record exposes), on either backend:
        ``query`` is SQLite-flavoured, with ``?`` placeholders (``tests/store/conftest.py:rows``)."""
        return rows(self.store, query, *params)


# The backends (pytest finds the fixtures by these names).
pg_database = pg.pg_database
store_url = pg.store_url


@pytest.fixture
def engine(store_url: str, tmp_path: Path) -> Iterator[Engine]:
    store = open_store(store_url)
    harness = Engine(store, tmp_path)
    try:
        yield harness
    finally:
        harness.stop_all()
        store.close()
