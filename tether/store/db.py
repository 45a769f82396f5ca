"""The SQLite connection layer: named queries, re-entrant transactions, driver errors mapped.

One connection per thread (SQLite connections are not shared across threads), WAL, foreign keys
on, a busy timeout, and ``BEGIN IMMEDIATE`` for every transaction that may write so that two writers
serialise at ``BEGIN`` instead of failing at their first write.

``Database`` is what the store logic needs from a backend; ``SqliteDatabase`` here and
``PostgresDatabase`` (tether.store.postgres) both provide it.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from importlib import resources
from pathlib import Path
from typing import Any, Protocol, TypeVar

from tether.errors import (
    Conflict,
    InconsistentState,
    InvalidInput,
    SchemaTooNew,
    SessionBusy,
    StoreBusy,
    StoreError,
    TetherError,
)
from tether.store.faults import fault_point
from tether.store.notices import SqliteWatcher, Watcher
from tether.values import now_ms

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_WORD = re.compile(r"\w+")
#: Stands for every table in a query's ``names`` (see ``tables_named``).
EVERY_TABLE = "*"
#: A statement that writes rows (a row lock, ``FOR UPDATE``, is not a write).
_WRITE = re.compile(
    r"\b(INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+(\s+AS\s+\w+)?\s+SET|DELETE\s+FROM)\b", re.IGNORECASE
)


log = logging.getLogger("tether.store")

T = TypeVar("T")
#: Idle connections a SQLite store keeps, and prepared statements each caches.
IDLE_CONNECTIONS = 16
IDLE_STATEMENTS = 256
#: Write commits of a process between two checkpoints by its ``Checkpointer``, and the size of
#: the write-ahead log, in pages, past which a commit checkpoints by itself (SQLite's automatic
#: checkpoint, kept as a backstop should that thread fall behind; SQLite's default is 1,000).
CHECKPOINT_COMMITS = 100
AUTOCHECKPOINT_PAGES = 10_000


class Row(Protocol):
    """A result row: columns by name (sqlite3.Row on SQLite, a dict on PostgreSQL)."""

    def __getitem__(self, key: str, /) -> Any: ...


class Database(Protocol):
    """The connection layer the store logic runs on (one per store)."""

    @property
    def backend(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def in_transaction(self) -> bool: ...

    def transaction(self, *, write: bool = True, first: bool = False) -> AbstractContextManager[None]: ...

    def one(self, name: str, /, **params: Any) -> Row | None: ...

    def all(self, name: str, /, **params: Any) -> list[Row]: ...

    def run(self, name: str, /, **params: Any) -> int: ...

    def queue(self, name: str, /, **params: Any) -> None: ...

    def expect(self, name: str, failure: str, /, **params: Any) -> None: ...

    def run_many(self, name: str, rows: Sequence[Mapping[str, Any]], /) -> None: ...

    def each(self, calls: Sequence[tuple[str, Mapping[str, Any]]], /) -> list[list[Row]]: ...

    @property
    def writes(self) -> int: ...

    def defer(self, key: str, tables: frozenset[str], flush: Callable[[], None]) -> None: ...

    def flush_deferred(self, names: Sequence[str] = ()) -> None: ...

    def now_ms(self) -> int: ...

    def settle_journal(self) -> None: ...

    def migrate(self) -> int: ...

    def schema_version(self) -> tuple[int, int]: ...

    def notify(self, channel: str) -> None: ...

    @property
    def memo(self) -> dict[Any, Any]: ...

    def watcher(self) -> Watcher: ...

    def close(self) -> None: ...


def load_queries(backend: str) -> dict[str, str]:
    """Every ``-- name: x`` block of the backend's ``sql/<backend>/*.sql`` files, by name."""
    queries: dict[str, str] = {}
    folder = resources.files("tether.store") / "sql" / backend
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _NAME.split(entry.read_text("utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise RuntimeError(f"query {name} is defined twice")
            queries[name] = body.strip()
    return queries


def tables_named(body: str) -> frozenset[str]:
    """The words of a query's SQL, lower-cased: a superset of the tables it reads or writes. A
    query that deletes rows names every table (``EVERY_TABLE``): a delete cascades into the
    tables that reference the rows it removes."""
    words = frozenset(word.lower() for word in _WORD.findall(body))
    return words | {EVERY_TABLE} if "delete" in words else words


def writes_rows(statements: Sequence[str]) -> bool:
    """Whether any of a query's statements writes rows."""
    return any(_WRITE.search(statement) for statement in statements)


def sql_statements(body: str) -> tuple[str, ...]:
    """The statements of a query body or a migration: full-line comments dropped, split at ``;``
    outside ``$$``-quoted function bodies (our SQL holds no semicolons inside other literals)."""
    code = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))
    statements = [""]
    for index, part in enumerate(code.split("$$")):
        if index % 2:
            statements[-1] += f"$${part}$$"
            continue
        first, *rest = part.split(";")
        statements[-1] += first
        statements.extend(rest)
    return tuple(statement.strip() for statement in statements if statement.strip())


def migrations(backend: str) -> list[tuple[int, str]]:
    folder = resources.files("tether.store") / "sql" / backend / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.read_text("utf-8")))
    return sorted(found)


#: Different bytes stored under a blob's hash (a collision): blob_put refuses to store them.
BLOB_CONFLICT = "Content-addressed blob conflict"


def _translated(
    statements: Sequence[str],
    params: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    result: Callable[[sqlite3.Cursor], T],
    connection: sqlite3.Connection,
    *,
    many: bool = False,
) -> T:
    """Run a query's statements in order (``many``: its one statement once per parameter set):
    ``result`` of the last one's cursor, with driver errors as Tether's own."""
    try:
        if many:
            (statement,) = statements
            return result(connection.executemany(statement, params))
        *leading, last = statements
        for statement in leading:
            connection.execute(statement, params)
        return result(connection.execute(last, params))
    except sqlite3.Error as error:
        raise translate_error(error) from error
    except (UnicodeEncodeError, OverflowError) as error:
        # The driver cannot bind the caller's value (a lone surrogate, an integer past 64 bits).
        raise InvalidInput(f"A value passed to Tether cannot be used: {error}") from error


def _rowcount(cursor: sqlite3.Cursor) -> int:
    return cursor.rowcount


def translate_error(error: sqlite3.Error) -> TetherError:
    """A driver error as Tether's own exception type (the driver error stays as ``__cause__``)."""
    text = str(error)
    if isinstance(error, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return StoreBusy(f"The database is locked by another writer; retry the call ({text})")
    if isinstance(error, sqlite3.IntegrityError) and "run_queue.origin_session_id" in text:
        return SessionBusy("The origin session already has an active interactive run")
    if isinstance(error, sqlite3.IntegrityError) and "byte_length = length(content)" in text:
        return Conflict(BLOB_CONFLICT)  # blob_put met different bytes under the hash
    name = getattr(error, "sqlite_errorname", "") or ""
    if name.startswith("SQLITE_FULL"):
        return StoreError(f"The disk holding the database is full; nothing was written ({text})")
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")):
        return StoreError(
            "The database cannot be written (a read-only file system, file or folder); "
            f"nothing was written ({text})"
        )
    return StoreError(f"The database refused the operation: {text}")


class _Join:
    """A nested ``transaction()`` block: it joins the thread's open transaction, so only the
    nesting depth changes (the outermost block commits or rolls back all of it)."""

    __slots__ = ("local",)

    def __init__(self, local: threading.local) -> None:
        self.local = local

    def __enter__(self) -> None:
        self.local.depth += 1

    def __exit__(self, *exc: object) -> None:
        self.local.depth -= 1


class WriterTurns:
    """The turns of one process's writers: one at a time, each turn handed at release to a waiting
    writer (a writer that releases and asks again queues behind the ones already waiting). A
    waiting ``first`` writer (a runner's claim) goes before the others, so a runner busy with many
    runs still claims runs (an expired lease's above all) as soon as the write in progress commits
    instead of behind every run thread's next step; but at most ``FIRST_STREAK`` first writers in a
    row pass a waiting other writer, so a stream of them (run threads each claiming with a
    completion) never starves it (a timer sweep, say)."""

    FIRST_STREAK = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = False
        self._firsts: deque[threading.Event] = deque()
        self._others: deque[threading.Event] = deque()
        #: First writers granted in a row while another writer waited.
        self._streak = 0

    @property
    def waiting(self) -> int:
        """Writers waiting for their turn (for tests and diagnostics)."""
        with self._lock:
            return len(self._firsts) + len(self._others)

    def acquire(self, timeout_s: float, *, first: bool = False) -> bool:
        """Wait for the turn, at most ``timeout_s``; whether it was taken."""
        with self._lock:
            if not self._held:
                self._held = True  # nobody waits while the turn is free: a release hands it on
                return True
            granted = threading.Event()
            queue = self._firsts if first else self._others
            queue.append(granted)
        if granted.wait(timeout_s):
            return True
        with self._lock:
            if granted.is_set():
                return True  # handed over as the wait ran out
            queue.remove(granted)
            return False

    def release(self) -> None:
        with self._lock:
            if self._firsts and (not self._others or self._streak < self.FIRST_STREAK):
                self._streak = self._streak + 1 if self._others else 0
                self._firsts.popleft().set()
            elif self._others:
                self._streak = 0
                self._others.popleft().set()
            else:
                self._held = False


class ThreadTransactions:
    """What both backends keep per thread about its open transaction (``_local``: ``depth`` of
    nested ``transaction()`` blocks, and the ``memo`` of the outermost one)."""

    _local: threading.local

    def transaction(self, *, write: bool = True, first: bool = False) -> AbstractContextManager[None]:
        """Join the thread's open transaction, or open one (``BEGIN IMMEDIATE`` on SQLite when
        writing). ``first``: a write that this process's waiting writers let go ahead of them
        (see ``WriterTurns``).

        A nested call joins the outer transaction; an exception anywhere rolls back the whole
        outermost transaction, so a refused call leaves the database exactly as it was.
        """
        if getattr(self._local, "depth", 0):
            return _Join(self._local)
        return self._outermost(write, first)

    #: The turns of this process's writers (None: its writers do not take turns), and how long
    #: one waits for its turn.
    _writer: WriterTurns | None
    _turn_timeout_s: float
    #: Each query's ``tables_named``.
    _tables: dict[str, frozenset[str]]

    @contextmanager
    def _outermost(self, write: bool, first: bool) -> Iterator[None]:
        """A writer waits for its turn (see ``WriterTurns``; where the backend has turns), then
        the backend's transaction."""
        turns = self._writer if write else None
        if turns is not None and not turns.acquire(self._turn_timeout_s, first=first):
            raise StoreBusy(
                "The database stayed locked by another writer of this process past the lock timeout; "
                "retry the call"
            )
        try:
            with self._transaction(write):
                yield
                self.flush_deferred()
        finally:
            if turns is not None:
                turns.release()

    def _transaction(self, write: bool) -> AbstractContextManager[None]:
        raise NotImplementedError

    @property
    def in_transaction(self) -> bool:
        return bool(getattr(self._local, "depth", 0))

    @property
    def memo(self) -> dict[Any, Any]:
        """A dict that lives as long as the thread's open transaction (what it already wrote);
        callables listed under ``"on_commit"`` run once the transaction has committed."""
        if not getattr(self._local, "depth", 0):
            return {}
        memo: dict[Any, Any] = self._local.memo
        return memo

    def defer(self, key: str, tables: frozenset[str], flush: Callable[[], None]) -> None:
        """Hold writes of the open write transaction back: ``flush`` sends what gathered under
        ``key`` before the transaction's next statement that names one of ``tables`` (or deletes
        rows), or before its commit, whichever comes first. Nothing else reads those tables in
        between, so the transaction sees what it would have seen, with fewer statements: several
        writes to one row become one, several inserts one ``run_many``. A key held back already
        keeps its place."""
        memo = self._local.memo
        deferred = memo.setdefault("deferred", {})
        if key not in deferred:
            deferred[key] = flush
            memo["deferred_tables"] = memo.get("deferred_tables", frozenset()) | tables

    def flush_deferred(self, names: Sequence[str] = ()) -> None:
        """Send the writes held back (``defer``): all of them, or, given query names, all of them
        if one of those queries names a table they wait on."""
        memo = self._local.memo
        deferred = memo.get("deferred")
        if not deferred:
            return
        if names:
            waiting = memo["deferred_tables"]
            for name in names:
                named = self._tables[name]
                if EVERY_TABLE in named or not named.isdisjoint(waiting):
                    break
            else:
                return
        # What the flushes send goes out at once, not held back again.
        del memo["deferred"], memo["deferred_tables"]
        for flush in deferred.values():
            flush()

    @property
    def writes(self) -> int:
        """How many statements that write rows the thread's open transaction has run or queued:
        while the count stays the same, a row the transaction read while it held that row (the
        database on SQLite, a row lock on PostgreSQL) is what it would read again."""
        return int(self._local.writes) if getattr(self._local, "depth", 0) else 0


class Checkpointer:
    """Copies the write-ahead log back into the database file (a checkpoint) from a thread of its
    own, so that no write waits for it. SQLite's automatic checkpoint runs inside the commit that
    takes the log past its threshold: every hundred or so commits one of them stalls for
    milliseconds, longer in a larger file. Here every ``CHECKPOINT_COMMITS``-th write commit of the
    process wakes the thread (started by the first), which runs a PASSIVE checkpoint: it waits for
    no reader or writer and copies what it can. A checkpoint that fails (the disk full, another
    process checkpointing) is left to the next one."""

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._due = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False
        #: Write commits counted, and checkpoints the thread ran.
        self.commits = 0
        self.checkpoints = 0

    def committed(self) -> None:
        """Count one write commit; every ``CHECKPOINT_COMMITS``-th wakes the thread."""
        with self._lock:
            self.commits += 1
            if self._stopped or self.commits % CHECKPOINT_COMMITS:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tether-checkpoint", daemon=True)
                self._thread.start()
        self._due.set()

    def _run(self) -> None:
        connection: sqlite3.Connection | None = None
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._stopped:
                    return
                try:
                    connection = connection or self._connect()
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                except (sqlite3.Error, TetherError) as error:
                    log.debug("checkpoint of the write-ahead log failed (the next one retries): %s", error)
        finally:
            if connection is not None:
                connection.close()

    def stop(self) -> None:
        """End the thread (after the checkpoint it is running, if any)."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._due.set()
        if thread is not None:
            thread.join()


class SqliteDatabase(ThreadTransactions):
    """A SQLite file shared by threads and processes; every public call is one transaction."""

    backend = "sqlite"

    def __init__(self, path: Path, *, synchronous: str = "FULL", busy_timeout_ms: int = 5000) -> None:
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout_ms = busy_timeout_ms
        #: Each query's statements (a body may hold several, separated by ``;``: they run in
        #: order and the last one gives the result).
        bodies = load_queries("sqlite")
        self.queries = {name: sql_statements(body) for name, body in bodies.items()}
        self._tables = {name: tables_named(body) for name, body in bodies.items()}
        #: The queries that write rows (counted in ``writes``).
        self._writers = frozenset(
            name for name, statements in self.queries.items() if writes_rows(statements)
        )
        self._local = threading.local()
        self._closed = False
        #: Idle connections, most recently used last. A connection serves one thread at a time, for
        #: one outermost transaction or one statement, and outlives the thread: its prepared
        #: statements stay cached for the next thread.
        self._idle: list[sqlite3.Connection] = []
        self._idle_lock = threading.Lock()
        #: This process's writers take turns here before ``BEGIN IMMEDIATE``: a thread waiting for
        #: another thread's write wakes as soon as it commits, instead of in SQLite's busy-handler
        #: sleeps (which grow to 100 ms). Other processes still meet at SQLite's lock.
        self._writer = WriterTurns()
        self._turn_timeout_s = busy_timeout_ms / 1000
        self.checkpointer = Checkpointer(self._open)

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    def now_ms(self) -> int:
        """The clock that judges lease instants when a caller passes no ``now``: the wall clock,
        read once per transaction, so every call joined to one transaction judges one instant
        (a lease cannot lapse between two calls of the same step)."""
        if getattr(self._local, "depth", 0):
            instant: int = self._local.instant
            return instant
        return now_ms()

    def settle_journal(self) -> None:
        """Nothing to wait for: every committed journal entry is readable at once."""

    # -- change notices ----------------------------------------------------------------------
    def notify(self, channel: str) -> None:
        """Nothing to send: the SQLite watcher sees every commit through ``PRAGMA data_version``."""

    def watcher(self) -> Watcher:
        return SqliteWatcher(self.path)

    # -- connections -------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        try:
            connection = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self.busy_timeout_ms / 1000,
                cached_statements=IDLE_STATEMENTS,
            )
            connection.row_factory = sqlite3.Row
            connection.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute(f"PRAGMA synchronous = {self.synchronous}")
            connection.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES}")
            connection.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as error:
            raise translate_error(error) from error
        return connection

    def _take(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError("The store is closed; open it again with tether.open_store")
        with self._idle_lock:
            if self._idle:
                return self._idle.pop()
        return self._open()

    def _give(self, connection: sqlite3.Connection) -> None:
        with self._idle_lock:
            if not self._closed and len(self._idle) < IDLE_CONNECTIONS and not connection.in_transaction:
                self._idle.append(connection)
                return
        connection.close()

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """The thread's transaction connection, or one taken from the idle ones for the block."""
        if getattr(self._local, "depth", 0):
            yield self._local.connection
            return
        connection = self._take()
        try:
            yield connection
        finally:
            self._give(connection)

    def close(self) -> None:
        """Close the idle connections (and the checkpointer's); one in use closes when its
        transaction or statement ends."""
        self.checkpointer.stop()
        with self._idle_lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    # -- transactions ------------------------------------------------------------------------
    @contextmanager
    def _transaction(self, write: bool) -> Iterator[None]:
        connection = self._take()
        try:
            connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as error:
            self._give(connection)
            raise translate_error(error) from error
        self._local.connection = connection
        self._local.depth = 1
        self._local.instant = now_ms()
        self._local.writing = write
        self._local.memo = {}
        self._local.writes = 0
        if write:
            fault_point("begin")
        try:
            yield
        except BaseException as error:
            self._local.depth, self._local.connection = 0, None
            with suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
            self._give(connection)
            if isinstance(error, sqlite3.Error):
                raise translate_error(error) from error
            raise
        self._local.depth, self._local.connection = 0, None
        if write:
            fault_point("before_commit")
        try:
            connection.execute("COMMIT")
        except sqlite3.Error as error:
            with suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
            raise translate_error(error) from error
        finally:
            self._give(connection)
        if write:
            self.checkpointer.committed()
        for callback in self._local.memo.get("on_commit", ()):
            callback()
        if write:
            fault_point("after_commit")

    # -- statements --------------------------------------------------------------------------
    def _execute(self, name: str, params: Mapping[str, Any], result: Callable[[sqlite3.Cursor], T]) -> T:
        """Run a named query's statements in order on the connection in use (a statement outside
        a transaction borrows one for its own duration): ``result`` of the last one's cursor."""
        local = self._local
        if not getattr(local, "depth", 0):
            connection = self._take()
            try:
                return _translated(self.queries[name], params, result, connection)
            finally:
                self._give(connection)
        if "deferred" in local.memo:
            self.flush_deferred((name,))
        if name in self._writers:
            local.writes += 1
        found = _translated(self.queries[name], params, result, local.connection)
        if local.writing:
            fault_point("statement")
        return found

    def one(self, name: str, /, **params: Any) -> Row | None:
        row: Row | None = self._execute(name, params, sqlite3.Cursor.fetchone)
        return row

    def all(self, name: str, /, **params: Any) -> list[Row]:
        rows: list[Row] = self._execute(name, params, sqlite3.Cursor.fetchall)
        return rows

    def run(self, name: str, /, **params: Any) -> int:
        """Execute a write; the number of rows its last statement changed."""
        return self._execute(name, params, _rowcount)

    def each(self, calls: Sequence[tuple[str, Mapping[str, Any]]], /) -> list[list[Row]]:
        """Run named queries in order in the open transaction: each one's rows. PostgreSQL sends
        them in one round trip."""
        if not getattr(self._local, "depth", 0):
            raise TetherError("several queries in one round trip need an open transaction")
        return [self.all(name, **params) for name, params in calls]

    def queue(self, name: str, /, **params: Any) -> None:
        """A write whose outcome the caller does not need (run at once here; PostgreSQL sends it
        with the transaction's next statement)."""
        self._require_writing(name)
        self.run(name, **params)

    def expect(self, name: str, failure: str, /, **params: Any) -> None:
        """A write the caller knows changes exactly one row, in the open write transaction
        (PostgreSQL sends it with the transaction's next statement). If it changes any other
        number of rows, the transaction fails: ``InconsistentState`` with ``failure`` (raised
        here at once, after the write ran: the caller lets it end the transaction, which rolls
        the write back)."""
        self._require_writing(name)
        if self.run(name, **params) != 1:
            raise InconsistentState(failure)

    def _require_writing(self, name: str) -> None:
        if not getattr(self._local, "depth", 0) or not self._local.writing:
            raise TetherError(f"{name}: a queued write needs an open write transaction")

    def run_many(self, name: str, rows: Sequence[Mapping[str, Any]], /) -> None:
        """Execute one write once per parameter set (one prepared statement; a query of one), in
        the open write transaction."""
        self._require_writing(name)
        self.flush_deferred((name,))
        self._local.writes += 1
        _translated(self.queries[name], rows, _rowcount, self._local.connection, many=True)
        fault_point("statement")

    # -- schema ------------------------------------------------------------------------------
    def schema_version(self) -> tuple[int, int]:
        """The schema version of the database (0 when it has none) and the latest this code knows."""
        latest = migrations(self.backend)[-1][0]
        with self._connection() as connection:
            try:
                found = connection.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
                ).fetchone()
                if found is None:
                    return 0, latest
                row = connection.execute("SELECT COALESCE(max(version), 0) FROM schema_migrations").fetchone()
            except sqlite3.Error as error:
                raise translate_error(error) from error
        return int(row[0]), latest

    def migrate(self) -> int:
        """Apply pending migrations; refuse a schema newer than this code. The version in force."""
        with self._connection() as connection:
            return self._migrate(connection)

    def _migrate(self, connection: sqlite3.Connection) -> int:
        known = migrations(self.backend)
        latest = known[-1][0]
        try:
            # A current schema needs no write lock: opening a store must not queue behind writers
            # (a busy database would refuse every new process after the busy timeout).
            found = connection.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
            ).fetchone()
            current_sql = "SELECT COALESCE(max(version), 0) FROM schema_migrations"
            if found is not None and connection.execute(current_sql).fetchone()[0] == latest:
                return latest
        except sqlite3.Error as error:
            raise translate_error(error) from error
        # Foreign keys are off while migrations run (a table rebuild drops a parent table without
        # cascading into its children) and checked before they commit; the pragma is a no-op
        # inside a transaction, so it is set around it.
        try:
            connection.execute("PRAGMA foreign_keys = OFF")
            connection.execute("BEGIN IMMEDIATE")
            connection.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                "version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL) STRICT"
            )
            current = connection.execute(
                "SELECT COALESCE(max(version), 0) FROM schema_migrations"
            ).fetchone()[0]
            if current > latest:
                connection.execute("ROLLBACK")
                raise SchemaTooNew(
                    f"The database {self.path} has schema version {current}, newer than this "
                    f"Tether's {latest}; upgrade Tether to open it"
                )
            for version, sql in known:
                if version > current:
                    for statement in sql_statements(sql):
                        connection.execute(statement)
                    connection.execute(
                        "INSERT INTO schema_migrations(version, applied_at) VALUES (?, ?)",
                        (version, now_ms()),
                    )
            broken = connection.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                connection.execute("ROLLBACK")
                raise StoreError(
                    f"Migrating {self.path} would break {len(broken)} foreign keys (first: table "
                    f"{broken[0][0]}, row {broken[0][1]}); nothing was changed"
                )
            connection.execute("COMMIT")
        except sqlite3.Error as error:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise translate_error(error) from error
        finally:
            connection.execute("PRAGMA foreign_keys = ON")
        return latest
