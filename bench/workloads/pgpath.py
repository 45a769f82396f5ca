"""What ``tether.store.pgwire.Wire`` buys over plain psycopg 3: the same recorded round trips sent
both ways.

Run by hand, in one process (``python -m bench.workloads.pgpath``): it starts ``runs``
no-op runs on a scratch database, copies it (the template every repetition starts from), then
drains them with a Runner (the throughput settings) while recording every round trip the store
sends (``Wire.round_trip``): its connection, statements and parameters. The round trips are cut
into each connection's transactions (``BEGIN`` to ``COMMIT`` or ``ROLLBACK``; a round trip outside
a transaction stands alone), in the order they ended. Each repetition then, in turn on fresh
copies of the template:

- replays them on one connection through ``Wire`` (the store's path: libpq's pipeline, its own
  prepared-statement cache, psycopg's ``Transformer``);
- replays them on one connection through psycopg's public API (``PsycopgPath``: a cursor per
  statement in ``connection.pipeline()``, ``prepare=True``, ``dict_row``, results read after
  ``pipeline.sync()``);
- drains the same runs with a real Runner (not recorded), once as the store is and once with its
  ``Wire`` swapped for ``PsycopgWire`` (the psycopg path behind ``Wire``'s interface): the time a
  run takes end to end either way.

Both replays read every statement's rows and row count, as the store does for the statements
whose outcome it needs. Client CPU is the process's CPU time (the server runs in its own
processes); the medians of the repetitions are reported with the ratio of each repetition's own
figures (the host is shared: compare within a repetition).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bench.common import PG_ADMIN, pg_create, pg_drop, pg_dsn
from bench.peers.replay_peer import Executed, plain
from bench.workloads import fill_runs

#: A ``:name`` parameter (not a ``::type`` cast), as ``tether.store.pgwire.PARAMETER``.
PARAMETER = re.compile(r"(?<![:\w]):(\w+)")
#: One recorded round trip: its statements with their parameters.
RoundTrip = list[tuple[str, Any]]
#: One recorded transaction: its round trips, in order.
Transaction = list[RoundTrip]
#: A statement's outcome as the store takes it: its rows (None unless it returns rows) and the
#: number of rows it changed (-1 when the server reports none).
Outcome = tuple[list[Any] | None, int]


class PsycopgPath:
    """Round trips through psycopg 3's public API: in ``connection.pipeline()``, a cursor per
    statement, ``execute(..., prepare=True)`` for a statement with parameters, then
    ``pipeline.sync()`` and each cursor's rows. The connection is in autocommit mode: the
    transactions' own ``BEGIN`` and ``COMMIT`` are statements like any other."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        # The store's queries and their parameter types come to a few hundred (Wire keeps 2048).
        connection.prepared_max = 2048
        self.texts: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.pipeline: Any = None
        self._context: Any = None

    def text(self, sql: str) -> tuple[str, tuple[str, ...]]:
        """``sql`` with ``%(name)s`` placeholders (``%`` doubled) and its parameters' names, as
        ``Statement`` converts ``:name`` to ``$n`` once per statement."""
        known = self.texts.get(sql)
        if known is None:
            names: list[str] = []

            def placeholder(match: re.Match[str]) -> str:
                if match.group(1) not in names:
                    names.append(match.group(1))
                return f"%({match.group(1)})s"

            converted = PARAMETER.sub(placeholder, sql.replace("%", "%%"))
            known = self.texts[sql] = (converted if names else sql, tuple(names))
        return known

    def enter(self) -> None:
        self._context = self.connection.pipeline()
        self.pipeline = self._context.__enter__()

    def leave(self) -> None:
        self._context.__exit__(None, None, None)
        self.pipeline = None

    def round_trip(self, calls: Sequence[tuple[str, Mapping[str, Any] | None]]) -> list[Outcome]:
        """Send every statement, sync, then read each one's outcome (an error is raised by
        ``sync``, as psycopg raises it)."""
        from psycopg.rows import dict_row

        cursors = []
        for sql, params in calls:
            text, names = self.text(sql)
            cursor = self.connection.cursor(row_factory=dict_row)
            if names:
                cursor.execute(text, {name: params[name] for name in names} if params else {}, prepare=True)
            else:
                cursor.execute(text, prepare=False)
            cursors.append(cursor)
        self.pipeline.sync()
        return [
            (cursor.fetchall() if cursor.description is not None else None, cursor.rowcount)
            for cursor in cursors
        ]


class _Result:
    """What the store reads of a statement's result (``status``, ``command_tuples``), with the rows
    ``PsycopgWire.rows`` hands back."""

    __slots__ = ("command_tuples", "rows", "status")

    def __init__(self, rows: list[dict[str, Any]] | None, count: int) -> None:
        self.status = 2 if rows is not None else 1  # PGRES_TUPLES_OK, PGRES_COMMAND_OK
        self.rows = rows
        self.command_tuples = None if count < 0 else count


class PsycopgWire:
    """``PsycopgPath`` behind ``Wire``'s interface (``enter``, ``leave``, ``round_trip`` of
    ``Statement`` calls, ``rows``), so that a real store can be drained through it: installed in
    place of ``tether.store.postgres.Wire`` for an end-to-end comparison only."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.path = PsycopgPath(connection)

    def enter(self) -> None:
        self.path.enter()

    def leave(self) -> None:
        self.path.leave()

    def round_trip(self, calls: Sequence[tuple[Any, Mapping[str, Any]]]) -> list[_Result]:
        outcomes = self.path.round_trip([(statement.sql, params) for statement, params in calls])
        return [_Result(rows, count) for rows, count in outcomes]

    @staticmethod
    def rows(result: _Result) -> list[dict[str, Any]]:
        return result.rows or []


class WirePath:
    """The store's own path: ``Wire.round_trip`` and each result's rows (``_outcome``)."""

    def __init__(self, connection: Any) -> None:
        from tether.store.pgwire import Wire

        self.wire = Wire(connection)
        self.statements: dict[str, Any] = {}

    def enter(self) -> None:
        self.wire.enter()

    def leave(self) -> None:
        self.wire.leave()

    def round_trip(self, calls: Sequence[tuple[str, Mapping[str, Any] | None]]) -> list[Outcome]:
        from tether.store.pgwire import Statement

        statements = self.statements
        prepared = []
        for sql, params in calls:
            statement = statements.get(sql)
            if statement is None:
                statement = statements[sql] = Statement(sql)
            prepared.append((statement, params or {}))
        outcomes: list[Outcome] = []
        for result in self.wire.round_trip(prepared):
            rows = self.wire.rows(result) if result.status == 2 else None  # PGRES_TUPLES_OK
            count = result.command_tuples
            outcomes.append((rows, -1 if count is None else count))
        return outcomes


class _Recorder:
    """Collects every round trip the store's connections send while installed, in the order sent."""

    def __init__(self) -> None:
        self.trips: list[tuple[int, RoundTrip]] = []
        self.numbers: dict[int, int] = {}
        self.connections: list[Any] = []  # held so that no later connection reuses an id()
        self.lock = threading.Lock()
        self._original: Any = None

    def install(self) -> None:
        from tether.store.pgwire import Wire

        recorder = self
        original = self._original = Wire.round_trip

        def recording(self: Wire, calls: Any) -> Any:
            with recorder.lock:
                if id(self.connection) not in recorder.numbers:
                    recorder.connections.append(self.connection)
                    recorder.numbers[id(self.connection)] = len(recorder.connections)
                trip = [(statement.sql, plain(params)) for statement, params in calls]
                recorder.trips.append((recorder.numbers[id(self.connection)], trip))
            return original(self, calls)

        Wire.round_trip = recording  # type: ignore[method-assign]

    def uninstall(self) -> None:
        from tether.store.pgwire import Wire

        Wire.round_trip = self._original  # type: ignore[method-assign]


def transactions(trips: Sequence[tuple[int, RoundTrip]]) -> tuple[list[Transaction], int]:
    """The round trips cut into each connection's transactions, in the order they ended, and how
    many never ended (left out)."""
    open_by_connection: dict[int, Transaction] = {}
    ended: list[Transaction] = []
    for number, trip in trips:
        current = open_by_connection.get(number)
        if trip[0][0].startswith("BEGIN"):
            current = open_by_connection[number] = []
        elif current is None:
            ended.append([trip])
            continue
        current.append(trip)
        if any(sql in ("COMMIT", "ROLLBACK") for sql, _ in trip):
            ended.append(open_by_connection.pop(number))
    return ended, len(open_by_connection)


def replay(path: WirePath | PsycopgPath, recorded: Sequence[Transaction]) -> tuple[list[list[Outcome]], int]:
    """Each transaction's round trips in order, in pipeline mode from its first to its last: every
    round trip's outcomes, and how many round trips failed."""
    import psycopg

    outcomes: list[list[Outcome]] = []
    failed = 0
    for transaction in recorded:
        path.enter()
        for trip in transaction:
            try:
                outcomes.append(path.round_trip(trip))
            except psycopg.Error:
                failed += 1
                outcomes.append([])
        path.leave()
    return outcomes, failed


def timed_replay(kind: str, template: str, recorded: Sequence[Transaction]) -> dict[str, float]:
    import psycopg

    database = _copy(template, kind)
    try:
        with psycopg.connect(pg_dsn(database), autocommit=True) as connection:
            path: WirePath | PsycopgPath = WirePath(connection) if kind == "wire" else PsycopgPath(connection)
            cpu, wall = time.process_time(), time.perf_counter()
            _, failed = replay(path, recorded)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        pg_drop(database)
    return {"cpu_s": cpu, "wall_s": wall, "failed_round_trips": failed}


def timed_drain(kind: str, template: str, runs: int, options: Mapping[str, int]) -> dict[str, float]:
    """A real drain of the template's queued runs (nothing recorded), the store's round trips going
    through ``Wire`` or (``kind`` "psycopg") through ``PsycopgWire``: wall and CPU time."""
    import tether.store.postgres as postgres
    from bench.peers import tether_peer
    from bench.peers.tether_peer import workflow
    from tether.client import Tether
    from tether.engine.runner import Runner, RunnerConfig

    database = _copy(template, f"drain_{kind}")
    # The store makes each connection's Wire through this module's name for it.
    namespace = vars(postgres)
    original = namespace["Wire"]
    if kind == "psycopg":
        namespace["Wire"] = PsycopgWire
    try:
        executed = Executed()
        tether_peer.COUNTER = executed  # type: ignore[assignment]
        client = Tether(pg_dsn(database), workflows=[workflow()])
        runner = Runner(
            client.store,
            client.registry,
            config=RunnerConfig(concurrency=options["concurrency"], poll_ms=options["poll_ms"]),
        )
        cpu, wall = time.process_time(), time.perf_counter()
        runner.run(stop_when=lambda: executed.count >= runs)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        client.store.close()
    finally:
        namespace["Wire"] = original
        pg_drop(database)
    return {"cpu_s": cpu, "wall_s": wall}


def _copy(template: str, kind: str) -> str:
    import psycopg

    name = f"{template}_{kind}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return name


def record(template: str, runs: int, options: Mapping[str, int]) -> tuple[list[Transaction], int]:
    """Fill ``template`` with ``runs`` queued no-op runs, then drain a copy of it while recording:
    the recorded transactions and how many never ended."""
    from bench.peers import tether_peer
    from bench.peers.tether_peer import workflow
    from tether.client import Tether
    from tether.engine.runner import Runner, RunnerConfig

    client = Tether(pg_dsn(template), workflows=[workflow()])
    fill_runs(client, "noop", runs, "pgpath")
    client.store.close()
    database = _copy(template, "record")
    try:
        executed = Executed()
        tether_peer.COUNTER = executed  # type: ignore[assignment]
        client = Tether(pg_dsn(database), workflows=[workflow()])
        recorder = _Recorder()
        recorder.install()
        try:
            runner = Runner(
                client.store,
                client.registry,
                config=RunnerConfig(concurrency=options["concurrency"], poll_ms=options["poll_ms"]),
            )
            runner.run(stop_when=lambda: executed.count >= runs)
        finally:
            recorder.uninstall()
        client.store.close()
    finally:
        pg_drop(database)
    return transactions(recorder.trips)


def same_shape(template: str, recorded: Sequence[Transaction]) -> dict[str, int]:
    """Replay once each way on fresh copies and compare every outcome: the column names, row
    counts, row counts changed and value types (values themselves hold the server's clock)."""
    import psycopg

    results = []
    for kind in ("wire", "psycopg"):
        database = _copy(template, f"check_{kind}")
        try:
            with psycopg.connect(pg_dsn(database), autocommit=True) as connection:
                path: WirePath | PsycopgPath = (
                    WirePath(connection) if kind == "wire" else PsycopgPath(connection)
                )
                results.append(replay(path, recorded))
        finally:
            pg_drop(database)
    (wire, wire_failed), (psy, psy_failed) = results

    def shape(outcome: Outcome) -> Any:
        rows, count = outcome
        if rows is None:
            return (None, count)
        return ([[(key, type(value).__name__) for key, value in row.items()] for row in rows], count)

    differing = sum(
        1 for a, b in zip(wire, psy, strict=True) if [shape(o) for o in a] != [shape(o) for o in b]
    )
    return {
        "round_trips": len(wire),
        "differing": differing,
        "failed_wire": wire_failed,
        "failed_psycopg": psy_failed,
    }


def measure(runs: int, repetitions: int, options: Mapping[str, int]) -> dict[str, Any]:
    template = pg_create("pgpath")
    try:
        recorded, unended = record(template, runs, options)
        trips = sum(len(t) for t in recorded)
        statements = sum(len(trip) for t in recorded for trip in t)
        check = same_shape(template, recorded)
        samples: dict[str, list[dict[str, float]]] = {
            "wire": [],
            "psycopg": [],
            "drain_wire": [],
            "drain_psycopg": [],
        }
        ratios: dict[str, list[float]] = {"cpu": [], "wall": [], "drain_share": [], "drain": []}
        for repetition in range(repetitions):
            # Alternate which path goes first: the host's load drifts within a repetition.
            order = ("wire", "psycopg") if repetition % 2 == 0 else ("psycopg", "wire")
            got = {kind: timed_replay(kind, template, recorded) for kind in order}
            for kind in order:
                got[f"drain_{kind}"] = timed_drain(kind, template, runs, options)
            for kind, sample in got.items():
                samples[kind].append(sample)
            ratios["cpu"].append(got["psycopg"]["cpu_s"] / got["wire"]["cpu_s"])
            ratios["wall"].append(got["psycopg"]["wall_s"] / got["wire"]["wall_s"])
            extra = got["psycopg"]["cpu_s"] - got["wire"]["cpu_s"]
            ratios["drain_share"].append(extra / got["drain_wire"]["wall_s"])
            ratios["drain"].append(got["drain_psycopg"]["wall_s"] / got["drain_wire"]["wall_s"])
        median = statistics.median

        def per(kind: str, key: str, unit: int, scale: float) -> float:
            return median(sample[key] for sample in samples[kind]) * scale / unit

        out: dict[str, Any] = {
            "runs": runs,
            "repetitions": repetitions,
            "runner": dict(options),
            "recorded": {
                "transactions": len(recorded),
                "round_trips": trips,
                "statements": statements,
                "transactions_per_run": len(recorded) / runs,
                "round_trips_per_run": trips / runs,
                "statements_per_run": statements / runs,
                "unended_transactions": unended,
            },
            "same_shape": check,
        }
        for kind in ("wire", "psycopg"):
            out[kind] = {
                "cpu_us_per_statement": per(kind, "cpu_s", statements, 1e6),
                "cpu_us_per_transaction": per(kind, "cpu_s", len(recorded), 1e6),
                "transactions_per_s": len(recorded) / median(s["wall_s"] for s in samples[kind]),
                "failed_round_trips": max(s["failed_round_trips"] for s in samples[kind]),
            }
        for kind in ("wire", "psycopg"):
            out[f"drain_{kind}"] = {
                "runs_per_s": runs / median(s["wall_s"] for s in samples[f"drain_{kind}"]),
                "wall_ms_per_run": per(f"drain_{kind}", "wall_s", runs, 1e3),
                "cpu_ms_per_run": per(f"drain_{kind}", "cpu_s", runs, 1e3),
            }
        out["psycopg_over_wire"] = {
            "cpu": median(ratios["cpu"]),
            "cpu_range": [min(ratios["cpu"]), max(ratios["cpu"])],
            "wall": median(ratios["wall"]),
            "extra_cpu_us_per_statement": median(
                (p["cpu_s"] - w["cpu_s"]) * 1e6 / statements
                for p, w in zip(samples["psycopg"], samples["wire"], strict=True)
            ),
            "extra_cpu_ms_per_run": median(
                (p["cpu_s"] - w["cpu_s"]) * 1e3 / runs
                for p, w in zip(samples["psycopg"], samples["wire"], strict=True)
            ),
            "share_of_drain_wall": median(ratios["drain_share"]),
            "share_of_drain_wall_range": [min(ratios["drain_share"]), max(ratios["drain_share"])],
            "drain_wall": median(ratios["drain"]),
            "drain_wall_range": [min(ratios["drain"]), max(ratios["drain"])],
        }
        return out
    finally:
        pg_drop(template)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--poll-ms", type=int, default=10)
    args = parser.parse_args()
    options = {"concurrency": args.concurrency, "poll_ms": args.poll_ms}
    print(json.dumps(measure(args.runs, args.repetitions, options), indent=2))


if __name__ == "__main__":
    main()
