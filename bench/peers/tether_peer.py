"""Tether: runs started with ``Tether.start`` and drained by the real ``Runner``."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from bench.common import Counter, pg_count, pg_create, pg_drop, pg_dsn
from bench.peers.base import Peer

COUNTER: Counter | None = None


def noop(ctx: Any) -> None:
    """The benchmark's one node: returns at once."""
    if COUNTER is not None:
        COUNTER.bump()


def workflow() -> Any:
    from tether.engine.graph import Workflow, compute

    return Workflow("noop", start="a", nodes=[compute("a", noop)])


class TetherPeer(Peer):
    """Options: ``backend`` (sqlite/postgres), ``synchronous`` (FULL/NORMAL, SQLite), runner
    ``concurrency``, ``poll_ms`` and ``lease_ms``."""

    key = "tether"
    requires = ("tether",)
    worker_note = "tether Runner (one per process), registry with a one-node no-op workflow"

    @property
    def backend(self) -> str:  # type: ignore[override]
        return str(self.options.get("backend", "sqlite"))

    @property
    def label(self) -> str:
        if self.backend == "postgres":
            return "tether (postgres)"
        return f"tether (sqlite {self.options.get('synchronous', 'FULL')})"

    @property
    def path(self) -> str:
        return str(self.workdir / "tether.db")

    def url(self) -> str:
        if self.backend == "postgres":
            # The server default (synchronous_commit=on, checked and recorded by the harness).
            return pg_dsn(self.options["database"])
        synchronous = self.options.get("synchronous", "FULL")
        query = "" if synchronous == "FULL" else f"?synchronous={synchronous}"
        return f"sqlite:///{self.path}{query}"

    def prepare(self) -> None:
        super().prepare()
        if self.backend == "postgres":
            self.options["database"] = pg_create("tether")

    def cleanup(self) -> None:
        if self.backend == "postgres" and "database" in self.options:
            pg_drop(self.options.pop("database"))
        super().cleanup()

    def done_count(self, counter: Counter, n: int) -> int:
        sql = "SELECT count(*) FROM run_queue WHERE status = 'done'"
        if self.backend == "postgres":
            return pg_count(self.options["database"], sql)
        with sqlite3.connect(self.path, timeout=30) as connection:
            return int(connection.execute(sql).fetchone()[0])

    def settings(self) -> dict[str, Any]:
        found = super().settings()
        found.pop("database", None)
        return found

    def open(self) -> Any:
        from tether.client import Tether

        return Tether(self.url(), workflows=[workflow()])

    def enqueue_here(self, n: int) -> dict[str, Any]:
        client = self.open()  # connects and migrates before the clock starts
        started = time.perf_counter()
        for _ in range(n):
            client.start("noop")
        seconds = time.perf_counter() - started
        client.store.close()
        return {"seconds": seconds, "durability": self.durability()}

    def durability(self) -> str:
        if self.backend == "postgres":
            return "synchronous_commit=on"
        return f"synchronous={self.options.get('synchronous', 'FULL')}"

    def runner_config(self) -> Any:
        from tether.engine.runner import RunnerConfig

        return RunnerConfig(
            poll_ms=int(self.options.get("poll_ms", 10)),
            concurrency=int(self.options.get("concurrency", 1)),
            lease_ms=int(self.options.get("lease_ms", 30_000)),
        )

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        global COUNTER
        COUNTER = counter
        from tether.engine.runner import Runner

        client = self.open()
        runner = Runner(client.store, client.registry, config=self.runner_config())
        runner.install_signal_handlers()

        def loop() -> None:
            runner.run()
            client.store.close()

        return loop
