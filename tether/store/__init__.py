"""The durable run store: one object per database and project."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from urllib.parse import parse_qs, parse_qsl, quote, unquote, urlencode, urlparse, urlsplit, urlunsplit

from tether.errors import InvalidInput, SchemaOutdated, SchemaTooNew
from tether.store.children import ChildOps, ChildRun, ParentLink
from tether.store.control import WorkerRecord
from tether.store.db import Database, SqliteDatabase
from tether.store.forks import Lineage, path_before
from tether.store.journal import StoredBlobs
from tether.store.limits import RunLimit, SlotWait, slot_waits
from tether.store.notices import ChangeFeed
from tether.store.progress import Progress
from tether.store.records import (
    Attempt,
    ClaimAuthority,
    Decision,
    Effect,
    InteractiveRequest,
    ListRevision,
    Preparation,
    RunEvent,
    RunRecord,
    RunView,
    RunViewPage,
    SettledTry,
    Submission,
    ViewerChanges,
    ViewerDelta,
    ViewerTarget,
    WorkflowMessage,
)
from tether.store.retention import PRUNABLE_STATUSES, PruneReport, prune_arguments
from tether.store.retention import prune as prune_runs
from tether.store.run_events import EventWait, InboxEvent, RunEventOps
from tether.store.schedules import ScheduleOps, ScheduleRecord, ScheduleSpec
from tether.store.states import QueueStatus, RunStatus
from tether.store.turns import AgentMessage, LiveText, TurnOps, agent_message, live_text_of
from tether.values import require_text, sha256

__all__ = [
    "AgentMessage",
    "LiveText",
    "live_text_of",
    "Attempt",
    "Progress",
    "ChildRun",
    "ClaimAuthority",
    "Decision",
    "Effect",
    "EventWait",
    "InboxEvent",
    "InteractiveRequest",
    "Lineage",
    "ListRevision",
    "ParentLink",
    "Preparation",
    "PruneReport",
    "QueueStatus",
    "RunEvent",
    "RunLimit",
    "RunRecord",
    "RunStatus",
    "RunView",
    "RunViewPage",
    "SlotWait",
    "ScheduleRecord",
    "ScheduleSpec",
    "SettledTry",
    "Store",
    "Submission",
    "ViewerChanges",
    "ViewerDelta",
    "ViewerTarget",
    "WorkerRecord",
    "WorkflowMessage",
    "agent_message",
    "open_database",
    "open_store",
    "path_before",
    "schema_version",
]

SYNCHRONOUS_MODES = ("FULL", "NORMAL", "EXTRA")
#: Store options a PostgreSQL URL may carry (the rest of the URL goes to libpq unchanged).
POSTGRES_OPTIONS = (
    "lock_timeout_ms",
    "idle_in_transaction_timeout_ms",
    "pool_min",
    "pool_max",
    "pool_timeout_ms",
)


class Store(TurnOps, RunEventOps, ScheduleOps, ChildOps):
    """A durable run store scoped to one project (``project_id`` None: the global view)."""

    def __init__(self, db: Database, project: str | None, *, migrate: bool = True) -> None:
        self.db = db
        self.url = db.url
        self.project = project
        self.project_id: str | None = None
        self._changes: ChangeFeed | None = None
        self._changes_lock = threading.Lock()
        self._closed = False
        self.json_blobs = {}
        self.stored_blobs = StoredBlobs()
        if migrate:
            db.migrate()
        else:
            require_current_schema(db)
        if project is not None:
            self.project_id = "project-" + sha256(project.encode("utf-8")).hex()[:40]
            # Registered once; later opens only read, so read-only commands never take the write lock.
            if db.one("project_get", path=project) is None:
                with db.transaction():
                    self.db.run("project_insert", project_id=self.project_id, path=project, now=db.now_ms())

    def prune_blobs(self) -> None:
        """Delete stored blobs that no row refers to any more (after deletes, refused writes)."""
        with self.db.transaction():
            self.db.run("blob_prunes_bump")  # stores that remember blobs as stored stop trusting that
            self.db.run("blob_prune")

    def prune(
        self,
        *,
        finished_before: datetime,
        statuses: Sequence[str] = PRUNABLE_STATUSES,
        limit: int | None = None,
        dry_run: bool = False,
    ) -> PruneReport:
        """Delete finished runs with everything recorded for them: runs whose queue status is one
        of ``statuses`` (``done``, ``cancelled``, ``failed``) and that finished before
        ``finished_before``, at most ``limit`` of them (None: all), in this store's project (every
        project in the global view). Their journal entries, attempts, requests, decisions,
        effects, messages and viewer rows go with them, and so do the blobs no row refers to
        any more. A run a restart child points at stays unless the child goes too (children
        first). Each run goes in a short transaction of its own, so workers go on meanwhile.
        ``dry_run``: delete nothing, count what would go. What went, by kind."""
        before, chosen, most = prune_arguments(finished_before, statuses, limit)
        if not isinstance(dry_run, bool):
            raise InvalidInput("dry_run must be True or False")
        if self.db.in_transaction:
            raise InvalidInput("prune runs its own short transactions; call it outside a transaction")
        return prune_runs(
            self.db, self.project_id, before=before, statuses=chosen, limit=most, dry_run=dry_run
        )

    def slot_waits(self, run_ids: Sequence[str], *, now: datetime | None = None) -> dict[str, SlotWait]:
        """Of these runs, those under a concurrency limit whose slots other runs all hold at
        ``now``, by run id (``SlotWait``: the key, its cap and the slots held). Read only."""
        if isinstance(run_ids, str) or not all(isinstance(run_id, str) for run_id in run_ids):
            raise InvalidInput("run_ids must be a list of run ids")
        with self.db.transaction(write=False):
            return slot_waits(self.db, list(run_ids), self._now(now))

    @contextmanager
    def transaction(self, *, first: bool = False) -> Iterator[None]:
        """One write transaction that every store call inside it joins; an exception rolls all
        of it back (a host wraps ``request_open`` and ``park`` in one, for example).

        ``first=True``: this process's threads waiting to write let this transaction go ahead
        of them (a runner's claims, so that its threads' steps do not hold up taking over an
        expired lease), but no more than four such transactions in a row pass one that waits.
        Ignored inside an open transaction, and on PostgreSQL, whose writers do not take turns."""
        if not isinstance(first, bool):
            raise InvalidInput("first must be True or False")
        with self.db.transaction(first=first):
            yield

    @property
    def changes(self) -> ChangeFeed:
        """Change notices: subscribe a ``threading.Event`` to ``runs`` or ``events`` to be woken
        when a run may have become claimable or the journal grew (see ``tether.store.notices``)."""
        with self._changes_lock:
            if self._changes is None:
                self._changes = ChangeFeed(self.db.watcher)
            return self._changes

    @property
    def in_transaction(self) -> bool:
        """Whether this thread has a ``transaction()`` open (store calls join it)."""
        return self.db.in_transaction

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called (every call then raises ``StoreError``)."""
        return self._closed

    def close(self) -> None:
        self._closed = True
        with self._changes_lock:
            changes = self._changes
        if changes is not None:
            changes.close()
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def require_current_schema(db: Database) -> None:
    """Refuse a database whose schema is not the one this code knows (it was not upgraded)."""
    current, latest = db.schema_version()
    if current > latest:
        raise SchemaTooNew(
            f"The database {db.url} has schema version {current}, newer than this Tether's {latest}; "
            "upgrade Tether to open it"
        )
    if current < latest:
        raise SchemaOutdated(
            f"The database {db.url} has schema version {current} and this Tether needs {latest}; "
            "run `tether db upgrade` first (or open it with migrate=True)"
        )


def open_store(url: str, *, project: str | None = "default", migrate: bool = True) -> Store:
    """Open (and create or migrate) the store at ``url``.

    ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``; ``?synchronous=NORMAL``
    trades the last commits on power loss for speed (the default ``FULL`` loses nothing
    acknowledged). ``project=None`` opens the global view, which lists and claims across all
    projects and cannot reserve.

    ``postgresql://user:password@host:port/database`` opens a PostgreSQL store (``pip install
    'tether[postgres]'``); any libpq parameter may follow in the query string, and
    ``lock_timeout_ms`` (5000), ``idle_in_transaction_timeout_ms`` (60000), ``pool_min`` (1),
    ``pool_max`` (10) and ``pool_timeout_ms`` (5000: how long a call waits for a free connection
    before ``StoreBusy``; a database that cannot be reached is ``StoreUnavailable`` at once) tune
    the store.

    ``migrate=False`` opens without applying pending migrations and refuses (``SchemaOutdated``) a
    database that needs them: for deployments that upgrade the schema in a separate step
    (``tether db upgrade``) before rolling out new workers.
    """
    if project is not None:
        require_text("project", project)
    if not isinstance(migrate, bool):
        raise InvalidInput("migrate must be True or False")
    database = open_database(url, create=migrate)
    try:
        return Store(database, project, migrate=migrate)
    except BaseException:
        database.close()
        raise


def schema_version(url: str) -> tuple[int, int]:
    """The schema version of the database at ``url`` and the latest this Tether knows, changing
    nothing (a missing SQLite file is refused, not created)."""
    database = open_database(url, create=False)
    try:
        return database.schema_version()
    finally:
        database.close()


def open_database(url: str, *, create: bool = True) -> Database:
    """The connection layer for a store URL (see ``open_store``); ``create=False`` refuses a
    SQLite file that does not exist instead of creating it."""
    if not isinstance(url, str):
        raise InvalidInput("The store URL must be a string such as sqlite:///tether.db")
    parsed = urlparse(url)
    if parsed.scheme in ("postgresql", "postgres"):
        return _postgres(url)
    if parsed.scheme != "sqlite" or not parsed.path or parsed.path == "/":
        raise InvalidInput(f"Unsupported store URL {url!r}: use sqlite:///relative/or/absolute.db")
    options = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    unknown = set(options) - {"synchronous", "busy_timeout_ms"}
    if unknown:
        raise InvalidInput(f"Unknown store URL option(s): {', '.join(sorted(unknown))}")
    synchronous = options.get("synchronous", "FULL").upper()
    if synchronous not in SYNCHRONOUS_MODES:
        raise InvalidInput(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}")
    try:
        busy = int(options.get("busy_timeout_ms", "5000"))
    except ValueError:
        raise InvalidInput("busy_timeout_ms must be a whole number of milliseconds") from None
    path = Path(unquote(parsed.path[1:]))
    if not create and not path.exists():
        raise SchemaOutdated(f"No Tether database at {path}; run `tether db upgrade` to create it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InvalidInput(f"Cannot create the folder for {path}: {error.strerror}") from error
    return SqliteDatabase(path, synchronous=synchronous, busy_timeout_ms=busy)


def _postgres(url: str) -> Database:
    """A PostgreSQL connection layer for ``url``, with the store's own options taken out of it."""
    from tether.store.postgres import PostgresDatabase

    parsed = urlsplit(url)
    pairs = parse_qsl(parsed.query, keep_blank_values=True)
    ours = {k: v for k, v in pairs if k in POSTGRES_OPTIONS}
    settings: dict[str, int] = {}
    for name, value in ours.items():
        try:
            settings[name] = int(value)
        except ValueError:
            raise InvalidInput(f"{name} must be a whole number") from None
        if settings[name] < (1 if name == "pool_max" else 0):
            raise InvalidInput(f"{name} must not be {'below 1' if name == 'pool_max' else 'negative'}")
    # libpq decodes %XX in a URL but not "+", so spaces (options=-c x=y) must travel as %20.
    rest = urlencode([(k, v) for k, v in pairs if k not in POSTGRES_OPTIONS], quote_via=quote)
    conninfo = urlunsplit((parsed.scheme, parsed.netloc, parsed.path, rest, parsed.fragment))
    return PostgresDatabase(conninfo, **settings)
