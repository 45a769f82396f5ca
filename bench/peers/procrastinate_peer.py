"""Procrastinate on PostgreSQL (its defaults) and its standard worker (``App.run_worker``, as the
``procrastinate worker`` command runs it: concurrency 1, LISTEN/NOTIFY on)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.common import Counter, pg_count, pg_create, pg_drop, pg_dsn
from bench.peers.base import Peer

COUNTER: Counter | None = None


def noop() -> None:
    """The benchmark's task: returns at once."""
    if COUNTER is not None:
        COUNTER.bump()


class ProcrastinatePeer(Peer):
    key = "procrastinate"
    requires = ("procrastinate",)
    backend = "postgres"
    worker_note = "App.run_worker() as `procrastinate worker` runs it (concurrency 1, listen_notify)"

    def prepare(self) -> None:
        super().prepare()
        self.options["database"] = pg_create("procrastinate")

    def cleanup(self) -> None:
        if "database" in self.options:
            pg_drop(self.options.pop("database"))
        super().cleanup()

    def settings(self) -> dict[str, Any]:
        found = super().settings()
        found.pop("database", None)
        return found

    def done_count(self, counter: Counter, n: int) -> int:
        return pg_count(
            self.options["database"], "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        )

    def app(self) -> tuple[Any, Any]:
        import procrastinate

        app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(conninfo=pg_dsn(self.options["database"]))
        )
        return app, app.task(name="noop")(noop)

    def setup_here(self) -> dict[str, Any]:
        app, _ = self.app()
        with app.open():
            app.schema_manager.apply_schema()
        return {}

    def enqueue_here(self, n: int) -> dict[str, Any]:
        app, task = self.app()
        with app.open():
            app.check_connection()
            started = time.perf_counter()
            for _ in range(n):
                task.defer()
            seconds = time.perf_counter() - started
        return {"seconds": seconds, "durability": "synchronous_commit=on (server default)"}

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        global COUNTER
        COUNTER = counter
        app, _ = self.app()

        def loop() -> None:
            app.run_worker()

        return loop
