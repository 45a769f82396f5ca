"""pgqueuer on PostgreSQL (its defaults) and its standard worker (``PgQueuer.run``, as ``pgq run``
starts it: batches of 10, LISTEN/NOTIFY on)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any

from bench.common import Counter, pg_count, pg_create, pg_drop, pg_dsn
from bench.peers.base import Peer


class PgQueuerPeer(Peer):
    key = "pgqueuer"
    requires = ("pgqueuer",)
    backend = "postgres"
    worker_note = "PgQueuer.run() as `pgq run` starts it (defaults: batch_size 10, LISTEN/NOTIFY)"

    def prepare(self) -> None:
        super().prepare()
        self.options["database"] = pg_create("pgqueuer")

    def cleanup(self) -> None:
        if "database" in self.options:
            pg_drop(self.options.pop("database"))
        super().cleanup()

    def settings(self) -> dict[str, Any]:
        found = super().settings()
        found.pop("database", None)
        return found

    def done_count(self, counter: Counter, n: int) -> int:
        # A finished job leaves the queue table (it is logged in pgqueuer_log).
        return n - pg_count(self.options["database"], "SELECT count(*) FROM pgqueuer")

    async def _queries(self) -> Any:
        import psycopg
        from pgqueuer import PsycopgDriver, Queries

        connection = await psycopg.AsyncConnection.connect(pg_dsn(self.options["database"]), autocommit=True)
        return Queries(PsycopgDriver(connection))

    def setup_here(self) -> dict[str, Any]:
        async def install() -> None:
            queries = await self._queries()
            await queries.install()

        asyncio.run(install())
        return {}

    def enqueue_here(self, n: int) -> dict[str, Any]:
        async def enqueue() -> float:
            queries = await self._queries()
            started = time.perf_counter()
            for _ in range(n):
                await queries.enqueue("noop", None)
            return time.perf_counter() - started

        seconds = asyncio.run(enqueue())
        return {"seconds": seconds, "durability": "synchronous_commit=on (server default)"}

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        def loop() -> None:
            async def main() -> None:
                import psycopg
                from pgqueuer import PgQueuer, PsycopgDriver

                connection = await psycopg.AsyncConnection.connect(
                    pg_dsn(self.options["database"]), autocommit=True
                )
                pgq = PgQueuer(PsycopgDriver(connection))

                @pgq.entrypoint("noop")
                async def noop(job: Any) -> None:
                    counter.bump()

                loop = asyncio.get_running_loop()
                loop.add_signal_handler(signal.SIGTERM, pgq.shutdown.set)
                await pgq.run()

            asyncio.run(main())

        return loop
