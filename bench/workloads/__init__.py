"""One module per workload; each exposes ``run(config) -> dict`` for bench/run.py."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import pg_dsn


@dataclass
class Config:
    """Sizes and settings of one harness run (``--smoke`` shrinks them all)."""

    workdir: Path
    smoke: bool = False
    reps: int = 3
    runs: int = 5000
    pg_runs: int = 5000
    workers: tuple[int, ...] = (1, 2)
    depth_sizes: tuple[int, ...] = (1000, 100_000, 1_000_000)
    depth_finished: int = 1_000_000
    depth_max: int = 1_000_000
    depth_samples: int = 300
    event_samples: int = 200
    recovery_runs: int = 100
    recovery_lease_ms: int = 5000
    memory_runs: int = 100_000
    profile_runs: int = 500
    profile_backlog: int = 10_000
    fanout_items: int = 1000
    fanout_parallelism: int = 16
    pg: bool = True
    peers: tuple[str, ...] = ()
    #: Tether's runner in the drains: its default concurrency, a poll short enough that an idle
    #: wait never shows in a drain.
    runner: dict[str, int] = field(default_factory=lambda: {"concurrency": 4, "poll_ms": 10})


class Probe:
    """Read-only counts on a Tether store's tables, for measurement only (never to populate)."""

    def __init__(self, backend: str, where: str) -> None:
        self.backend = backend
        self.where = where

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        if self.backend == "postgres":
            import psycopg

            with psycopg.connect(pg_dsn(self.where), connect_timeout=5) as connection:
                return [tuple(row) for row in connection.execute(sql).fetchall()]
        with sqlite3.connect(self.where, timeout=30) as connection:
            return connection.execute(sql).fetchall()

    def value(self, sql: str) -> int:
        found = self.rows(sql)
        return int(found[0][0] or 0) if found else 0

    def pairs(self, sql: str) -> dict[str, int]:
        """A two-column query's rows as a dict (a key, then a whole number)."""
        return {str(key): int(value) for key, value in self.rows(sql)}


def store_url(backend: str, where: str, synchronous: str = "FULL") -> str:
    if backend == "postgres":
        return pg_dsn(where)
    query = "" if synchronous == "FULL" else f"?synchronous={synchronous}"
    return f"sqlite:///{where}{query}"


def fill_runs(client: Any, workflow: str, count: int, prefix: str, batch: int = 5000) -> None:
    """Start ``count`` runs through the public client API, ``batch`` runs per transaction."""
    for start in range(0, count, batch):
        with client.store.transaction():
            for n in range(start, min(count, start + batch)):
                client.start(workflow, run_id=f"{prefix}-{n}")


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:2000]


def probe_tether_postgres(database: str) -> dict[str, Any]:
    """Exercise Tether's PostgreSQL store once (start, claim, complete, read the journal)."""
    import uuid

    from bench.peers.tether_peer import workflow
    from tether.client import Tether

    client = Tether(store_url("postgres", database), workflows=[workflow()])
    client.start("noop", run_id="probe")
    token = str(uuid.uuid4())
    record = client.store.claim_next(runner_id="host-probe", claim_token=token, lease_ms=10_000)
    if record is None or not client.store.complete(run_id=record.run_id, claim_token=token):
        raise RuntimeError("a started run could not be claimed and completed")
    events = client.store.events_after(0)
    client.store.close()
    return {"events": len(events)}
