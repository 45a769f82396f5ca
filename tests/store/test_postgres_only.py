"""What only the PostgreSQL backend has to prove: the journal is readable in commit order while
writers hold their transactions open, claim_next skips runs other transactions hold, a schema newer
than the code is refused, broken connections are discarded, lock and idle timeouts surface as
Tether errors, and lease instants are judged by the database clock."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import pytest

from tests.pg import pg_connect, with_database
from tests.waiting import wait_until as wait_for
from tether import open_store
from tether.errors import (
    Conflict,
    InvalidInput,
    SchemaTooNew,
    StoreBusy,
    StoreError,
    StoreUnavailable,
    TetherError,
)
from tether.store import ScheduleSpec, Store, ViewerTarget
from tether.store.db import migrations
from tether.store.pgwire import Statement, Wire
from tether.values import sha256, token_hash

from .conftest import LEASE, PG_SKIP, PG_URL, _pg_empty, _pg_reader, at, reserve_args

pytestmark = pytest.mark.skipif(not PG_URL, reason=PG_SKIP)


def with_params(url: str, **params: object) -> str:
    parts = urlsplit(url)
    query = "&".join(q for q in (parts.query, urlencode(params)) if q)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


@pytest.fixture
def pg_url(pg_database: str) -> str:
    _pg_empty(pg_database)
    return pg_database


@pytest.fixture
def opened(pg_url: str) -> Iterator[Callable[..., Store]]:
    """Open PostgreSQL stores on the test database with extra URL parameters."""
    stores: list[Store] = []

    def _open(**params: object) -> Store:
        store = open_store(with_params(pg_url, **params))
        stores.append(store)
        return store

    yield _open
    for store in stores:
        store.close()


def database_ms(url: str) -> int:
    row = _pg_reader(url).execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)").fetchone()
    return int(row[0])


def backend_pids(url: str, application: str) -> set[int]:
    found = _pg_reader(url).execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
        (application,),
    )
    return {int(row[0]) for row in found}


def run_threads(targets: list[Callable[[], None]], timeout: float = 60) -> None:
    errors: list[BaseException] = []

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def main() -> None:
            try:
                target()
            except BaseException as error:  # reported by the test thread
                errors.append(error)

        return main

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish"
    assert not errors, errors


# -- the journal in commit order ----------------------------------------------------------------
def test_journal__a_tailing_reader_never_skips_an_event_that_committed_late(
    opened: Callable[..., Store], pg_url: str
) -> None:
    """Appenders take a sequence number and then hold their transaction open for a random time;
    a reader tails ``events_after`` all along and must see every event exactly once, in order.
    Each appender writes through a store of its own, as separate processes do (the writers of
    one store take turns in the process and never meet in the server)."""
    store = opened(pool_max=12)
    appenders, per_appender = 6, 20
    for i in range(appenders):
        store.reserve(**reserve_args(f"run-{i}", origin_session_id=f"session-{i}", now=at(i)))
    start = store.last_event_seq()
    finished = threading.Event()
    seen: list[int] = []

    writers = [opened(pool_max=2) for _ in range(appenders)]

    def appender(i: int) -> Callable[[], None]:
        def main() -> None:
            rng = random.Random(i)
            writer = writers[i]
            for n in range(per_appender):
                with writer.transaction():
                    time.sleep(rng.uniform(0, 0.002))
                    writer.record_event(
                        run_id=f"run-{i}", workflow_ref="x", type="note", payload={"n": n}, now=at(100 + n)
                    )
                    # The sequence number is taken; the commit comes late.
                    time.sleep(rng.uniform(0, 0.008))

        return main

    def reader() -> None:
        cursor = start
        while True:
            done = finished.is_set()
            for event in store.events_after(cursor, limit=7):
                seen.append(event.seq)
                cursor = event.seq
            if done and not store.events_after(cursor, limit=1):
                return
            time.sleep(0.001)

    tail = threading.Thread(target=reader)
    tail.start()
    try:
        run_threads([appender(i) for i in range(appenders)])
    finally:
        finished.set()
        tail.join(30)
    assert not tail.is_alive()
    committed = [e.seq for e in store.events_after(start, limit=10_000)]
    assert len(committed) == appenders * per_appender
    assert seen == committed  # every event, once, in sequence order
    assert committed == sorted(set(committed))


def test_journal__a_rolled_back_append_is_never_read(opened: Callable[..., Store]) -> None:
    """Sequence numbers come from the writing transaction (they have gaps); an entry rolled back
    is never read, and the next one comes after every earlier one."""
    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    first = store.last_event_seq()
    with pytest.raises(RuntimeError), store.transaction():
        store.record_event(run_id="run-1", workflow_ref="x", type="rolled-back", now=at(1))
        raise RuntimeError("roll back")
    event = store.record_event(run_id="run-1", workflow_ref="x", type="note", now=at(2))
    assert event.seq > first
    assert [(e.seq, e.type) for e in store.events_after(first)] == [(event.seq, "note")]


def test_journal__writers_on_different_runs_commit_while_one_is_held_open(
    opened: Callable[..., Store],
) -> None:
    """A write transaction on run A that has written the journal and a blob stays open; a
    transaction on run B (another store: another process, as the server sees it) appends,
    stores a new blob and commits meanwhile, without waiting. A reader sees B's entry only once
    A has ended (A's entry, numbered lower, could still land before it), and then both, in order."""
    # Had B to wait for any lock A holds, it would fail with StoreBusy after 200 ms.
    holder, other = opened(), opened(lock_timeout_ms=200)
    holder.reserve(**reserve_args("run-a", origin_session_id="sa", now=at(0)))
    holder.reserve(**reserve_args("run-b", origin_session_id="sb", now=at(0)))
    start = holder.last_event_seq()
    entered, release = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def hold() -> None:
        with holder.transaction():
            outcome["a"] = holder.record_event(
                run_id="run-a", workflow_ref="x", type="held", payload={"blob": "only-in-a"}, now=at(1)
            )
            entered.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert entered.wait(30)
        b = other.record_event(
            run_id="run-b", workflow_ref="x", type="free", payload={"blob": "only-in-b"}, now=at(2)
        )
        assert b.seq > outcome["a"].seq
        # A is still open, so nothing past it is final yet: B's entry is held back.
        reader = opened()
        assert [e.type for e in reader.events_after(start)] == []
    finally:
        release.set()
        thread.join(30)
    # Other transactions on the server may hold the horizon back for a moment.
    wait_for(lambda: len(reader.events_after(start)) == 2)
    assert [(e.seq, e.type) for e in reader.events_after(start)] == [
        (outcome["a"].seq, "held"),
        (b.seq, "free"),
    ]


# -- claim_next skips locked runs ----------------------------------------------------------------
def test_claim_next__skips_a_run_another_transaction_holds(opened: Callable[..., Store]) -> None:
    store, other = opened(), opened()  # two stores: two processes, as far as the server can tell
    store.reserve(**reserve_args("run-1", origin_session_id="s1", now=at(0)))
    store.reserve(**reserve_args("run-2", origin_session_id="s2", now=at(1)))
    holding, release = threading.Event(), threading.Event()
    claimed: dict[str, str | None] = {}

    def first() -> None:
        with store.transaction():
            record = store.claim_next(runner_id="host-a", claim_token="tok-a", lease_ms=LEASE, now=at(10))
            claimed["a"] = record and record.run_id
            holding.set()
            release.wait(10)

    def second() -> None:
        holding.wait(10)
        record = other.claim_next(runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(10))
        claimed["b"] = record and record.run_id

    def releaser() -> None:
        holding.wait(10)
        time.sleep(0.2)  # the second claimer is now past its candidate choice
        release.set()

    run_threads([first, second, releaser])
    # Without SKIP LOCKED the second claimer would have chosen run-1 too, waited for its lock and
    # then found it taken.
    assert claimed == {"a": "run-1", "b": "run-2"}


@pytest.fixture
def record_sent(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
    """Start recording every statement text the process sends to PostgreSQL through the store's
    round trips; the growing list."""

    def start() -> list[str]:
        sent: list[str] = []
        round_trip = Wire.round_trip

        def recording(self: Wire, calls: Any) -> Any:
            sent.extend(statement.sql for statement, _ in calls)
            return round_trip(self, calls)

        monkeypatch.setattr(Wire, "round_trip", recording)
        return sent

    return start


@pytest.fixture
def count_syncs(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[int]]:
    """Start counting the store's round trips (each ends with a Sync); the growing list."""

    def start() -> list[int]:
        syncs: list[int] = []
        round_trip = Wire.round_trip

        def counted(self: Wire, calls: Any) -> Any:
            syncs.append(1)
            return round_trip(self, calls)

        monkeypatch.setattr(Wire, "round_trip", counted)
        return syncs

    return start


def test_run_lock__a_transaction_locks_a_run_once_and_holds_it_to_the_end(
    opened: Callable[..., Store], record_sent: Callable[[], list[str]]
) -> None:
    """Every call in a write transaction reads the run after its lock; the lock is sent once, and
    another transaction still cannot take it until the first ends."""
    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    assert store.claim(run_id="run-1", runner_id="host-a", claim_token="tok-a", lease_ms=LEASE, now=at(1))
    sent = record_sent()
    other = opened(lock_timeout_ms=200)
    with store.transaction():
        for second in range(2, 5):
            assert store.renew(run_id="run-1", claim_token="tok-a", lease_ms=LEASE, now=at(second))
        with pytest.raises(StoreBusy):
            other.renew(run_id="run-1", claim_token="tok-a", lease_ms=LEASE, now=at(5))
    locks = [q for q in sent if "FOR UPDATE OF l" in q and "r.run_id = :run_id" in q]
    # Three renewals here, one attempt by the other store.
    assert len(locks) == 2
    # A renewal records no viewer revision, so the run's viewer row is not locked.
    assert [q for q in sent if "viewer_runs" in q] == []
    assert store.renew(run_id="run-1", claim_token="tok-a", lease_ms=LEASE, now=at(6))


def test_claim_next__racing_claimers_each_get_a_different_run(opened: Callable[..., Store]) -> None:
    store = opened(pool_max=10)
    # A store per claimer: racing processes (one store's writers take turns in the process).
    racers = [opened(pool_max=2) for _ in range(6)]
    total, claimers = 24, 6
    with store.transaction():
        for n in range(total):
            store.reserve(**reserve_args(f"run-{n:02d}", origin_session_id=f"s{n}", now=at(n)))
    barrier = threading.Barrier(claimers)
    won: list[str] = []
    lock = threading.Lock()

    def claimer(i: int) -> Callable[[], None]:
        def main() -> None:
            barrier.wait(10)
            for n in range(total + 1):
                # A fresh runner id each time: a runner may re-claim the runs it already holds.
                record = racers[i].claim_next(
                    runner_id=f"host-{i}-{n}", claim_token=f"tok-{i}-{n}", lease_ms=LEASE, now=at(100)
                )
                if record is None:
                    return
                with lock:
                    won.append(record.run_id)

        return main

    run_threads([claimer(i) for i in range(claimers)])
    assert sorted(won) == [f"run-{n:02d}" for n in range(total)]


def test_lease_take_next__takes_nothing_when_a_clause_no_longer_holds(opened: Callable[..., Store]) -> None:
    """claim_next's claim statement re-checks the candidate clauses itself (here: the run was
    parked for an operator after the candidate was chosen)."""
    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    assert store.claim(run_id="run-1", runner_id="host-a", claim_token="tok-a", lease_ms=LEASE, now=at(1))
    assert store.park_for_no_progress(run_id="run-1", claim_token="tok-a", detail="stuck", now=at(2))
    row = store.db.one("run_row", run_id="run-1")
    assert row is not None
    now = int(at(3).timestamp() * 1000)
    take: dict[str, Any] = {
        "resource_id": row["resource_id"],
        "generation": row["generation"],
        "owner_type": "host",
        "owner_id": "host-b",
        "token_hash": token_hash("tok-b"),
        "now": now,
        "expires_at": now + LEASE,
        "require_free": 0,
    }
    with pytest.raises(RuntimeError), store.db.transaction():
        assert (
            store.db.run("lease_take_next", project_id=store.project_id, exclude=None, digests=None, **take)
            == 0
        )
        assert store.db.run("lease_take", **take) == 1  # the plain claim would have taken it
        raise RuntimeError("roll back")
    assert store.claim_next(runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(3)) is None


# -- schema versions -------------------------------------------------------------------------------
def test_open__refuses_a_schema_newer_than_the_code(pg_url: str) -> None:
    latest = migrations("postgres")[-1][0]
    reader = _pg_reader(pg_url)
    reader.execute("INSERT INTO schema_migrations(version, applied_at) VALUES (%s, 0)", (latest + 1,))
    try:
        with pytest.raises(SchemaTooNew) as caught:
            open_store(pg_url)
        assert f"has schema version {latest + 1}, newer than this Tether's {latest}" in caught.value.message
        assert "upgrade Tether" in caught.value.message
    finally:
        reader.execute("DELETE FROM schema_migrations WHERE version > %s", (latest,))
    with open_store(pg_url) as store:
        assert store.db.migrate() == latest


def test_open__migrations_are_recorded_per_version(pg_url: str) -> None:
    found = _pg_reader(pg_url).execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    assert [v for (v,) in found] == [v for v, _ in migrations("postgres")]


def test_open__migrate_retries_once_when_its_session_was_lost(
    opened: Callable[..., Store], pg_url: str
) -> None:
    """A session ended under a store about to migrate (a worker starting while the server drops
    connections) costs a retry, not the open."""
    store = opened(pool_min=1, pool_max=1, application_name="tether-test-migrate")
    (pid,) = backend_pids(pg_url, "tether-test-migrate")
    _pg_reader(pg_url).execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_for(lambda: pid not in backend_pids(pg_url, "tether-test-migrate"))
    assert store.db.migrate() == migrations("postgres")[-1][0]
    assert pid not in backend_pids(pg_url, "tether-test-migrate")


def test_open__the_store_url_masks_the_password_and_store_options_are_checked(pg_url: str) -> None:
    parts = urlsplit(pg_url)
    user = parts.username or "postgres"
    secret = urlunsplit(
        (parts.scheme, f"{user}:s3cret@{parts.hostname}:{parts.port or 5432}", parts.path, "", "")
    )
    with open_store(with_params(secret, pool_max=2)) as store:
        assert store.db.backend == "postgres"
        assert "s3cret" not in store.url and f"{user}:***@" in store.url
    with pytest.raises(InvalidInput):
        open_store(with_params(pg_url, pool_max="many"))


# -- faults ----------------------------------------------------------------------------------------
def test_connection__a_terminated_pooled_connection_is_replaced(
    opened: Callable[..., Store], pg_url: str
) -> None:
    store = opened(pool_min=1, pool_max=1, application_name="tether-test-terminate")
    store.reserve(**reserve_args("run-1", now=at(0)))
    (pid,) = backend_pids(pg_url, "tether-test-terminate")
    _pg_reader(pg_url).execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_for(lambda: pid not in backend_pids(pg_url, "tether-test-terminate"))
    record = store.get_run("run-1")
    assert record is not None and record.run_id == "run-1"
    assert store.claim(run_id="run-1", runner_id="host-a", claim_token="tok", lease_ms=LEASE, now=at(1))
    assert pid not in backend_pids(pg_url, "tether-test-terminate")


def test_connection__a_whole_pool_of_terminated_sessions_is_replaced_at_the_next_calls(
    opened: Callable[..., Store], pg_url: str
) -> None:
    store = opened(pool_min=6, pool_max=6, application_name="tether-test-all-gone")
    wait_for(lambda: len(backend_pids(pg_url, "tether-test-all-gone")) == 6)
    dead = backend_pids(pg_url, "tether-test-all-gone")
    for pid in dead:
        _pg_reader(pg_url).execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_for(lambda: not dead & backend_pids(pg_url, "tether-test-all-gone"))
    # Each call finds dead pooled sessions at its first statement and moves on to a live one.
    store.reserve(**reserve_args("run-1", now=at(0)))
    assert store.get_run("run-1") is not None
    assert store.claim(run_id="run-1", runner_id="host-a", claim_token="tok", lease_ms=LEASE, now=at(1))
    assert not dead & backend_pids(pg_url, "tether-test-all-gone")


def test_connection__a_session_lost_inside_a_transaction_is_store_unavailable_and_writes_nothing(
    opened: Callable[..., Store], pg_url: str
) -> None:
    from tether.errors import StoreUnavailable

    store = opened(pool_min=1, pool_max=2, application_name="tether-test-lost")
    store.reserve(**reserve_args("run-1", now=at(0)))
    with pytest.raises(StoreUnavailable, match="connection to the database was lost"), store.transaction():
        store.reserve(**reserve_args("run-2", origin_session_id="s2", now=at(1)))
        pid = store.db._local.connection.info.backend_pid  # type: ignore[attr-defined]
        _pg_reader(pg_url).execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(lambda: pid not in backend_pids(pg_url, "tether-test-lost"))
        store.reserve(**reserve_args("run-3", origin_session_id="s3", now=at(2)))
    assert store.get_run("run-2") is None and store.get_run("run-3") is None
    assert [e.run_id for e in store.events_after(0)] == ["run-1"]


def test_connection__one_that_saw_an_error_is_discarded(opened: Callable[..., Store], pg_url: str) -> None:
    import psycopg

    store = opened(pool_min=1, pool_max=1, application_name="tether-test-error")
    store.reserve(**reserve_args("run-1", now=at(0)))
    (before,) = backend_pids(pg_url, "tether-test-error")
    with pytest.raises(StoreError) as caught, store.transaction():
        store.reserve(**reserve_args("run-2", origin_session_id="s2", now=at(1)))
        store.db.run("lease_insert", resource_id="no-such-resource")  # a foreign key refuses it
    assert isinstance(caught.value.__cause__, psycopg.Error)
    assert store.get_run("run-2") is None  # the whole transaction rolled back
    assert store.get_run("run-1") is not None  # and the next call works, on a new connection
    wait_for(lambda: before not in backend_pids(pg_url, "tether-test-error"))
    assert len(backend_pids(pg_url, "tether-test-error")) == 1


@pytest.mark.parametrize("holder_store", ["another store", "the same store"])
def test_lock_timeout__a_run_held_too_long_is_store_busy(
    opened: Callable[..., Store], holder_store: str
) -> None:
    """Held by another store (another process) or by another thread of the same store (the
    writers of a process do not take turns: they meet in the server): the server's lock_timeout
    ends the wait."""
    store = opened(lock_timeout_ms=200)
    holding_store = opened(lock_timeout_ms=200) if holder_store == "another store" else store
    store.reserve(**reserve_args("run-1", now=at(0)))
    assert store.claim(run_id="run-1", runner_id="host-a", claim_token="tok", lease_ms=LEASE, now=at(1))
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with holding_store.transaction():
            assert holding_store.renew(run_id="run-1", claim_token="tok", lease_ms=LEASE, now=at(2))
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        with pytest.raises(StoreBusy, match="due to lock timeout"):
            store.park(run_id="run-1", claim_token="tok", now=at(3))
        assert time.monotonic() - started < 3  # the 200 ms timeout, not the holder's 10 s
    finally:
        release.set()
        thread.join(10)
    assert store.park(run_id="run-1", claim_token="tok", now=at(3))


def test_lock_order__a_journal_writer_never_waits_for_a_second_run(opened: Callable[..., Store]) -> None:
    """A transaction over two runs that already wrote to the journal fails at once with StoreBusy
    when the second run is held (past its journal point it takes row locks NOWAIT): no lock wait
    while holding its own run, and the holder goes on undisturbed. The holder is another store:
    another process."""
    store, other = opened(lock_timeout_ms=5000), opened(lock_timeout_ms=5000)
    store.reserve(**reserve_args("run-a", origin_session_id="sa", now=at(0)))
    store.reserve(**reserve_args("run-b", origin_session_id="sb", now=at(1)))
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with other.transaction():
            other.get_run("run-b")  # inside a write transaction: run-b is locked
            holding.set()
            release.wait(10)
            other.record_event(run_id="run-b", workflow_ref="x", type="holder", now=at(3))

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        with pytest.raises(StoreBusy), store.transaction():
            store.record_event(run_id="run-a", workflow_ref="x", type="first", now=at(2))
            store.record_event(run_id="run-b", workflow_ref="x", type="second", now=at(2))
        assert time.monotonic() - started < 2  # failed at once, not after the lock timeout
    finally:
        release.set()
        thread.join(10)
    assert [e.type for e in store.events_after(0, limit=100) if e.type != "run.queued"] == ["holder"]


def test_idle_in_transaction_timeout__the_server_ends_a_stuck_transaction(
    opened: Callable[..., Store],
) -> None:
    store = opened(idle_in_transaction_timeout_ms=200, pool_min=1, pool_max=1)
    store.reserve(**reserve_args("run-1", now=at(0)))
    with pytest.raises(StoreError), store.transaction():
        assert store.claim(run_id="run-1", runner_id="host-a", claim_token="tok", lease_ms=LEASE, now=at(1))
        time.sleep(0.6)
        store.mark_running(run_id="run-1", claim_token="tok", now=at(2))
    record = store.get_run("run-1")  # a fresh connection; nothing of the ended transaction stayed
    assert record is not None and record.runner_id is None


def test_idle_in_transaction_timeout__also_after_a_round_trip_of_several_statements(
    opened: Callable[..., Store],
) -> None:
    """Several statements in one round trip go out in pipeline mode; leaving it sends a Flush
    after the Sync, which would disarm the server's timeout until the next Sync. The
    transaction stays in pipeline mode until it ends, so the timeout still fires."""
    store = opened(idle_in_transaction_timeout_ms=200, pool_min=1, pool_max=1)
    store.reserve(**reserve_args("run-1", now=at(0)))
    with pytest.raises(StoreUnavailable), store.transaction():
        rows, sources = store.db.each(
            [("run_row", {"run_id": "run-1"}), ("run_sources", {"run_id": "run-1"})]
        )
        assert len(rows) == 1 and len(sources) == 1
        time.sleep(0.6)
        store.db.one("run_row", run_id="run-1")
    assert store.get_run("run-1") is not None


# -- the database clock ----------------------------------------------------------------------------
def test_clock__lease_instants_come_from_the_database_when_no_now_is_given(
    opened: Callable[..., Store], pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tether.store.db
    import tether.values

    # The process clock is a century off; a PostgreSQL store does not consult it.
    far = int(datetime(2126, 1, 1, tzinfo=UTC).timestamp() * 1000)
    monkeypatch.setattr(tether.values, "now_ms", lambda: far)
    monkeypatch.setattr(tether.store.db, "now_ms", lambda: far)
    store = opened()
    before = database_ms(pg_url)
    store.reserve(**{**reserve_args("run-1"), "now": None})
    record = store.claim(run_id="run-1", runner_id="host-a", claim_token="tok", lease_ms=LEASE)
    after = database_ms(pg_url)
    assert record is not None and record.claim_expires_at is not None and record.created_at is not None
    expires = int(record.claim_expires_at.timestamp() * 1000)
    assert before + LEASE <= expires <= after + LEASE
    assert before <= int(record.created_at.timestamp() * 1000) <= after
    # Live by the database clock, though the process clock says it expired a century ago.
    assert store.verify_claim(run_id="run-1", claim_token="tok")
    assert not store.verify_claim(
        run_id="run-1", claim_token="tok", now=datetime.fromtimestamp(far / 1000, UTC)
    )
    assert before <= store.db.now_ms() < far


def test_clock__a_write_transaction_reads_the_clock_once_while_nothing_can_wait(
    opened: Callable[..., Store], record_sent: Callable[[], list[str]]
) -> None:
    """Once a write transaction has written the journal (its journal point) none of its
    statements waits for a row lock, so the instant read with the round trip that wrote it
    serves every later call of the transaction."""
    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    assert store.claim(run_id="run-1", runner_id="host-a", claim_token="tok-a", lease_ms=LEASE)
    sent = record_sent()
    with store.transaction():
        store.record_event(run_id="run-1", workflow_ref="wf", type="note.added")  # the journal point
        taken = next(
            i for i, q in enumerate(sent) if "tether_event_seq(" in q or "pg_advisory_xact_lock_shared" in q
        )
        assert any("clock_timestamp()" in q for q in sent[taken:])
        clock_reads = sum("clock_timestamp()" in q for q in sent)
        instants = []
        for _ in range(3):
            assert store.renew(run_id="run-1", claim_token="tok-a", lease_ms=LEASE)
            instants.append(store.db.now_ms())
    assert sum("clock_timestamp()" in q for q in sent) == clock_reads
    assert len(set(instants)) == 1


def test_clock__a_write_transaction_reads_the_clock_again_after_a_lock_wait(
    opened: Callable[..., Store],
) -> None:
    """A call that waited for a run lock another transaction held leaves the transaction's next
    call an instant from after the wait, not the one read before it."""
    store, other = opened(), opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    assert store.claim(run_id="run-1", runner_id="host-a", claim_token="tok-a", lease_ms=LEASE)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with other.transaction():
            assert other.renew(run_id="run-1", claim_token="tok-a", lease_ms=LEASE)
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    threading.Timer(0.3, release.set).start()
    with store.transaction():
        before = store.db.now_ms()
        assert store.renew(run_id="run-1", claim_token="tok-a", lease_ms=LEASE)  # waits for the lock
        after = store.db.now_ms()
    holder.join(10)
    assert after - before >= 250, (before, after)


# -- writes queued to go with the next statement ----------------------------------------------------
def queued_revisions(store: Store, run_id: str, revision: int, key: str = "k0") -> list[dict[str, object]]:
    """One viewer revision row of a run at a revision, naming a target under ``key``."""
    return [
        {
            "run_id": run_id,
            "first": revision,
            "last": revision,
            "changes": json.dumps([[["summary", key, []]]]),
            "now": store.db.now_ms(),
        }
    ]


def test_run_many__queued_rows_go_out_with_the_next_statement_in_one_round_trip(
    opened: Callable[..., Store], count_syncs: Callable[[], list[int]]
) -> None:
    """run_many sends nothing by itself: its rows go out pipelined ahead of the transaction's next
    statement, which sees them; rows queued last go out with the commit."""
    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    pipelines = count_syncs()
    with store.transaction():
        revisions = queued_revisions(store, "run-1", 100) + queued_revisions(store, "run-1", 101)
        before = len(pipelines)
        store.db.run_many("viewer_revision_insert", revisions)
        assert len(pipelines) == before  # nothing sent yet
        seen = store.db.all("viewer_revisions_after", run_id="run-1", revision=99)
        assert [r["last_revision"] for r in seen] == [100, 101]
        assert len(pipelines) == before + 1
        store.db.run_many("viewer_revision_insert", queued_revisions(store, "run-1", 102))
        before = len(pipelines)
    assert len(pipelines) == before + 1  # the commit's
    landed = store.db.all("viewer_revisions_after", run_id="run-1", revision=99)
    assert [r["last_revision"] for r in landed] == [100, 101, 102]


def _session_prepared(store: Store) -> dict[str, str]:
    """The statements prepared on the connection of the thread's open transaction, by name."""
    wire = store.db._local.wire  # type: ignore[attr-defined]
    (result,) = wire.round_trip([(Statement("SELECT name, statement FROM pg_prepared_statements"), {})])
    return {row["name"]: row["statement"] for row in wire.rows(result)}


def test_wire__a_statement_is_prepared_once_per_connection_and_its_parameter_types(
    opened: Callable[..., Store],
) -> None:
    """A query run again on a connection is not prepared again; statements without parameters
    (BEGIN, COMMIT) are never prepared."""
    store = opened(pool_max=1)
    store.reserve(**reserve_args("run-1", now=at(0)))
    for _ in range(3):
        with store.db.transaction(write=False):
            assert store.db.one("run_row", run_id="run-1")["run_id"] == "run-1"
            assert store.db.one("run_row", run_id="no-such-run") is None
    with store.db.transaction(write=False):
        prepared = _session_prepared(store)
    run_rows = [text for text in prepared.values() if "FROM runs r JOIN workflow_definitions" in text]
    assert len(run_rows) == 1
    assert not [text for text in prepared.values() if text.startswith(("BEGIN", "COMMIT"))]


def test_wire__a_refused_statement_leaves_no_prepared_name_behind(opened: Callable[..., Store]) -> None:
    """A statement the server refuses to prepare, and one skipped after it, are prepared afresh
    the next time they run on the connection; the one prepared before the refusal is kept."""
    import psycopg

    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    connection = store.db._checkout()  # type: ignore[attr-defined]
    try:
        wire = store.db._wire(connection)  # type: ignore[attr-defined]
        wire.enter()  # outside a transaction: each round trip is a transaction of its own
        first, wrong, skipped = (
            Statement(f"SELECT {column} FROM runs WHERE run_id = :run_id")
            for column in ("run_id", "no_such_column", "workflow_ref")
        )
        for _ in range(2):
            with pytest.raises(psycopg.errors.UndefinedColumn):
                wire.round_trip(
                    [
                        (first, {"run_id": "run-1"}),
                        (wrong, {"run_id": "run-1"}),
                        (skipped, {"run_id": "run-1"}),
                    ]
                )
        results = wire.round_trip([(first, {"run_id": "run-1"}), (skipped, {"run_id": "run-1"})])
        found = [wire.rows(result) for result in results]
        assert found == [[{"run_id": "run-1"}], [{"workflow_ref": "builtin:demo"}]]
        wire.leave()
    finally:
        store.db._return(connection, broken=True)  # type: ignore[attr-defined]


def test_wire__a_value_the_driver_refuses_sends_nothing_of_its_round_trip(
    opened: Callable[..., Store],
) -> None:
    """Every value of a round trip is converted before anything is sent: a refused one (a NUL
    character) leaves the connection as it was, the statements before it not even prepared."""
    import psycopg

    store = opened(pool_max=1)
    store.reserve(**reserve_args("run-1", now=at(0)))
    new = Statement("SELECT status FROM run_queue WHERE run_id = :run_id")
    with store.db.transaction(write=False):
        wire = store.db._local.wire  # type: ignore[attr-defined]
        with pytest.raises(psycopg.DataError):
            wire.round_trip([(new, {"run_id": "run-1"}), (new, {"run_id": "nul\x00"})])
        (result,) = wire.round_trip([(new, {"run_id": "run-1"})])
        assert wire.rows(result) == [{"status": "queued"}]


def test_wire__a_round_trip_larger_than_the_socket_buffers_completes(opened: Callable[..., Store]) -> None:
    """Thousands of queued rows (megabytes of messages, thousands of replies) go out in one round
    trip without the client and the server each waiting for the other to read."""
    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    with store.transaction():
        rows = [
            row
            for revision in range(100, 6100)
            for row in queued_revisions(store, "run-1", revision, "k" * 200)
        ]
        store.db.run_many("viewer_revision_insert", rows)
        seen = store.db.all("viewer_revisions_after", run_id="run-1", revision=99)
    assert len(seen) == 6000


def test_expect__sends_nothing_by_itself_and_refuses_a_write_whose_rows_are_its_answer(
    opened: Callable[..., Store], count_syncs: Callable[[], list[int]]
) -> None:
    """A write sent with expect goes out pipelined ahead of the transaction's next statement
    (no round trip of its own); a write that returns rows cannot be sent that way."""
    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    syncs = count_syncs()
    with store.transaction():
        row = store.db.one("run_row", run_id="run-1")
        before = len(syncs)
        store.db.expect(
            "queue_set_status",
            "the queue moved",
            run_id="run-1",
            status="parked",
            now=1,
            clear_error=0,
            stamp_start=0,
            sources='["queued"]',
        )
        assert len(syncs) == before  # nothing sent yet
        assert store.db.one("run_row", run_id="run-1")["status"] == "parked"
        assert len(syncs) == before + 1
        assert row["status"] == "queued"
        with pytest.raises(TetherError, match="attempt_finish: only a write that returns no rows"):
            store.db.expect("attempt_finish", "x", run_id="run-1")
    assert store.db.one("run_row", run_id="run-1")["status"] == "parked"


def test_complete__after_a_write_in_its_transaction_takes_one_round_trip(
    opened: Callable[..., Store], count_syncs: Callable[[], list[int]]
) -> None:
    """A runner's finish: the durable move, then complete(). complete() reads the run again (the
    move wrote since) together with the run's effects, in one round trip; its status moves, the
    lease release, the event and the viewer revision go out with the commit."""
    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    assert store.claim(run_id="run-1", runner_id="host-a", claim_token="tok", lease_ms=LEASE, now=at(0))
    assert store.mark_running(run_id="run-1", claim_token="tok", now=at(0))
    store.set_run_status(run_id="run-1", claim_token="tok", status="running", now=at(0))
    syncs = count_syncs()
    with store.transaction():
        store.set_run_status(run_id="run-1", claim_token="tok", status="completed", now=at(1))
        before = len(syncs)
        assert store.complete(run_id="run-1", claim_token="tok", now=at(1))
        assert len(syncs) == before + 1
    record = store.get_run("run-1")
    assert record is not None and record.status == "done" and record.runner_id is None


@pytest.mark.parametrize("where", ["the next statement", "the commit"])
def test_run_many__an_error_in_queued_rows_fails_the_transaction_and_writes_nothing(
    opened: Callable[..., Store], where: str
) -> None:
    """A queued row the database refuses (a foreign key: no such run) fails the statement or
    commit it went out with, as Tether's own error, and the whole transaction rolls back."""
    import psycopg

    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    with pytest.raises(StoreError) as caught, store.transaction():
        store.reserve(**reserve_args("run-2", origin_session_id="s2", now=at(1)))
        store.db.run_many("viewer_revision_insert", queued_revisions(store, "no-such-run", 1))
        if where == "the next statement":
            store.db.one("viewer_get", run_id="run-1")
            raise AssertionError("the statement after the refused rows succeeded")
    assert isinstance(caught.value.__cause__, psycopg.errors.ForeignKeyViolation)
    assert type(caught.value) is StoreError  # refused, so not a commit of unknown outcome
    assert store.get_run("run-2") is None
    assert store.db.all("viewer_revisions_after", run_id="run-1", revision=0) == []
    assert store.get_run("run-1") is not None  # the next call works


def test_queued_writes__a_value_the_driver_cannot_send_is_invalid_input_and_frees_the_connection(
    opened: Callable[..., Store],
) -> None:
    """A viewer delta queued with a value the driver cannot encode (a lone surrogate) goes out
    with the commit: the call raises InvalidInput, writes nothing, and the store's one pooled
    connection serves the next call at once."""
    store = opened(pool_max=1)
    store.reserve(**reserve_args("run-1", now=at(0)))
    with pytest.raises(InvalidInput):
        store.viewer_record(run_id="run-1", targets=[ViewerTarget("summary", "bad\ud800")])
    assert store.db.one("viewer_get", run_id="run-1")["presentation_revision"] == 1
    revisions: list[int] = []
    run_threads([lambda: revisions.append(store.viewer_record(run_id="run-1", targets=["summary"]))], 10)
    assert revisions == [2]


def test_each__a_query_after_the_journal_point_waits_for_no_row_lock(
    opened: Callable[..., Store], record_sent: Callable[[], list[str]]
) -> None:
    """In one round trip, the queries after the first that reaches the journal point take their
    row locks NOWAIT."""
    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    resource_id = store.db.one("run_row", run_id="run-1")["resource_id"]
    sent = record_sent()
    with store.transaction():
        bump = {
            "event_id": "event-each",
            "resource_id": resource_id,
            "type": "note.each",
            "actor_type": "session",
            "actor_id": None,
            "generation": None,
            "payload_hash": None,
            "payload": "{}",
            "now": 1,
        }
        advance = {"run_id": "run-1", "window": 256, "now": 1}
        (event,), (viewer,) = store.db.each([("resource_bump_event", bump), ("viewer_advance", advance)])
        assert viewer["presentation_revision"] == 2
    viewer_locks = [q for q in sent if "FROM viewer_runs" in q and "FOR NO KEY UPDATE" in q]
    assert len(viewer_locks) == 1 and "NOWAIT" in viewer_locks[0]
    assert event["event_seq"] == store.last_event_seq()


def test_blob_put__different_bytes_queued_up_to_the_commit_fail_it_as_a_conflict(
    opened: Callable[..., Store],
) -> None:
    """A blob write goes out queued; different bytes under a stored hash, sent only with the
    COMMIT, still fail the transaction as the blob conflict, and nothing of it is written."""
    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))  # its launch options are the blob '{}'
    events = [e.seq for e in store.events_after(0)]
    with pytest.raises(Conflict) as caught, store.transaction():
        store.record_event(run_id="run-1", workflow_ref="wf", type="note.a")
        store.db.queue(
            "blob_put", hash=sha256(b"{}"), media_type="application/json", length=2, content=b"[]", now=1
        )
    assert caught.value.message == "Content-addressed blob conflict"
    assert [e.seq for e in store.events_after(0)] == events
    assert store.db.one("blob_get", hash=sha256(b"{}"))["content"] == b"{}"


def test_queued_writes__after_a_failed_statement_the_transaction_goes_no_further(
    opened: Callable[..., Store],
) -> None:
    """A caller that catches a failed call and goes on in the same transaction gets StoreError
    from every later call and from the commit, and nothing of the transaction is written (the
    failed call dropped the writes queued with it; committing the rest would leave the run's
    journal and viewer numbers behind what the store handed out)."""
    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    events = [e.seq for e in store.events_after(0)]
    with pytest.raises(StoreError, match="An earlier statement") as at_commit, store.transaction():
        store.record_event(run_id="run-1", workflow_ref="wf", type="note.a")
        with pytest.raises(InvalidInput):
            # Its writes are queued: the unsendable type fails the next statement at the latest.
            store.record_event(run_id="run-1", workflow_ref="wf", type="note.b\ud800")
            store.get_run("run-1")
        with pytest.raises(StoreError, match="An earlier statement"):
            store.record_event(run_id="run-1", workflow_ref="wf", type="note.c")
        with pytest.raises(StoreError, match="An earlier statement"):
            store.db.queue("viewer_revision_prune", run_id="run-1", retained=1)
    assert at_commit.value is not None
    assert [e.seq for e in store.events_after(0)] == events
    assert store.db.one("viewer_get", run_id="run-1")["presentation_revision"] == 1
    assert store.record_event(run_id="run-1", workflow_ref="wf", type="note.d").type == "note.d"


# -- URL parameters ----------------------------------------------------------------------------------
def test_open__libpq_options_with_spaces_reach_the_server(opened: Callable[..., Store]) -> None:
    """``options=-c name=value`` holds spaces and ``=``; they must reach libpq intact."""
    store = opened(options="-c statement_timeout=4321 -c work_mem=8MB")
    connection = store.db._checkout()  # type: ignore[attr-defined]
    try:
        timeout = connection.execute("SHOW statement_timeout").fetchone()
    finally:
        store.db._return(connection, broken=False)  # type: ignore[attr-defined]
    assert timeout is not None and timeout["statement_timeout"] == "4321ms"
    assert store.get_run("nothing") is None


# -- change notices ------------------------------------------------------------------------------
def listen(url: str) -> Any:
    import psycopg

    connection = psycopg.connect(url, autocommit=True)
    connection.execute("LISTEN tether_runs")
    connection.execute("LISTEN tether_events")
    return connection


def received(connection: Any, timeout: float) -> set[str]:
    return {notice.channel for notice in connection.notifies(timeout=timeout)}


def test_notices__sent_with_the_commit_and_never_for_a_rolled_back_transaction(
    opened: Callable[..., Store], pg_url: str
) -> None:
    store = opened()
    listener = listen(pg_url)
    try:
        with pytest.raises(RuntimeError), store.transaction():
            store.reserve(**reserve_args("run-1", now=at(0)))
            raise RuntimeError("roll back")
        assert received(listener, 0.3) == set()
        store.get_run("run-1")
        assert received(listener, 0.3) == set(), "a read sends nothing"
        store.reserve(**reserve_args("run-1", now=at(0)))
        assert received(listener, 5.0) == {"tether_runs", "tether_events"}
        store.claim(run_id="run-1", runner_id="host-a", claim_token="tok", lease_ms=LEASE, now=at(1))
        assert received(listener, 5.0) == {"tether_events"}, "a claim makes no run claimable"
    finally:
        listener.close()


def test_notices__a_terminated_listening_connection_is_replaced(
    opened: Callable[..., Store], pg_url: str
) -> None:
    store = opened()
    writer = opened()
    runs = threading.Event()
    store.changes.subscribe("runs", runs)
    assert runs.wait(10.0)
    runs.clear()
    (pid,) = (
        _pg_reader(pg_url)
        .execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE query LIKE 'LISTEN tether_%' AND datname = current_database()"
        )
        .fetchone()
    )
    _pg_reader(pg_url).execute("SELECT pg_terminate_backend(%s)", (pid,))
    assert runs.wait(15.0), "the watcher reconnects and wakes its subscribers"
    runs.clear()
    writer.reserve(**reserve_args("run-1", now=at(0)))
    assert runs.wait(10.0)


# -- commits whose outcome is unknown --------------------------------------------------------------
class CommitCutter:
    """A TCP proxy in front of the PostgreSQL server. Armed, it cuts the client connection that
    sends the next ``COMMIT``: ``landed`` forwards the COMMIT first (the write lands, the reply is
    lost), ``lost`` drops it (nothing lands). Every other byte passes through unchanged."""

    def __init__(self, host: str, port: int) -> None:
        import socket

        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.mode: str | None = None
        self.cuts = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, mode: str) -> None:
        self.mode = mode

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            cut = threading.Event()
            threading.Thread(target=self._upstream, args=(client, server, cut), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, cut), daemon=True).start()

    def _upstream(self, client: Any, server: Any, cut: threading.Event) -> None:
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                break
            if not data:
                break
            with self.lock:
                mode = self.mode if b"COMMIT\x00" in data else None
                if mode is not None:
                    self.mode = None
                    self.cuts += 1
            if mode is not None:
                cut.set()  # from here on the server's replies go nowhere
            if mode == "landed":
                server.sendall(data)
                time.sleep(0.3)  # the server commits; its reply goes nowhere
            if mode is not None:
                break
            server.sendall(data)
        for end in (client, server):
            with suppress(OSError):
                end.shutdown(2)
            end.close()

    def _downstream(self, server: Any, client: Any, cut: threading.Event) -> None:
        while True:
            try:
                data = server.recv(65536)
                if not data or cut.is_set():
                    break
                client.sendall(data)
            except OSError:
                break

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def cutter(pg_url: str) -> Iterator[tuple[CommitCutter, str]]:
    parts = urlsplit(pg_url)
    proxy = CommitCutter(parts.hostname or "127.0.0.1", parts.port or 5432)
    user = parts.username or "postgres"
    url = urlunsplit((parts.scheme, f"{user}@127.0.0.1:{proxy.port}", parts.path, parts.query, ""))
    yield proxy, url
    proxy.close()


def event_types(store: Store) -> list[str]:
    return [event.type for event in store.events_after(0, limit=1000)]


@pytest.mark.parametrize("mode", ["landed", "lost"])
def test_commit_unknown__a_reservation_is_read_back_not_repeated(
    cutter: tuple[CommitCutter, str], pg_url: str, mode: str
) -> None:
    proxy, url = cutter
    with open_store(url) as store:
        proxy.arm(mode)
        record = store.reserve(**reserve_args("run-1", now=at(0)))
        assert proxy.cuts == 1
        assert record.run_id == "run-1" and record.status == "queued"
        assert event_types(store) == ["run.queued"], "exactly one reservation"
        proxy.arm(mode)
        preparation = store.reserve_or_adopt(**reserve_args("run-2", origin_session_id="s2", now=at(1)))
        assert proxy.cuts == 2
        assert preparation.run.run_id == "run-2"
        assert preparation.state == ("adopted" if mode == "landed" else "reserved")
        assert event_types(store) == ["run.queued", "run.queued"]


@pytest.mark.parametrize("mode", ["landed", "lost"])
def test_commit_unknown__a_claim_is_resolved_by_its_token(
    cutter: tuple[CommitCutter, str], pg_url: str, mode: str
) -> None:
    proxy, url = cutter
    with open_store(url) as store:
        store.reserve(**reserve_args("run-1", now=at(0)))
        proxy.arm(mode)
        record = store.claim_next(runner_id="host-a", claim_token="tok-a", lease_ms=LEASE, now=at(1))
        assert proxy.cuts == 1
        if mode == "landed":
            assert record is not None and record.claim_token == "tok-a" and record.claim_generation == 1
            assert store.verify_claim(run_id="run-1", claim_token="tok-a", now=at(2))
            assert event_types(store) == ["run.queued", "lease.claimed"]
        else:
            assert record is None
            assert event_types(store) == ["run.queued"]
            again = store.claim_next(runner_id="host-a", claim_token="tok-b", lease_ms=LEASE, now=at(2))
            assert again is not None and again.claim_generation == 1
        proxy.arm(mode)
        other = store.claim(
            run_id="run-1", runner_id="host-b", claim_token="tok-c", lease_ms=LEASE, now=at(3)
        )
        assert other is None, "a live claim is not taken over, cut or not"


# -- schema upgrades as a separate step ------------------------------------------------------------
def test_schema__a_fresh_database_is_refused_without_migrate_and_db_upgrade_creates_it() -> None:
    from tether.cli import main as cli_main
    from tether.errors import SchemaOutdated
    from tether.store import schema_version

    name = f"tether_fresh_{uuid.uuid4().hex[:12]}"
    admin = pg_connect(PG_URL)
    admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(PG_URL, name)
    try:
        with pytest.raises(SchemaOutdated, match="tether db upgrade"):
            open_store(url, migrate=False)
        tables = _pg_reader(url).execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        assert tables.fetchone()[0] == 0, "a refused open creates nothing"
        assert cli_main(["--store", url, "db", "upgrade"]) == 0
        latest = migrations("postgres")[-1][0]
        assert schema_version(url) == (latest, latest)
        with open_store(url, migrate=False) as store:
            assert store.get_run("nothing") is None
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def test_migrations_8_to_13__upgrade_a_populated_store_of_version_7(pg_url: str) -> None:
    """A store as version 7 left it (journal numbered 1, 2, 3 by the event_sequence counter, no
    0008 functions, no cancel mark or workers table, no retention index, no schedules or run inbox tables) is
    upgraded by opening it: old entries keep their numbers and order, new ones come after them,
    and readers, prune, schedules and events work."""
    store = open_store(pg_url)
    for n in range(3):
        store.reserve(**reserve_args(f"run-{n}", origin_session_id=f"s-{n}", now=at(n)))
        store.record_event(run_id=f"run-{n}", workflow_ref="x", type="note", now=at(10 + n))
    assert store.cancel(run_id="run-0", now=at(20))
    store.close()
    reader = pg_connect(pg_url)
    try:
        with reader.transaction():
            reader.execute(
                "UPDATE events SET event_seq = numbered.n FROM ("
                "SELECT event_seq, row_number() OVER (ORDER BY event_seq) AS n FROM events) AS numbered "
                "WHERE events.event_seq = numbered.event_seq"
            )
            (old,) = reader.execute("SELECT count(*) FROM events").fetchone()
            reader.execute(
                "CREATE TABLE event_sequence (id INTEGER PRIMARY KEY CHECK (id = 1), "
                "value BIGINT NOT NULL CHECK (value >= 0))"
            )
            reader.execute("INSERT INTO event_sequence(id, value) VALUES (1, %s)", (old,))
            reader.execute("DROP FUNCTION tether_event_seq(TEXT)")
            reader.execute("DROP FUNCTION tether_journal_horizon()")
            reader.execute("DROP INDEX run_queue_finished")
            reader.execute("DROP TABLE schedules")  # migration 11's tables
            reader.execute("DROP TABLE run_inbox")
            reader.execute("DROP TABLE run_event_waits")
            reader.execute("DROP TABLE run_children CASCADE")  # migration 13's table and view
            reader.execute("DROP TABLE workers")  # migration 9's table and column
            reader.execute("ALTER TABLE run_queue DROP COLUMN cancel_requested_at")
            reader.execute("ALTER TABLE run_queue DROP COLUMN limit_key, DROP COLUMN limit_max")  # 12
            reader.execute("DELETE FROM schema_migrations WHERE version >= 8")
    finally:
        reader.close()
    upgraded = open_store(pg_url)
    try:
        latest = migrations("postgres")[-1][0]
        assert upgraded.db.schema_version() == (latest, latest)
        journal = upgraded.events_after(0, limit=1000)
        assert [e.seq for e in journal] == list(range(1, old + 1))
        assert [e.type for e in journal if e.type == "note"] == ["note"] * 3
        assert upgraded.last_event_seq() == old
        event = upgraded.record_event(run_id="run-1", workflow_ref="x", type="after", now=at(30))
        assert event.seq > old
        assert [e.type for e in upgraded.events_after(old)] == ["after"]
        assert upgraded.prune(finished_before=at(1_000)).run_ids == ["run-0"]
        added = upgraded.schedule_add(ScheduleSpec("nightly", "x", "0 2 * * *", "UTC", None, "skip"))
        assert [s.name for s in upgraded.schedules()] == [added.name]
        upgraded.event_send(run_id="run-1", name="go", payload={"n": 1})
        assert [e.payload for e in upgraded.inbox("run-1")] == [{"n": 1}]
    finally:
        upgraded.close()
    assert _pg_reader(pg_url).execute("SELECT to_regclass('event_sequence')").fetchone() == (None,)


def test_blob_put__queued_blobs_go_out_first_in_the_order_of_their_hashes(
    opened: Callable[..., Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blobs queued in a round trip are inserted before the rest of it, by hash, so two
    transactions inserting the same new blobs never wait for each other in a cycle."""
    store = opened()
    store.reserve(**reserve_args("run-1", now=at(0)))
    sent: list[bytes] = []
    round_trip = Wire.round_trip

    def recording(self: Wire, calls: Any) -> Any:
        sent.extend(bytes(params["hash"]) for statement, params in calls if "INTO blobs" in statement.sql)
        return round_trip(self, calls)

    monkeypatch.setattr(Wire, "round_trip", recording)
    contents = [f"text {n}".encode() for n in range(8)]
    with store.transaction():
        for content in contents:
            store._put(content, "text/plain", 1)
        store.record_event(run_id="run-1", workflow_ref="x", type="note", now=at(1))
    expected = sorted(sha256(content) for content in contents)
    assert [h for h in sent if h in expected] == expected
    assert all(store._get(sha256(content)) == ("text/plain", content) for content in contents)
