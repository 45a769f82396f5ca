"""DBOS: a queue with a trivial workflow, on SQLite or PostgreSQL (its defaults: the queue polls
every second). Runs are enqueued with ``DBOSClient`` (no DBOS process needed to enqueue); each
worker process launches DBOS with its own executor id, which starts its queue worker."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from bench.common import Counter, pg_count, pg_create, pg_drop, pg_dsn, sqlite_durability
from bench.peers import sigterm_event
from bench.peers.base import Peer

QUEUE = "bench"
COUNTER: Counter | None = None
_WORKFLOW: Any = None


def noop() -> None:
    """The benchmark's workflow: returns at once."""
    if COUNTER is not None:
        COUNTER.bump()


def register() -> Any:
    global _WORKFLOW
    if _WORKFLOW is None:
        from dbos import DBOS

        _WORKFLOW = DBOS.workflow(name="noop")(noop)
    return _WORKFLOW


class DbosPeer(Peer):
    key = "dbos"
    requires = ("dbos",)
    worker_note = "DBOS.launch() per process (its queue worker, default 1 s polling), executor id per process"

    @property
    def backend(self) -> str:  # type: ignore[override]
        return str(self.options.get("backend", "sqlite"))

    @property
    def label(self) -> str:
        return f"dbos ({self.backend})"

    def url(self) -> str:
        if self.backend == "postgres":
            return pg_dsn(self.options["database"]).replace("postgresql://", "postgresql+psycopg://", 1)
        return f"sqlite:///{self.workdir}/dbos.sqlite"

    def prepare(self) -> None:
        super().prepare()
        if self.backend == "postgres":
            self.options["database"] = pg_create("dbos")

    def cleanup(self) -> None:
        if self.backend == "postgres" and "database" in self.options:
            pg_drop(self.options.pop("database"))
        super().cleanup()

    def settings(self) -> dict[str, Any]:
        found = super().settings()
        found.pop("database", None)
        return found

    def done_count(self, counter: Counter, n: int) -> int:
        if self.backend == "postgres":
            return pg_count(
                self.options["database"], "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
            )
        with sqlite3.connect(f"{self.workdir}/dbos.sqlite", timeout=30) as connection:
            row = connection.execute(
                "SELECT count(*) FROM workflow_status WHERE status = 'SUCCESS'"
            ).fetchone()
            return int(row[0])

    def launch(self, executor: str) -> Any:
        from dbos import DBOS

        logging.getLogger("dbos").setLevel(logging.WARNING)
        register()
        return DBOS(
            config={
                "name": "tetherbench",
                "system_database_url": self.url(),
                "executor_id": executor,
                "application_version": "bench",
                "log_level": "WARNING",
            }
        )

    def setup_here(self) -> dict[str, Any]:
        from dbos import DBOS

        started = time.perf_counter()
        self.launch("bench-setup")
        DBOS.launch()
        DBOS.register_queue(QUEUE)
        seconds = time.perf_counter() - started
        DBOS.destroy()
        return {"launch_seconds": seconds}

    def enqueue_here(self, n: int) -> dict[str, Any]:
        from dbos import DBOSClient

        client = DBOSClient(system_database_url=self.url())
        options: Any = {"queue_name": QUEUE, "workflow_name": "noop", "app_version": "bench"}
        client.list_queued_workflows(limit=1)  # connect before the clock starts
        started = time.perf_counter()
        for _ in range(n):
            client.enqueue(options)
        seconds = time.perf_counter() - started
        durability = "synchronous_commit=on (server default)"
        if self.backend == "sqlite":
            with sqlite3.connect(f"{self.workdir}/dbos.sqlite") as connection:
                durability = "sqlite default " + sqlite_durability(connection)
        client.destroy()
        return {"seconds": seconds, "durability": durability}

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        global COUNTER
        COUNTER = counter
        from dbos import DBOS

        self.launch(f"bench-{counter.slot}")
        stop = sigterm_event()

        def loop() -> None:
            DBOS.launch()
            while not stop.wait(0.1):
                pass
            DBOS.destroy()

        return loop
