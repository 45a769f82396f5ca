"""The contract limit on PostgreSQL: Tether's own statements, replayed with one round trip per
transaction.

The enqueue child records, on a scratch database, every statement Tether sends to PostgreSQL
while it starts ``n`` runs one at a time and while a Runner (the throughput settings) drains them:
the SQL, its parameters and the connection it went out on, in order (the change watcher's
``LISTEN`` is left out: it is the engine's way of waiting, not work on the data). The statements
of each connection are cut into its transactions (``BEGIN`` to ``COMMIT`` or ``ROLLBACK``; a
statement outside a transaction stands alone), put in the order they ended, and replayed on a
copy of the scratch database taken before anything was recorded: the enqueue part timed in the
child, the drain part by the worker, bumping the counter at each commit that finished a run.

Each transaction goes out pipelined: every statement of it sent without waiting for the one
before, one round trip for the whole transaction, as if each of Tether's transactions were one
call into the server. The same rows, reads, locks and commits as Tether, with no engine, store
layer, JSON, hashing or waiting in between: no implementation of Tether's journal and viewer
contract (on this schema, from Python) that sends these statements could go faster. The replay is
one stream: with two workers, the second one idles.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.common import PG_ADMIN, Counter, pg_count, pg_create, pg_drop, pg_dsn
from bench.peers import sigterm_event
from bench.peers.base import Peer
from bench.peers.replay_peer import finishes_run, plain, record_runs

#: One recorded statement: (connection number, SQL with ``:name`` parameters, parameters).
Call = tuple[int, str, Any]
#: One replayed transaction: its statements and how many runs its commit finishes.
Transaction = tuple[list[tuple[str, Any]], int]


class _Recorder:
    """Collects the statements every connection of the store sends while installed (through
    ``Wire.round_trip``, the store's one way to the server), in the order sent."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.numbers: dict[int, int] = {}
        #: Every connection numbered, held so that no later one can reuse its id().
        self.connections: list[Any] = []
        self.lock = threading.Lock()

    def install(self) -> Callable[[], None]:
        """Record from now on; the function that stops recording."""
        from tether.store.pgwire import Wire

        recorder = self
        round_trip = Wire.round_trip

        def recording(self: Wire, calls: Any) -> Any:
            with recorder.lock:
                number = recorder.number(self.connection)
                for statement, params in calls:
                    recorder.calls.append((number, statement.sql, plain(params)))
            return round_trip(self, calls)

        Wire.round_trip = recording  # type: ignore[method-assign]

        def uninstall() -> None:
            Wire.round_trip = round_trip  # type: ignore[method-assign]

        return uninstall

    def number(self, connection: Any) -> int:
        if id(connection) not in self.numbers:
            self.connections.append(connection)
            self.numbers[id(connection)] = len(self.connections)
        return self.numbers[id(connection)]


def transactions(calls: Sequence[Call]) -> tuple[list[Transaction], int]:
    """The statements cut into each connection's transactions, in the order the transactions
    ended, and how many transactions never ended (a connection discarded after an error: left
    out, as nothing of them was written)."""
    open_by_connection: dict[int, list[tuple[str, Any]]] = {}
    ended: list[Transaction] = []
    abandoned = 0
    for number, sql, parameters in calls:
        current = open_by_connection.get(number)
        if sql.startswith("BEGIN"):
            abandoned += current is not None
            current = open_by_connection[number] = []
        elif current is None:
            ended.append(([(sql, parameters)], 0))  # outside a transaction: a statement of its own
            continue
        current.append((sql, parameters))
        if sql in ("COMMIT", "ROLLBACK"):
            del open_by_connection[number]
            done = sum(1 for s, p in current if finishes_run(s, p)) if sql == "COMMIT" else 0
            ended.append((current, done))
    return ended, abandoned + len(open_by_connection)


def replay(connection: Any, recorded: Sequence[Transaction], finished: Callable[[], None]) -> None:
    """Send each transaction's statements pipelined (one round trip per transaction), in order,
    the way the store sends its own (``Wire``: straight through libpq, prepared once each)."""
    from tether.store.pgwire import Statement, Wire

    statements = {sql: Statement(sql) for calls, _ in recorded for sql, _ in calls}
    wire = Wire(connection)
    wire.enter()
    for calls, done in recorded:
        wire.round_trip([(statements[sql], parameters or {}) for sql, parameters in calls])
        for _ in range(done):
            finished()
    wire.leave()


class ReplayPgPeer(Peer):
    key = "replay-pg"
    backend = "postgres"
    requires = ("tether", "psycopg")
    worker_note = (
        "Tether's recorded statements replayed in order in plain SQL, every transaction sent pipelined in "
        "one round trip (one stream; a second worker idles)"
    )

    @property
    def label(self) -> str:
        return "contract limit (postgres, one round trip per transaction)"

    def prepare(self) -> None:
        super().prepare()
        self.options["record_database"] = pg_create("record")
        self.options["database"] = f"{self.options['record_database']}_replay"

    def cleanup(self) -> None:
        for key in ("database", "record_database"):
            if key in self.options:
                pg_drop(self.options.pop(key))
        super().cleanup()

    def settings(self) -> dict[str, Any]:
        found = super().settings()
        found.pop("database", None)
        found.pop("record_database", None)
        return found

    def done_count(self, counter: Counter, n: int) -> int:
        return pg_count(self.options["database"], "SELECT count(*) FROM run_queue WHERE status = 'done'")

    def enqueue_here(self, n: int) -> dict[str, Any]:
        import psycopg

        from bench.peers.tether_peer import workflow
        from tether.client import Tether

        record_url = pg_dsn(self.options["record_database"])
        Tether(record_url, workflows=[workflow()]).store.close()  # schema and project
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(
                f'CREATE DATABASE "{self.options["database"]}" TEMPLATE "{self.options["record_database"]}"'
            )
        recorder = _Recorder()
        uninstall = recorder.install()
        try:
            enqueue_calls = record_runs(record_url, n, self.options, recorder.calls)
        finally:
            uninstall()
        drained, abandoned = transactions(recorder.calls[enqueue_calls:])
        with open(self.workdir / "drain.pickle", "wb") as out:
            pickle.dump(drained, out)
        with psycopg.connect(pg_dsn(self.options["database"]), autocommit=True) as connection:
            started = time.perf_counter()
            enqueued, abandoned_enqueue = transactions(recorder.calls[:enqueue_calls])
            replay(connection, enqueued, lambda: None)
            seconds = time.perf_counter() - started
            setting = connection.execute("SHOW synchronous_commit").fetchone()
            durability = f"synchronous_commit={setting[0] if setting else '?'}"
        control = ("BEGIN", "COMMIT", "ROLLBACK", "NOTIFY")
        statements = sum(1 for calls, _ in drained for sql, _ in calls if not sql.startswith(control))
        commits = sum(1 for calls, _ in drained if calls[-1][0] == "COMMIT")
        return {
            "seconds": seconds,
            "durability": durability,
            "statements_per_run": statements / n,
            "commits_per_run": commits / n,
            "round_trips_per_run": len(drained) / n,
            "abandoned_transactions_per_run": (abandoned + abandoned_enqueue) / n,
        }

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        import psycopg

        stop = sigterm_event()
        if counter.slot > 0:
            return lambda: stop.wait()
        with open(self.workdir / "drain.pickle", "rb") as source:
            recorded: list[Transaction] = pickle.load(source)
        connection = psycopg.connect(pg_dsn(self.options["database"]), autocommit=True)

        def loop() -> None:
            replay(connection, recorded, counter.bump)
            stop.wait()
            connection.close()

        return loop
