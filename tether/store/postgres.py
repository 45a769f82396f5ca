"""The PostgreSQL connection layer: the same interface as ``SqliteDatabase`` over psycopg 3.

Installed with the ``tether[postgres]`` extra; the embedded SQLite default needs nothing beyond the
standard library, so this module imports psycopg only when a PostgreSQL store is opened.

- Connections come from a ``psycopg_pool.ConnectionPool``. A thread holds one for its outermost
  transaction and returns it at the end; nested ``transaction()`` calls join it, and an exception
  anywhere rolls back the whole outermost transaction. A statement outside any transaction runs on
  its own pooled connection in autocommit.
- A connection that saw a driver error is closed, never handed out again (the pool opens a fresh
  one). A pooled connection whose server session ended (a restart, ``pg_terminate_backend``) is
  found out by the first statement of the next transaction (its BEGIN) and replaced without the
  caller seeing it; a session lost mid-transaction raises ``StoreUnavailable`` (nothing was
  written; retry).
- Write transactions run READ COMMITTED and lock the rows they act on: the run-level operations
  lock the run's lease row before reading the run, claim_next skips runs another transaction holds
  (``FOR UPDATE SKIP LOCKED``). Journal writers share no lock: entries are numbered by the
  writing transaction and readers read below the oldest transaction in flight (see
  sql/postgres/journal.sql), so transactions on different runs commit in parallel. Once a
  transaction has written the journal (its journal point) its further row locks do not wait
  (``NOWAIT``: StoreBusy if taken). A row lock the transaction took already (a run's, a
  viewer row's) is not sent again. Read transactions run READ ONLY on one REPEATABLE READ
  snapshot and lock nothing.
- The database clock judges lease instants: read with a write transaction's BEGIN (in its round
  trip), and again after any statement that may have waited for a lock (every one before the
  journal point): last in the round trip that reaches the journal point.
- The write transactions of one process do not take turns (SQLite's do, ``WriterTurns``): each
  has a pooled connection of its own (at most ``pool_max``; a wait for one ends after
  ``pool_timeout_ms``, and a database that cannot be reached is ``StoreUnavailable`` at once).
- A journal read first waits for what committed before it to be readable (``settle_journal``).
- Every session sets ``lock_timeout`` (a wait past it raises ``StoreBusy``, as SQLite's busy
  timeout does), ``idle_in_transaction_session_timeout`` (the server ends a transaction left open
  by a stuck client and frees its locks) and TCP keepalives (a dead peer is noticed).
- A commit whose connection breaks raises ``CommitUnknown``: the write may have landed. The store
  resolves it by reading the state back (the reservation by run id, the claim by its token), never
  by repeating the write.
- Change notices (``notify``) go out as ``NOTIFY`` in the commit's round trip; ``watcher`` opens
  a dedicated ``LISTEN`` connection (see ``notices``).
- Round trips go through libpq itself (``pgwire.Wire``), in pipeline mode from a transaction's
  BEGIN to its COMMIT: a query's statements go out pipelined, in one round trip. A write whose
  outcome the caller does not need (``queue``, ``run_many``) is not sent on its own: it goes out
  pipelined ahead of the transaction's next statement, or with the commit, in that round trip (the server
  runs them in order and stops at the first error, which fails that statement and so the
  transaction). A status write whose caller knows it changes exactly one row (``expect``: the
  run's row it holds proves the move legal) is queued the same way, wrapped in a server-side
  check that fails the transaction if it changed any other number of rows. ``each`` sends several
  queries whose outcomes are all needed in one round trip.

Query bodies use ``:name`` parameters like the SQLite dialect. A ``/*write: ...*/`` comment in a
body is part of the query only inside a write transaction; a body may hold several statements
separated by ``;`` and the last one gives the result. ``/*journal*/`` marks a query that reaches
the journal point; ``@nowait`` becomes ``NOWAIT`` in a transaction past it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

from tether.errors import (
    CommitUnknown,
    Conflict,
    InconsistentState,
    InvalidInput,
    SchemaTooNew,
    SessionBusy,
    StoreBusy,
    StoreError,
    StoreUnavailable,
    TetherError,
)
from tether.store.db import (
    BLOB_CONFLICT,
    Row,
    ThreadTransactions,
    load_queries,
    migrations,
    sql_statements,
    tables_named,
    writes_rows,
)
from tether.store.faults import fault_point
from tether.store.notices import PostgresWatcher, Watcher, channel_name
from tether.store.pgwire import Statement, Wire

if TYPE_CHECKING:
    import psycopg
    from psycopg.pq.abc import PGresult
    from psycopg_pool import ConnectionPool

    Connection = psycopg.Connection[dict[str, Any]]

T = TypeVar("T")

# The pool reports each connection it discards (Tether discards every connection that saw an
# error) at WARNING; without this, a program that configures no logging would print each one.
logging.getLogger("psycopg").addHandler(logging.NullHandler())

_WRITE_ONLY = re.compile(r"/\*write:(.*?)\*/", re.DOTALL)
#: The row locks a query may start with, on the run named by ``:run_id``: its lease row (the run
#: lock) and its viewer row.
_ROW_LOCKS = {
    "run": re.compile(
        r"SELECT 1 FROM leases l JOIN runs r ON r.resource_id = l.resource_id "
        r"WHERE r.run_id = :run_id\s+FOR UPDATE OF l"
    ),
    "viewer": re.compile(r"SELECT 1 FROM viewer_runs WHERE run_id = :run_id\s+FOR NO KEY UPDATE"),
}
#: SQLSTATEs that mean "another transaction is in the way; retry": lock_not_available (lock_timeout),
#: deadlock_detected, serialization_failure.
_BUSY_STATES = {"55P03", "40P01", "40001"}
_SESSION_INDEX = "run_queue_one_active_per_session"
#: How a statement that ``expect`` can wrap starts (one write, perhaps after a marker comment).
_WRITE_START = re.compile(r"^(/\*\w+\*/\s*)?(UPDATE|INSERT|DELETE)\b", re.IGNORECASE)
#: The SQLSTATE of a write sent with ``expect`` that did not change exactly one row.
_EXPECTATION_FAILED = "TT001"
#: The driver cannot bind the caller's value (a lone surrogate, an integer past 64 bits).
_UNBINDABLE = (UnicodeEncodeError, OverflowError)
#: libpq's PGRES_TUPLES_OK: the statement returned rows (possibly none).
_TUPLES_OK = 2
_NOW_SQL = "SELECT CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS BIGINT) AS now"
_BEGIN_WRITE = Statement("BEGIN ISOLATION LEVEL READ COMMITTED")
_BEGIN_READ = Statement("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
_NOW = Statement(_NOW_SQL)
_COMMIT = Statement("COMMIT")
#: The oldest transaction id still in flight on the server (journal entries of transactions below
#: it are final and readable; see sql/postgres/journal.sql) and the id of the transaction that
#: wrote the newest committed entry, in one snapshot.
_HORIZON = Statement(
    "SELECT CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS TEXT) AS BIGINT) AS xmin, "
    "COALESCE((SELECT max(event_seq) FROM events), 0) >> 20 AS newest"
)
#: How long a checkout waits for the pool before it looks at why (see ``_checkout``).
_POOL_SLICE_S = 0.25
#: How often ``settle_journal`` looks at the horizon again, at most.
_SETTLE_POLL_S = 0.02
_ROLLBACK = Statement("ROLLBACK")
_FAILED = "An earlier statement of this transaction failed, so none of it is written; retry the transaction"
_MIGRATIONS_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)"
)


def _prepare(body: str) -> tuple[Statement, ...]:
    """The body's statements (see ``sql_statements``)."""
    return tuple(Statement(statement) for statement in sql_statements(body))


def _expecting_one(statements: tuple[Statement, ...]) -> tuple[Statement, ...]:
    """A write's statements with the last one wrapped in the server's check that it changed
    exactly one row (``tether_expect_one``, migration 0006: SQLSTATE ``TT001`` otherwise)."""
    *leading, last = statements
    if "RETURNING" in last.sql.upper() or "--" in last.sql or not _WRITE_START.match(last.sql):
        return ()  # its rows are the point, or it is not one write that can be wrapped
    check = "SELECT tether_expect_one(count(*), :_failure) FROM changed"
    return (*leading, Statement(f"WITH changed AS ({last.sql} RETURNING 1) {check}"))


#: ``NOTIFY`` statements by channel.
_notifies: dict[str, Statement] = {}


def _notify(channel: str) -> Statement:
    """The statement that sends a change notice on ``channel``."""
    statement = _notifies.get(channel)
    if statement is None:
        statement = _notifies[channel] = Statement(f"NOTIFY {channel_name(channel)}")
    return statement


def _outcome(wire: Wire, result: PGresult) -> tuple[list[Row] | None, int]:
    """A statement's rows (None unless it returns rows: a SELECT, a write with RETURNING) and the
    number of rows it changed."""
    rows = wire.rows(result) if result.status == _TUPLES_OK else None
    count = result.command_tuples
    return rows, -1 if count is None else count


class Query:
    """One named query, prepared for read transactions, for write transactions, and for write
    transactions past their journal point (``@nowait`` becomes ``NOWAIT``)."""

    def __init__(self, body: str) -> None:
        write = _WRITE_ONLY.sub(lambda m: m.group(1), body)
        self.read = _prepare(_WRITE_ONLY.sub("", body))
        self.write = _prepare(write.replace("@nowait", ""))
        self.write_journal = _prepare(write.replace("@nowait", "NOWAIT"))
        self.takes_journal = "/*journal*/" in body
        self.is_write = writes_rows([statement.sql for statement in self.write])
        #: The write variants checked by the server to change exactly one row (see ``expect``).
        self.write_expecting = _expecting_one(self.write) if self.is_write else ()
        self.write_journal_expecting = _expecting_one(self.write_journal) if self.is_write else ()
        #: The row lock the write variants start with (see ``_ROW_LOCKS``), if any: a transaction
        #: that holds that lock already leaves the statement out.
        self.row_lock = next(
            (
                kind
                for kind, pattern in _ROW_LOCKS.items()
                if len(self.write) == len(self.read) + 1 and pattern.match(self.write[0].sql)
            ),
            None,
        )


def translate_error(error: Exception) -> TetherError:
    """A driver or pool error as Tether's own exception type (the original stays as ``__cause__``)."""
    import psycopg
    from psycopg_pool import PoolTimeout

    if isinstance(error, PoolTimeout):
        return StoreBusy(
            f"No database connection became free within pool_timeout_ms; retry the call ({error})"
        )
    text = str(error).strip()
    if isinstance(error, psycopg.Error):
        state = error.sqlstate or ""
        if _connection_lost(error):
            return StoreUnavailable(f"The connection to the database was lost; retry the call ({text})")
        if state == _EXPECTATION_FAILED:
            return InconsistentState(error.diag.message_primary or text)
        if state in _BUSY_STATES:
            return StoreBusy(f"The database is locked by another writer; retry the call ({text})")
        if isinstance(error, psycopg.errors.CheckViolation) and error.diag.constraint_name == "blobs_check":
            return Conflict(BLOB_CONFLICT)  # blob_put met different bytes under the hash
        if isinstance(error, psycopg.errors.UniqueViolation):
            if error.diag.constraint_name == _SESSION_INDEX:
                return SessionBusy("The origin session already has an active interactive run")
            # The guards read before writing; under READ COMMITTED a concurrent transaction can
            # still commit the same key in between (two reservations of one run id, for example).
            return Conflict(f"A concurrent call stored the same record first; retry the call ({text})")
        if isinstance(error, psycopg.DataError):
            # A value the database cannot hold (a NUL character in text, a number out of range).
            return InvalidInput(f"A value passed to Tether cannot be stored: {text}")
    return StoreError(f"The database refused the operation: {text}")


def _connection_lost(error: Exception) -> bool:
    """Whether a driver error means the session is gone: a connection failure (SQLSTATE class 08,
    or none at all from the client side) or the server ending the session (57P01 to 57P03)."""
    import psycopg

    if not isinstance(error, psycopg.OperationalError):
        return False
    state = error.sqlstate or ""
    return not state or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def masked(url: str) -> str:
    """The URL with its password, if any, replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = quote(parts.username or "", safe="")
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class PostgresDatabase(ThreadTransactions):
    """A PostgreSQL database shared by threads and processes; every public call is one transaction."""

    backend = "postgres"

    def __init__(
        self,
        conninfo: str,
        *,
        lock_timeout_ms: int = 5000,
        idle_in_transaction_timeout_ms: int = 60_000,
        pool_min: int = 1,
        pool_max: int = 10,
        pool_timeout_ms: int = 5000,
        connect_timeout_s: int = 10,
        keepalives_idle_s: int = 30,
    ) -> None:
        try:
            import psycopg
            from psycopg.rows import dict_row
            from psycopg_pool import ConnectionPool
        except ImportError as error:
            raise InvalidInput(
                "PostgreSQL stores need psycopg 3 and psycopg-pool: pip install 'tether[postgres]'"
            ) from error
        if not psycopg.Pipeline.is_supported():
            raise InvalidInput(
                "PostgreSQL stores need libpq 14 or newer (Tether pipelines its statements); "
                "psycopg[binary], as pip install 'tether[postgres]' installs it, bundles one"
            )
        self.conninfo = conninfo
        self._url = masked(conninfo)
        bodies = load_queries("postgres")
        self.queries = {name: Query(body) for name, body in bodies.items()}
        blob_put = self.queries["blob_put"]
        #: The statements of a blob insert (see ``_blobs_first``).
        self._blob_puts = frozenset(id(statement) for statement in (*blob_put.write, *blob_put.write_journal))
        self._tables = {name: tables_named(body) for name, body in bodies.items()}
        self._local = threading.local()
        self._wires: weakref.WeakKeyDictionary[Connection, Wire] = weakref.WeakKeyDictionary()
        # Writers do not take turns: transactions on different runs commit in parallel (their
        # only meeting points are the rows they share; see sql/postgres/journal.sql).
        self._writer = None
        self._turn_timeout_s = lock_timeout_ms / 1000
        self._closed = False
        given = psycopg.conninfo.conninfo_to_dict(conninfo)
        options = " ".join(
            part
            for part in (
                str(given.get("options") or ""),
                f"-c lock_timeout={int(lock_timeout_ms)}",
                f"-c idle_in_transaction_session_timeout={int(idle_in_transaction_timeout_ms)}",
            )
            if part
        )
        settings: dict[str, Any] = {
            "autocommit": True,
            "row_factory": dict_row,
            "options": options,
            "connect_timeout": given.get("connect_timeout", connect_timeout_s),
            "keepalives": given.get("keepalives", 1),
            "keepalives_idle": given.get("keepalives_idle", keepalives_idle_s),
            "keepalives_interval": given.get("keepalives_interval", 10),
            "keepalives_count": given.get("keepalives_count", 3),
            "application_name": given.get("application_name", "tether"),
        }
        self._settings = settings
        self._pool_size = max(pool_min, pool_max)
        self._pool_timeout_s = pool_timeout_ms / 1000
        #: Connections checked out now (pooled or not), and the ones opened outside the pool
        #: while it could not open them itself (see ``_checkout``).
        self._in_use = 0
        self._unpooled: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._use_lock = threading.Lock()
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            conninfo,
            kwargs=settings,
            min_size=pool_min,
            max_size=max(pool_min, pool_max),
            timeout=self._pool_timeout_s,
            num_workers=2,
            name="tether",
            open=False,
        )
        try:
            # One direct connection first: a wrong host, database or password fails at once with
            # the server's own words instead of after the pool's retries.
            psycopg.connect(conninfo, **settings).close()
            self._pool.open(wait=True, timeout=float(connect_timeout_s))
        except Exception as error:
            with suppress(Exception):
                self._pool.close(timeout=0)
            # A server that cannot be reached (not a refusal in its own words) may come back.
            unreachable = isinstance(error, psycopg.Error) and _connection_lost(error)
            kind = StoreUnavailable if unreachable else StoreError
            raise kind(f"Cannot connect to the PostgreSQL store {self._url}: {error}") from error

    @property
    def url(self) -> str:
        """The store URL (its password masked)."""
        return self._url

    def close(self) -> None:
        """Close the pool: idle connections now, connections in use when they come back."""
        self._closed = True
        self._pool.close()

    # -- connections -------------------------------------------------------------------------
    def _checkout(self) -> Connection:
        """A connection for one transaction or statement, waiting at most ``pool_timeout_ms``.

        A pool that has no idle connection and fewer in use than its size is opening one; when
        that takes a while (the pool retries a failed connect with growing pauses, of seconds
        after an outage) the server is asked directly: unreachable, the call fails at once with
        ``StoreUnavailable``; reachable, the call goes on over that direct connection (closed
        after use), so calls recover as soon as the database is back. All connections in use:
        ``StoreBusy`` once the wait is over."""
        from psycopg_pool import PoolTimeout

        if self._closed:
            raise StoreError("The store is closed; open it again with tether.open_store")
        deadline = time.monotonic() + self._pool_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                connection = self._pool.getconn(timeout=max(0.001, min(remaining, _POOL_SLICE_S)))
            except PoolTimeout:
                direct = self._direct()
                if direct is not None:
                    return direct
                if time.monotonic() >= deadline:
                    raise StoreBusy(
                        f"No database connection became free within pool_timeout_ms "
                        f"({round(self._pool_timeout_s * 1000)} ms): all {self._pool_size} are in use; "
                        "retry the call"
                    ) from None
                continue
            except Exception as error:
                raise translate_error(error) from error
            with self._use_lock:
                self._in_use += 1
            return connection

    def _direct(self) -> Connection | None:
        """A connection opened outside the pool while the pool has a free slot it cannot fill
        (None when every slot is in use). Raises ``StoreUnavailable`` when the server cannot be
        reached."""
        import psycopg

        with self._use_lock:
            if self._in_use >= self._pool_size:
                return None
            self._in_use += 1
        try:
            connection: Connection = psycopg.connect(self.conninfo, **self._settings)
        except psycopg.Error as error:
            with self._use_lock:
                self._in_use -= 1
            if _connection_lost(error):
                raise StoreUnavailable(
                    f"The database {self._url} cannot be reached; retry the call ({str(error).strip()})"
                ) from error
            raise translate_error(error) from error
        self._unpooled.add(connection)
        return connection

    def _return(self, connection: Connection, *, broken: bool) -> None:
        """Hand a connection back; one that saw an error is closed first (the pool replaces it),
        and one opened outside the pool is closed."""
        with self._use_lock:
            self._in_use -= 1
        if connection in self._unpooled:
            self._unpooled.discard(connection)
            with suppress(Exception):
                connection.close()
            return
        if broken:
            with suppress(Exception):
                connection.close()
        with suppress(Exception):
            self._pool.putconn(connection)

    def _fresh(self, first: Callable[[Connection], T]) -> tuple[Connection, T]:
        """A pooled connection and the result of ``first`` (a BEGIN, or a read) run on it. A pooled
        connection whose session ended (a server restart, ``pg_terminate_backend``, the idle
        timeout) is found out by that first statement, discarded and replaced; nothing had been
        done on it, so trying the next one is safe."""
        import psycopg

        for attempt in range(self._pool_size + 1):
            connection = self._checkout()
            try:
                return connection, first(connection)
            except psycopg.Error as error:
                self._return(connection, broken=True)
                if not _connection_lost(error) or attempt == self._pool_size:
                    raise translate_error(error) from error
            except _UNBINDABLE as error:
                self._return(connection, broken=True)
                raise InvalidInput(f"A value passed to Tether cannot be used: {error}") from error
        raise AssertionError("unreachable")

    # -- transactions ------------------------------------------------------------------------
    @contextmanager
    def _transaction(self, write: bool) -> Iterator[None]:
        import psycopg

        local = self._local
        connection, (instant, wire) = self._fresh(lambda c: self._begin(c, write))
        local.connection, local.depth, local.writing, local.failed = connection, 1, write, False
        local.wire = wire
        local.journal = False
        local.locked = set()
        local.instant = instant
        local.notices = set()
        local.memo = {}
        local.writes = 0
        local.queued = []
        if write:
            fault_point("begin")
        try:
            yield
        except BaseException as error:
            failed = local.failed or isinstance(error, psycopg.Error)
            local.connection, local.depth, local.wire = None, 0, None
            if not failed:
                try:
                    self._pipeline(wire, (), [((_ROLLBACK,), {})])
                    wire.leave()
                except psycopg.Error:
                    failed = True
            self._return(connection, broken=failed)
            if isinstance(error, psycopg.Error):
                raise translate_error(error) from error
            raise
        local.connection, local.depth, local.wire = None, 0, None
        if local.failed:
            # A statement failed and the caller went on: nothing of the transaction is committed.
            self._return(connection, broken=True)
            raise StoreError(_FAILED)
        if write:
            fault_point("before_commit")
        # The queued writes and the change notices go out with the commit, in the same round trip.
        notices = [_notify(channel) for channel in sorted(local.notices)]
        queued, local.queued = self._blobs_first(local.queued), []
        try:
            self._pipeline(wire, queued, [((*notices, _COMMIT), {})])
            wire.leave()
        except psycopg.Error as error:
            # A server's answer (an error with its SQLSTATE: a queued write refused, a lock
            # timeout) means the transaction rolled back; only a lost connection leaves the
            # outcome open.
            lost = connection.broken or _connection_lost(error)
            self._return(connection, broken=True)
            if lost:
                raise CommitUnknown(
                    f"The connection to {self._url} broke while committing, so the write may or "
                    f"may not have landed: {error}"
                ) from error
            raise translate_error(error) from error
        except _UNBINDABLE as error:
            # A queued value the driver cannot send: the COMMIT after it was never sent.
            self._return(connection, broken=True)
            raise InvalidInput(f"A value passed to Tether cannot be used: {error}") from error
        self._return(connection, broken=False)
        for callback in local.memo.get("on_commit", ()):
            callback()
        if write:
            fault_point("after_commit")

    def _begin(self, connection: Connection, write: bool) -> tuple[int | None, Wire]:
        """BEGIN, with the connection in pipeline mode to the transaction's end. A write
        transaction reads the database clock with it, in the same round trip (nearly every write
        call judges by it; see ``now_ms``): its instant."""
        wire = self._wire(connection)
        wire.enter()
        if not write:
            self._pipeline(wire, (), [((_BEGIN_READ,), {})])
            return None, wire
        ((rows, _),) = self._pipeline(wire, (), [((_BEGIN_WRITE, _NOW), {})])
        assert rows
        return int(rows[0]["now"]), wire

    def _wire(self, connection: Connection) -> Wire:
        """The connection's ``Wire`` (its prepared statements live as long as it does)."""
        wire = self._wires.get(connection)
        if wire is None:
            wire = self._wires[connection] = Wire(connection)
        return wire

    def _autocommit(
        self, connection: Connection, groups: Sequence[tuple[tuple[Statement, ...], Mapping[str, Any]]]
    ) -> list[tuple[list[Row] | None, int]]:
        """Statements outside any transaction, in a pipeline of their own: the server runs what
        comes before one Sync as one implicit transaction."""
        wire = self._wire(connection)
        wire.enter()
        outcomes = self._pipeline(wire, (), groups)
        wire.leave()
        return outcomes

    def settle_journal(self) -> None:
        """Wait until every journal entry committed before this call is readable: until every
        transaction on the server older than the one that wrote the newest committed entry has
        ended (readers take only entries below that horizon; see sql/postgres/journal.sql). So
        a journal read sees what committed before it, this process's own writes included. The
        wait ends after the lock timeout at the latest (a transaction held open elsewhere): the
        reader then gets what is final, and the rest later, never out of order. Outside a
        transaction only (a read transaction's snapshot is fixed at its first statement)."""
        if self.in_transaction:
            return
        deadline = time.monotonic() + self._turn_timeout_s
        pause = 0.001
        target: int | None = None
        while True:
            connection, ((rows, _),) = self._fresh(lambda c: self._autocommit(c, [((_HORIZON,), {})]))
            self._return(connection, broken=False)
            assert rows
            if target is None:
                target = int(rows[0]["newest"])
            if int(rows[0]["xmin"]) > target or time.monotonic() >= deadline:
                return
            time.sleep(pause)
            pause = min(pause * 2, _SETTLE_POLL_S)

    # -- change notices ----------------------------------------------------------------------
    def notify(self, channel: str) -> None:
        """Send a change notice on ``channel`` when the open write transaction commits."""
        if getattr(self._local, "depth", 0):
            self._local.notices.add(channel)

    def watcher(self) -> Watcher:
        return PostgresWatcher(self.conninfo, self._settings)

    # -- statements --------------------------------------------------------------------------
    def _execute(self, name: str, params: Mapping[str, Any]) -> tuple[list[Row] | None, int]:
        """Run a named query: the rows of its last statement (None if it returns none) and the
        number of rows that statement changed."""
        local = self._local
        if not getattr(local, "depth", 0):
            # Outside a transaction: one autocommit read on a connection of its own.
            statements = self.queries[name].read
            if not all(query.sql.lstrip().upper().startswith(("SELECT", "WITH")) for query in statements):
                raise TetherError(f"{name}: a write must run inside a transaction")
            connection, (result,) = self._fresh(lambda c: self._autocommit(c, [(statements, params)]))
            self._return(connection, broken=False)
            return result
        return self._execute_each([(name, params)])[0]

    def _execute_each(
        self, calls: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[tuple[list[Row] | None, int]]:
        """Run named queries in the thread's transaction, in order and in one round trip (after
        the writes it queued): each one's outcome, as ``_execute`` gives it. A write
        transaction's round trip that reaches its journal point with no instant read since reads
        the database clock last, in the same round trip: from then on no statement waits for a
        row lock (see ``_after_write``), so that instant stays the transaction's."""
        local = self._local
        self._require_intact()
        if "deferred" in local.memo:
            self.flush_deferred([name for name, _ in calls])
        queries = [(self.queries[name], params) for name, params in calls]
        if not local.writing:
            with self._statement_errors():
                return self._send([(query.read, params) for query, params in queries])
        # A query after one that reaches the journal point takes its row locks NOWAIT.
        groups: list[tuple[tuple[Statement, ...], Mapping[str, Any]]] = []
        journal = local.journal
        for query, params in queries:
            groups.append((self._write_statements(query, params, journal), params))
            journal = journal or query.takes_journal
        clock = journal and (local.instant is None or not local.journal)
        if clock:
            groups.append(((_NOW,), {}))
        with self._statement_errors():
            outcomes = self._send(groups)
        for query, _ in queries:
            self._after_write(query)
        if clock:
            rows, _ = outcomes.pop()
            assert rows
            local.instant = int(rows[0]["now"])
        return outcomes

    def _write_statements(
        self, query: Query, params: Mapping[str, Any], journal: bool, *, expecting: bool = False
    ) -> tuple[Statement, ...]:
        """A query's statements in the thread's write transaction: NOWAIT row locks once it is
        past its journal point (``journal``: whether it is when the query runs), and without
        the row lock it starts with when the transaction took that lock already (it holds it to
        its end, and every writer of the row takes it first, so the rest sees what it would see
        after it). The lock counts as taken from here. ``expecting``: the variant checked to
        change exactly one row (see ``expect``)."""
        local = self._local
        if expecting:
            statements = query.write_journal_expecting if journal else query.write_expecting
        else:
            statements = query.write_journal if journal else query.write
        if query.row_lock:
            lock = (query.row_lock, params["run_id"])
            if lock in local.locked:
                return statements[1:]
            local.locked.add(lock)
        return statements

    def _after_write(self, query: Query) -> None:
        """Note a statement of a write transaction: whether the transaction is past its journal
        point from now on, and whether the transaction's instant must be read again. Any
        statement may have waited for a row lock until the journal point; after it none does
        (its row locks are taken NOWAIT), so the instant read then stays the transaction's."""
        local = self._local
        local.writes += query.is_write
        if not local.journal:
            local.instant = None
            local.journal = query.takes_journal
        fault_point("statement")

    def queue(self, name: str, /, **params: Any) -> None:
        """A write whose outcome the caller does not need, in the open write transaction. Nothing
        waits for it: it is queued and goes out pipelined ahead of the transaction's next
        statement (or its commit), in that statement's round trip; an error in it is raised by
        that later call, and the transaction goes no further (``_require_intact``)."""
        query = self._write_query(name)
        for statement in self._write_statements(query, params, self._local.journal):
            self._local.queued.append((statement, [params]))
        self._after_write(query)

    def expect(self, name: str, failure: str, /, **params: Any) -> None:
        """A write the caller knows changes exactly one row, queued as ``queue`` does: the server
        checks the count (``tether_expect_one``), and any other count fails the statement it goes
        out with, and so the transaction: ``InconsistentState`` with ``failure``, raised by that
        later call or the commit."""
        query = self._write_query(name)
        if not query.write_expecting:
            raise TetherError(f"{name}: only a write that returns no rows can be expected to change one")
        checked = {**params, "_failure": failure}
        for statement in self._write_statements(query, params, self._local.journal, expecting=True):
            self._local.queued.append((statement, [checked]))
        self._after_write(query)

    def run_many(self, name: str, rows: Sequence[Mapping[str, Any]], /) -> None:
        """Execute one single-statement write once per parameter set, queued as ``queue`` does
        (all of them in the round trip of the transaction's next statement)."""
        query = self._write_query(name)
        (statement,) = query.write_journal if self._local.journal else query.write
        self._local.queued.append((statement, list(rows)))
        self._after_write(query)

    def _write_query(self, name: str) -> Query:
        local = self._local
        if not getattr(local, "depth", 0) or not local.writing:
            raise TetherError(f"{name}: a queued write needs an open write transaction")
        self._require_intact()
        self.flush_deferred((name,))
        return self.queries[name]

    def _require_intact(self) -> None:
        """Refuse to go on in a transaction where a statement failed. PostgreSQL refuses every
        statement after a server error anyway; after a value the driver could not send, the
        writes queued with it were dropped, so going on would commit part of the transaction."""
        if self._local.failed:
            raise StoreError(_FAILED)

    @contextmanager
    def _statement_errors(self) -> Iterator[None]:
        """Driver errors inside the thread's transaction as Tether's own; the transaction is marked
        failed, so its connection is discarded when it ends."""
        import psycopg

        try:
            yield
        except psycopg.Error as error:
            self._local.failed = True
            raise translate_error(error) from error
        except _UNBINDABLE as error:
            self._local.failed = True
            raise InvalidInput(f"A value passed to Tether cannot be used: {error}") from error

    def _send(
        self, groups: Sequence[tuple[tuple[Statement, ...], Mapping[str, Any]]]
    ) -> list[tuple[list[Row] | None, int]]:
        """Run queries' statements in the thread's transaction, after the writes it queued
        (``queue``, ``run_many``): all of them in one round trip."""
        local = self._local
        queued, local.queued = self._blobs_first(local.queued), []
        return self._pipeline(local.wire, queued, groups)

    def _blobs_first(
        self, queued: list[tuple[Statement, Sequence[Mapping[str, Any]]]]
    ) -> list[tuple[Statement, Sequence[Mapping[str, Any]]]]:
        """The queued writes with their blob inserts first, in the order of their hashes (the
        same blob twice keeps its order). Nothing queued depends on a blob insert but the rows
        that refer to the blob, which come after it either way; and two transactions inserting
        the same new blobs in one round trip meet them in the same order, so neither waits for
        a blob the other waits for (no deadlock)."""
        blobs = [entry for entry in queued if id(entry[0]) in self._blob_puts]
        if not blobs:
            return queued
        rest = [entry for entry in queued if id(entry[0]) not in self._blob_puts]
        blobs.sort(key=lambda entry: bytes(entry[1][0]["hash"]))
        return blobs + rest

    @staticmethod
    def _pipeline(
        wire: Wire,
        queued: Sequence[tuple[Statement, Sequence[Mapping[str, Any]]]],
        groups: Sequence[tuple[tuple[Statement, ...], Mapping[str, Any]]],
    ) -> list[tuple[list[Row] | None, int]]:
        """Send the queued writes, then each group's statements with its parameters, in one
        round trip: the outcome of each group's last statement. The server runs them in order
        and stops at the first error, which is raised here."""
        calls = [(statement, row) for statement, rows in queued for row in rows]
        ends = []
        for statements, params in groups:
            calls.extend((statement, params) for statement in statements)
            ends.append(len(calls) - 1)
        results = wire.round_trip(calls)
        return [_outcome(wire, results[end]) for end in ends]

    def each(self, calls: Sequence[tuple[str, Mapping[str, Any]]], /) -> list[list[Row]]:
        """Run named queries in order in the open transaction, in one round trip: each one's
        rows."""
        if not getattr(self._local, "depth", 0):
            raise TetherError("several queries in one round trip need an open transaction")
        return [rows or [] for rows, _ in self._execute_each(calls)]

    def one(self, name: str, /, **params: Any) -> Row | None:
        rows, _ = self._execute(name, params)
        return rows[0] if rows else None

    def all(self, name: str, /, **params: Any) -> list[Row]:
        rows, _ = self._execute(name, params)
        return rows or []

    def run(self, name: str, /, **params: Any) -> int:
        """Execute a write; the number of rows it changed."""
        return self._execute(name, params)[1]

    def now_ms(self) -> int:
        """The database clock in epoch milliseconds: it judges lease instants when a caller passes
        no ``now``, so every client of one database agrees on when a lease expires. Inside a
        write transaction, the transaction's instant: read with its BEGIN (``_begin``), and read
        again after any statement that may have waited for a lock (see ``_after_write``), so a
        call never judges by an instant from before an earlier call's lock wait; a read
        transaction reads it once."""
        local = self._local
        if not getattr(local, "depth", 0):
            connection, ((rows, _),) = self._fresh(lambda c: self._autocommit(c, [((_NOW,), {})]))
            self._return(connection, broken=False)
            assert rows
            return int(rows[0]["now"])
        if local.instant is None:
            self._require_intact()
            with self._statement_errors():
                ((rows, _),) = self._send([((_NOW,), {})])
            assert rows
            local.instant = int(rows[0]["now"])
        return int(local.instant)

    # -- schema ------------------------------------------------------------------------------
    def schema_version(self) -> tuple[int, int]:
        """The schema version of the database (0 when it has none) and the latest this code knows."""
        import psycopg

        connection = self._checkout()
        try:
            current = self._current_version(connection)
        except psycopg.Error as error:
            self._return(connection, broken=True)
            raise translate_error(error) from error
        self._return(connection, broken=False)
        return current, migrations(self.backend)[-1][0]

    def migrate(self) -> int:
        """Apply pending migrations; refuse a schema newer than this code. The version in force.

        Migrators serialise on a table lock on ``schema_migrations``; a process that lost the race
        to create that table retries once, and so does one whose session was lost (the
        migrations run in one transaction: the retry reads what stands).
        """
        import psycopg

        known = migrations(self.backend)
        latest = known[-1][0]
        for attempt in (1, 2):
            connection = self._checkout()
            try:
                current = self._current_version(connection)
                if current < latest:
                    with connection.transaction():
                        connection.execute(_MIGRATIONS_TABLE)
                        connection.execute("LOCK TABLE schema_migrations IN SHARE ROW EXCLUSIVE MODE")
                        current = self._current_version(connection)
                        for version, sql in known:
                            if current < version:
                                for statement in sql_statements(sql):
                                    connection.execute(statement)
                                connection.execute(
                                    "INSERT INTO schema_migrations(version, applied_at) "
                                    f"VALUES (%s, ({_NOW_SQL}))",
                                    (version,),
                                )
            except (psycopg.errors.UniqueViolation, psycopg.OperationalError) as error:
                self._return(connection, broken=True)
                if attempt == 1:
                    continue
                raise translate_error(error) from error
            except psycopg.Error as error:
                self._return(connection, broken=True)
                raise translate_error(error) from error
            self._return(connection, broken=False)
            if current > latest:
                raise SchemaTooNew(
                    f"The database {self._url} has schema version {current}, newer than this "
                    f"Tether's {latest}; upgrade Tether to open it"
                )
            return latest
        raise AssertionError("unreachable")

    @staticmethod
    def _current_version(connection: Connection) -> int:
        found = connection.execute("SELECT to_regclass('schema_migrations') IS NOT NULL AS present")
        present = found.fetchone()
        if not present or not present["present"]:
            return 0
        row = connection.execute("SELECT COALESCE(max(version), 0) AS version FROM schema_migrations")
        version = row.fetchone()
        return int(version["version"]) if version else 0
