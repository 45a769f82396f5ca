"""The contract limit: Tether's own statements, replayed in plain SQL with nothing around them.

The enqueue child first records, on a scratch copy of the database, every statement Tether sends
to SQLite while it starts ``n`` runs one at a time and while a Runner (the throughput settings)
drains them: the SQL, its parameters, the connection it ran on and its order, transactions
included (the change watcher's ``PRAGMA data_version`` polls are left out: they are the engine's
way of waiting, not work on the data). It then replays the enqueue part on a fresh database that
starts in the recorded one's initial state, timed, and leaves the drain part for the worker, which
replays it in the same order on one connection per recorded connection, bumping the counter at
each commit that finished a run.

The same rows, reads, transactions and commits as Tether, with the same durability, but no
engine, store layer, JSON or hashing in between: the fastest Tether's statements (on this schema,
from Python) could go. Tether's end-to-end rate divided by this one is what Tether's Python costs;
this rate divided by a peer's shows whether a target over that peer is reachable at all while
sending what Tether sends (``rows_peer`` bounds any way of writing the same rows). The replay is
one stream: with two workers, the second one idles.

With ``group_commits`` (N above 1) the drain part is replayed on one connection with the recorded
transactions merged, N commits into one: a perfect group commit (one fsync for N transactions, no
waiting for them to gather), the most that claiming and committing several runs together could
gain while the same statements run.
"""

from __future__ import annotations

import pickle
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import Counter, copy_sqlite, sqlite_durability
from bench.peers import sigterm_event
from bench.peers.base import Peer

#: One recorded call: (connection number, "one" or "many", SQL, parameters).
Call = tuple[int, str, str, Any]


class _Recorder:
    """Collects the calls of every connection opened while installed, in execution order."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        self.connections = 0

    def factory(self) -> type[sqlite3.Connection]:
        recorder = self

        class Recording(sqlite3.Connection):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                with recorder.lock:
                    recorder.connections += 1
                    self.number = recorder.connections

            def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:  # type: ignore[override]
                if "data_version" in sql:
                    return super().execute(sql, parameters)
                # Under one lock, so the list is the order SQLite saw (a process's writers queue
                # on Tether's own lock before BEGIN, so nothing blocks in here).
                with recorder.lock:
                    cursor = super().execute(sql, parameters)
                    recorder.calls.append((self.number, "one", sql, plain(parameters)))
                    return cursor

            def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:  # type: ignore[override]
                rows = [plain(p) for p in parameters]
                with recorder.lock:
                    cursor = super().executemany(sql, rows)
                    recorder.calls.append((self.number, "many", sql, rows))
                    return cursor

        return Recording


class Executed:
    """Counts the no-op node's executions (the Tether peer's node bumps its COUNTER)."""

    count = 0

    def bump(self) -> None:
        self.count += 1


def plain(parameters: Any) -> Any:
    """Recorded parameters as plain data (None stays None)."""
    if parameters is None:
        return None
    return dict(parameters) if isinstance(parameters, dict) else tuple(parameters)


def finishes_run(sql: str, parameters: Any) -> bool:
    return (
        "UPDATE run_queue SET status" in sql
        and isinstance(parameters, dict)
        and (parameters.get("status") == "done")
    )


def record_runs(url: str, n: int, options: dict[str, Any], calls: list[Any]) -> int:
    """Start ``n`` no-op runs one at a time on a Tether store at ``url``, then drain them with a
    Runner (the throughput settings in ``options``), while a recorder appends to ``calls``: how
    many calls the starts made (the drain's follow)."""
    from bench.peers import tether_peer
    from bench.peers.tether_peer import workflow
    from tether.client import Tether
    from tether.engine.runner import Runner, RunnerConfig

    executed = Executed()
    tether_peer.COUNTER = executed  # type: ignore[assignment]
    client = Tether(url, workflows=[workflow()])
    for _ in range(n):
        client.start("noop")
    enqueue_calls = len(calls)
    runner = Runner(
        client.store,
        client.registry,
        config=RunnerConfig(
            concurrency=int(options.get("concurrency", 1)), poll_ms=int(options.get("poll_ms", 10))
        ),
    )
    # The runner stops once idle with no run in hand after every node ran: all runs done.
    runner.run(stop_when=lambda: executed.count >= n)
    client.store.close()
    return enqueue_calls


class ReplayPeer(Peer):
    key = "replay"
    requires = ("tether",)
    worker_note = (
        "Tether's recorded statements replayed in order in plain SQL (one stream; a second worker idles; "
        "with group_commits N, on one connection with every N recorded transactions merged into one)"
    )

    @property
    def label(self) -> str:
        synchronous = self.options.get("synchronous", "FULL")
        group = self.group
        merged = f", {group} transactions per commit" if group > 1 else ""
        return f"contract limit (sqlite {synchronous}{merged})"

    @property
    def group(self) -> int:
        return int(self.options.get("group_commits", 1))

    @property
    def path(self) -> str:
        return str(self.workdir / "replay.db")

    def url(self, path: str) -> str:
        synchronous = self.options.get("synchronous", "FULL")
        return f"sqlite:///{path}" + ("" if synchronous == "FULL" else f"?synchronous={synchronous}")

    def done_count(self, counter: Counter, n: int) -> int:
        with sqlite3.connect(self.path, timeout=30) as connection:
            return int(
                connection.execute("SELECT count(*) FROM run_queue WHERE status = 'done'").fetchone()[0]
            )

    def enqueue_here(self, n: int) -> dict[str, Any]:
        import tether.store.db as store_db
        from bench.peers.tether_peer import workflow
        from tether.client import Tether

        scratch = str(self.workdir / "record.db")
        Tether(self.url(scratch), workflows=[workflow()]).store.close()  # schema and project
        copy_sqlite(Path(scratch), Path(self.path))
        recorder = _Recorder()
        recording = recorder.factory()
        connect = store_db.sqlite3.connect
        store_db.sqlite3.connect = lambda *a, **k: connect(*a, factory=recording, **k)  # type: ignore[assignment]
        try:
            enqueue_calls = record_runs(self.url(scratch), n, self.options, recorder.calls)
        finally:
            store_db.sqlite3.connect = connect  # type: ignore[assignment]
        calls = recorder.calls
        with open(self.workdir / "drain.pickle", "wb") as out:
            pickle.dump(calls[enqueue_calls:], out)
        connections: dict[int, sqlite3.Connection] = {}
        started = time.perf_counter()
        _replay(calls[:enqueue_calls], connections, self.path, lambda: None)
        seconds = time.perf_counter() - started
        durability = sqlite_durability(next(iter(connections.values())))
        for connection in connections.values():
            connection.close()
        drained = calls[enqueue_calls:]
        return {
            "seconds": seconds,
            "durability": durability,
            "statements_per_run": sum(1 for c in drained if not c[2].startswith(("BEGIN", "COMMIT"))) / n,
            "commits_per_run": sum(1 for c in drained if c[2] == "COMMIT") / self.group / n,
        }

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        stop = sigterm_event()
        if counter.slot > 0:
            return lambda: stop.wait()
        with open(self.workdir / "drain.pickle", "rb") as source:
            calls: list[Call] = pickle.load(source)
        connections: dict[int, sqlite3.Connection] = {}

        def loop() -> None:
            if self.group > 1:
                _replay_merged(calls, self.path, counter.bump, self.group)
            else:
                _replay(calls, connections, self.path, counter.bump)
            stop.wait()

        return loop


def _replay(
    calls: list[Call], connections: dict[int, sqlite3.Connection], path: str, finished: Callable[[], None]
) -> None:
    """Run the calls in order, each on the replay connection standing for its recorded one."""
    pending: dict[int, int] = {}
    for number, kind, sql, parameters in calls:
        connection = connections.get(number)
        if connection is None:
            connection = connections[number] = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, cached_statements=256
            )
        if kind == "many":
            connection.executemany(sql, parameters)
            continue
        connection.execute(sql, parameters).fetchall()
        if finishes_run(sql, parameters):
            pending[number] = pending.get(number, 0) + 1
        elif sql == "COMMIT":
            for _ in range(pending.pop(number, 0)):
                finished()


def _replay_merged(calls: list[Call], path: str, finished: Callable[[], None], group: int) -> None:
    """Run the calls in order on one connection, merging every ``group`` recorded transactions
    into one (a transaction-control PRAGMA inside a merged transaction is left out)."""
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False, cached_statements=256)
    open_transaction = False
    commits = pending = 0
    for _number, kind, sql, parameters in calls:
        if sql.startswith("BEGIN"):
            if open_transaction:
                continue
            open_transaction = True
        elif sql == "COMMIT":
            commits += 1
            if not open_transaction or commits % group:
                continue
            open_transaction = False
        elif open_transaction and sql.lstrip().upper().startswith("PRAGMA"):
            continue
        if kind == "many":
            connection.executemany(sql, parameters)
            continue
        connection.execute(sql, parameters).fetchall()
        if finishes_run(sql, parameters):
            pending += 1
        elif sql == "COMMIT":
            for _ in range(pending):
                finished()
            pending = 0
    if open_transaction:
        connection.execute("COMMIT")
        for _ in range(pending):
            finished()
    connection.close()
