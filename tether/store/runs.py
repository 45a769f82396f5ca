"""Run operations: the shared helpers, reservation, reads and the run's journal.

Each public method is one transaction; a refused call writes nothing. The operations under a
claim (claims, status moves, pause/resume, terminal transitions) are in ``leases``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from tether.errors import (
    CommitUnknown,
    Conflict,
    InconsistentState,
    InvalidInput,
    NotFound,
    ProjectNotRegistered,
    SessionBusy,
)
from tether.store.db import Row
from tether.store.journal import Journal, owner_type_for, resource_id_for
from tether.store.limits import RunLimit, queue_columns
from tether.store.records import (
    ListRevision,
    Preparation,
    RunEvent,
    RunRecord,
    RunView,
    RunViewPage,
)
from tether.store.states import (
    QUEUE_TERMINAL,
    RUN_TERMINAL,
    QueueStatus,
    RunStatus,
)
from tether.values import (
    MAX_INT,
    Json,
    canonical_json,
    digest_bytes,
    optional_text,
    parse_now,
    require_count,
    require_run_id,
    require_text,
    to_datetime,
)

Now = datetime | str | None
EXECUTION_MODES = ("interactive", "headless")


def _json_list(values: Sequence[str] | None) -> str | None:
    return None if not values else json.dumps(list(values))


def _sources(statuses: Sequence[str]) -> str:
    return _sources_json(tuple(statuses))


@functools.lru_cache(maxsize=256)
def _sources_json(statuses: tuple[str, ...]) -> str:
    return json.dumps(list(statuses))


def _is_live(row: Row, now: int) -> bool:
    return row["owner_id"] is not None and row["expires_at"] is not None and row["expires_at"] > now


def _source_parts(source: object) -> tuple[str, str, str] | None:
    if not isinstance(source, dict):
        return None
    if (
        source.get("kind") == "builtin"
        and isinstance(source.get("id"), str)
        and isinstance(source.get("revision"), str)
    ):
        return ("builtin", source["id"], source["revision"])
    if (
        source.get("kind") == "file"
        and isinstance(source.get("path"), str)
        and isinstance(source.get("hash"), str)
    ):
        return ("file", source["path"], source["hash"])
    return None


def _source_json(source_type: str, ref: str, revision: str) -> dict[str, str]:
    if source_type == "builtin":
        return {"kind": "builtin", "id": ref, "revision": revision}
    return {"kind": "file", "path": ref, "hash": revision}


def normalize_source(value: object) -> dict[str, Any]:
    """A bare source or ``{root, mounted}`` as ``{root, mounted}``; anything else is refused."""
    invalid = InvalidInput("Stored workflow source identity is invalid")
    if _source_parts(value) is not None:
        assert isinstance(value, dict)
        return {"root": _source_json(*_source_parts(value)), "mounted": []}  # type: ignore[misc]
    if not isinstance(value, dict) or not isinstance(value.get("mounted"), list):
        raise invalid
    root = _source_parts(value.get("root"))
    if root is None:
        raise invalid
    mounted = []
    for mount in value["mounted"]:
        if not isinstance(mount, dict):
            raise invalid
        path, name, parts = (
            mount.get("mountPath"),
            mount.get("workflowName"),
            _source_parts(mount.get("source")),
        )
        if (
            not isinstance(path, list)
            or not path
            or not all(isinstance(p, str) and p and "/" not in p for p in path)
            or not isinstance(name, str)
            or parts is None
        ):
            raise invalid
        mounted.append({"mountPath": list(path), "workflowName": name, "source": _source_json(*parts)})
    mounted.sort(key=lambda m: "/".join(m["mountPath"]))
    paths = ["/".join(m["mountPath"]) for m in mounted]
    if len(set(paths)) != len(paths):
        raise InvalidInput("Stored workflow source identity is invalid: a mount path appears twice")
    return {"root": _source_json(*root), "mounted": mounted}


class RunOps(Journal):
    """The seed's run-queue operations."""

    project_id: str | None

    def _now(self, now: Now) -> int:
        """The caller's ``now`` in epoch ms; without one, the database's clock (so that every
        client of a shared database judges lease instants by the same clock)."""
        return self.db.now_ms() if now is None else parse_now(now)

    def now(self) -> datetime:
        """The store's clock: the instant a call given no ``now`` judges by (inside a transaction
        on SQLite, the transaction's one instant; on PostgreSQL, the database clock, read once per
        transaction and again after a statement that may have waited for a lock)."""
        return to_datetime(self.db.now_ms())

    # -- reading rows ------------------------------------------------------------------------
    def _row(self, run_id: str) -> Row | None:
        """The run's row. Read again in the same transaction with no write since, it is the row
        read last: nothing else changes it meanwhile (a write transaction holds the run: on
        SQLite the database, on PostgreSQL the run lock its first read took; a read transaction
        sees one snapshot). A run that is not there is read each time."""
        if not self.db.in_transaction:
            return self.db.one("run_row", run_id=run_id)
        return self._row_with(run_id)[0]

    def _row_with(
        self, run_id: str, *also: tuple[str, Mapping[str, Any]]
    ) -> tuple[Row | None, list[list[Row]]]:
        """The run's row (as ``_row`` reads it) and the rows of the reads ``also`` names, in one
        round trip with the row when the row is read, in the open transaction."""
        read: dict[str, tuple[int, Row | None]] = self.db.memo.setdefault("run_rows", {})
        writes = self.db.writes
        last = read.get(run_id)
        if last is not None and last[0] == writes:
            return last[1], self.db.each(also) if also else []
        rows, *others = self.db.each([("run_row", {"run_id": run_id}), *also])
        row = rows[0] if rows else None
        if row is not None:  # a run not there (yet) was not locked: read again next time
            read[run_id] = (writes, row)
        else:
            self.db.memo.setdefault("absent_runs", {})[run_id] = writes
        return row, others

    def _row_written(self, run_id: str, since: int, bumps: int, **columns: Any) -> None:
        """Keep the run's row read at the write count ``since`` as the row to read again, once
        the caller's writes since are known to have changed only ``columns`` of it (to the
        values given) and the run's revision (up by ``bumps``, its journal entries). A row read
        at another count is left to be read again."""
        read: dict[str, tuple[int, Row | None]] = self.db.memo.get("run_rows", {})
        last = read.get(run_id)
        if last is None or last[0] != since or last[1] is None:
            return
        row: Any = last[1]
        names = row.keys()  # (iterating a sqlite3.Row gives its values, not its columns)
        written = {key: row[key] for key in names}
        written["revision"] += bumps
        written.update(columns)
        read[run_id] = (self.db.writes, written)

    def _just_found_absent(self, run_id: str) -> bool:
        """Whether this transaction read that the run is not there with no write since: a caller
        about to insert it need not read again, since a run another transaction inserts
        meanwhile fails the insert on its unique key (``Conflict``) either way."""
        return bool(self.db.memo.get("absent_runs", {}).get(run_id, -1) == self.db.writes)

    def _require_row(self, run_id: str) -> Row:
        row = self._row(run_id)
        if row is None:
            raise NotFound(f"Workflow run not found: {run_id}")
        return row

    def _stored_source(self, row: Row, rows: list[Row] | None = None) -> dict[str, Any]:
        """The run's source; ``rows``: its run_sources rows, when read already."""
        if rows is None:
            rows = self.db.all("run_sources", run_id=row["run_id"])
        root = next((r for r in rows if r["mount_path"] == ""), None)
        if root is None:
            raise InconsistentState(f"Workflow run source is missing: {row['run_id']}")
        snapshot = self._read_json(row["definition_hash"])
        names: dict[str, str] = {}
        composition = snapshot.get("composition") if isinstance(snapshot, dict) else None
        mounts = composition.get("mounts") if isinstance(composition, dict) else None
        if (
            isinstance(snapshot, dict)
            and isinstance(snapshot.get("composition"), dict)
            and isinstance(mounts, list)
        ):
            for mount in mounts:
                if (
                    isinstance(mount, dict)
                    and isinstance(mount.get("mountPath"), list)
                    and all(isinstance(p, str) for p in mount["mountPath"])
                    and isinstance(mount.get("workflowName"), str)
                ):
                    names["/".join(mount["mountPath"])] = mount["workflowName"]
        return {
            "root": _source_json(root["source_type"], root["source_ref"], root["source_revision"]),
            "mounted": [
                {
                    "mountPath": r["mount_path"].split("/"),
                    "workflowName": names.get(r["mount_path"], r["mount_path"]),
                    "source": _source_json(r["source_type"], r["source_ref"], r["source_revision"]),
                }
                for r in rows
                if r["mount_path"] != ""
            ],
        }

    def _record_of(
        self, run_id: str, claim_token: str | None = None, sources: list[Row] | None = None
    ) -> RunRecord:
        """The run's record (``NotFound`` without the run); in a transaction, its sources are
        read in the run row's round trip (``sources``: its run_sources rows, when known)."""
        if not self.db.in_transaction:
            return self._record(self._require_row(run_id), claim_token)
        if sources is not None:
            return self._record(self._require_row(run_id), claim_token, sources)
        row, (sources,) = self._row_with(run_id, ("run_sources", {"run_id": run_id}))
        if row is None:
            raise NotFound(f"Workflow run not found: {run_id}")
        return self._record(row, claim_token, sources)

    def _record(
        self, row: Row, claim_token: str | None = None, sources: list[Row] | None = None
    ) -> RunRecord:
        owned = row["owner_id"] is not None
        return RunRecord(
            run_id=row["run_id"],
            workflow_name=row["workflow_name"],
            workflow_source_ref=row["workflow_ref"],
            workflow_source=self._stored_source(row, sources),
            initialized=row["run_status"] != RunStatus.QUEUED,
            definition_digest="sha256:" + bytes(row["definition_digest"]).hex(),
            input=self._read_json(row["input_hash"]),
            launch_options=self._read_json(row["launch_options_hash"]),
            status=row["status"],
            runner_id=row["owner_id"],
            claim_token=claim_token,
            claim_generation=row["generation"] if owned else None,
            claim_expires_at=to_datetime(row["expires_at"]),
            origin_session_id=None if row["execution_mode"] == "headless" else row["origin_session_id"],
            execution_mode=row["execution_mode"] or "interactive",
            parent_run_id=row["parent_run_id"],
            root_run_id=row["root_run_id"],
            lineage_kind=row["lineage_kind"],
            restart_number=row["restart_number"],
            parent_run_revision=row["parent_run_revision"],
            error_code=row["error_code"],
            error_message=self._read_text(row["error_hash"]),
            created_at=to_datetime(row["created_at"]),
            updated_at=to_datetime(row["updated_at"]),
            started_at=to_datetime(row["started_at"]),
            finished_at=to_datetime(row["finished_at"]),
            child_of=row["child_of"],
            child_of_node=row["child_of_node"],
        )

    @staticmethod
    def _view(row: Row) -> RunView:
        return RunView(
            run_id=row["run_id"],
            workflow_name=row["workflow_name"],
            workflow_source_ref=row["workflow_ref"],
            workflow_source={
                "root": _source_json(row["source_type"], row["source_ref"], row["source_revision"]),
                "mounted": [],
            },
            initialized=row["run_status"] != RunStatus.QUEUED,
            definition_digest="sha256:" + bytes(row["definition_digest"]).hex(),
            run_state_status=row["run_status"],
            paused=row["paused"] == 1,
            status=row["status"],
            origin_session_id=None if row["execution_mode"] == "headless" else row["origin_session_id"],
            execution_mode=row["execution_mode"],
            parent_run_id=row["parent_run_id"],
            root_run_id=row["root_run_id"],
            lineage_kind=row["lineage_kind"],
            restart_number=row["restart_number"],
            parent_run_revision=row["parent_run_revision"],
            error_code=row["error_code"],
            error_message=row["error_message"],
            created_at=to_datetime(row["created_at"]),
            updated_at=to_datetime(row["updated_at"]),
            started_at=to_datetime(row["started_at"]),
            finished_at=to_datetime(row["finished_at"]),
            child_of=row["child_of"],
            child_of_node=row["child_of_node"],
        )

    # -- reservation -------------------------------------------------------------------------
    def reserve(
        self,
        *,
        run_id: str,
        workflow_name: str,
        workflow_source_ref: str,
        workflow_source: Json,
        definition_digest: str,
        definition_snapshot: Json,
        input: Json = None,
        launch_options: Json = None,
        origin_session_id: str,
        execution_mode: str = "interactive",
        parent_run_id: str | None = None,
        lineage_kind: str | None = None,
        restart_number: int | None = None,
        parent_run_revision: int | None = None,
        limit: RunLimit | None = None,
        now: Now = None,
    ) -> RunRecord:
        """Reserve a new queued run, atomically: on any error no row is written.

        Raises ``Conflict`` when the id is taken (``Workflow run already reserved: <id>``),
        ``SessionBusy`` when the session already has an active interactive run. ``limit``: the
        concurrency limit the run counts against (see ``tether.store.limits``).
        """
        args = self._reservation_args(locals())
        try:
            with self.db.transaction():
                return self._reserve(args)
        except (Conflict, SessionBusy):
            # A concurrent reservation of the same id can surface as a duplicate key: say so.
            if self._row(args["run_id"]) is not None:
                raise Conflict(f"Workflow run already reserved: {args['run_id']}") from None
            raise
        except CommitUnknown:
            # Read the reservation back: there, it landed (the same fields, or Conflict); absent,
            # nothing was written and the reservation is made now.
            with self.db.transaction():
                existing = self._row(args["run_id"])
                if existing is None:
                    return self._reserve(args)
                self._check_adoptable(existing, args)
                return self._record(existing)

    def reserve_or_adopt(
        self,
        *,
        run_id: str,
        workflow_name: str,
        workflow_source_ref: str,
        workflow_source: Json,
        definition_digest: str,
        definition_snapshot: Json,
        input: Json = None,
        launch_options: Json = None,
        origin_session_id: str,
        execution_mode: str = "interactive",
        parent_run_id: str | None = None,
        lineage_kind: str | None = None,
        restart_number: int | None = None,
        parent_run_revision: int | None = None,
        limit: RunLimit | None = None,
        now: Now = None,
    ) -> Preparation:
        """Reserve the run, or adopt the existing one when every prepared field matches.

        Adopting writes nothing; a mismatch raises ``Workflow run preparation conflicts: <id>``.
        """
        args = self._reservation_args(locals())
        for attempt in (1, 2, 3):
            reserving = False
            try:
                with self.db.transaction():
                    existing = self._row(args["run_id"])
                    if existing is None:
                        reserving = True
                        return Preparation("reserved", self._reserve(args))
                    self._check_adoptable(existing, args)
                    return Preparation("adopted", self._record(existing))
            except CommitUnknown:
                # Reading the run back is this call's own first step: run it once more.
                if attempt == 3:
                    raise
            except (Conflict, SessionBusy):
                # Another call reserved the same run id between this call's read and its insert
                # (on PostgreSQL, READ COMMITTED: its row or its unique keys show up late). Read
                # again: adopt it, or raise the field-by-field conflict. Nothing was written.
                if not reserving or attempt == 3 or self._row(args["run_id"]) is None:
                    raise
        raise AssertionError("unreachable")

    def _reservation_args(self, given: dict[str, Any]) -> dict[str, Any]:
        args = {k: v for k, v in given.items() if k != "self"}
        require_run_id(args["run_id"])
        args["now"] = self._now(args["now"])
        args["digest"] = digest_bytes(args["definition_digest"])
        require_text("workflow_name", args["workflow_name"])
        require_text("workflow_source_ref", args["workflow_source_ref"], limit=4096)
        require_text("origin_session_id", args["origin_session_id"])
        if args["execution_mode"] not in EXECUTION_MODES:
            raise InvalidInput("execution_mode must be 'interactive' or 'headless'")
        optional_text("parent_run_id", args["parent_run_id"])
        args["source"] = normalize_source(args["workflow_source"])
        # Canonical forms are computed before the transaction so bad JSON is refused up front.
        for name in ("definition_snapshot", "input", "launch_options"):
            canonical_json(args[name])
        if args["launch_options"] is None:
            args["launch_options"] = {}
        limit = args["limit"]
        queue_columns(limit)  # a limit that is not a RunLimit is refused up front
        if limit is not None and limit.key.partition(":")[0] != args["workflow_name"]:
            raise InvalidInput(f"limit key {limit.key!r} does not belong to workflow {args['workflow_name']}")
        return args

    def _reserve(self, a: dict[str, Any]) -> RunRecord:
        run_id, now = a["run_id"], a["now"]
        if self.project_id is None:
            raise ProjectNotRegistered()
        if not self._just_found_absent(run_id) and self._row(run_id) is not None:
            raise Conflict(f"Workflow run already reserved: {run_id}")
        parent_id, kind = a["parent_run_id"], a["lineage_kind"]
        if (parent_id is None and kind is not None) or (parent_id is not None and kind != "restart"):
            raise InvalidInput("Only an explicit restart can declare a parent run")
        root_run_id, restart_number, parent_revision = run_id, 0, None
        if parent_id is not None:
            parent = self._require_row(parent_id)
            if parent["origin_session_id"] != a["origin_session_id"]:
                raise Conflict("Workflow parent belongs to another session")
            root_run_id = parent["root_run_id"]
            if parent["run_status"] not in RUN_TERMINAL or parent["status"] not in QUEUE_TERMINAL:
                raise Conflict("Restart parent is not terminal")
            revision = a["parent_run_revision"]
            if isinstance(revision, bool) or not isinstance(revision, int) or not 0 <= revision <= MAX_INT:
                raise InvalidInput("Restart requires the exact parent run revision")
            if revision != parent["revision"]:
                raise Conflict("Restart parent revision changed")
            parent_revision = revision
            child = self.db.one("run_restart_child", run_id=parent_id)
            if child is not None:
                raise Conflict(f"Workflow run {parent_id} was already restarted as {child['run_id']}")
            restart_number = a["restart_number"]
            if restart_number is None:
                restart_number = parent["restart_number"] + 1
            if isinstance(restart_number, bool) or restart_number != parent["restart_number"] + 1:
                raise InvalidInput("Restart number does not follow its parent")
        elif a["restart_number"] is not None or a["parent_run_revision"] is not None:
            raise InvalidInput("A root workflow run cannot declare restart metadata")
        interactive = a["execution_mode"] == "interactive"
        if interactive:
            holder = self.db.one("run_session_active", session_id=a["origin_session_id"])
            if holder is not None:
                raise SessionBusy(
                    f"Session {a['origin_session_id']} already has an active interactive run: "
                    f"{holder['run_id']}"
                )
        resource_id = resource_id_for("run", run_id)
        self.db.queue(
            "definition_insert",
            digest=a["digest"],
            name=a["workflow_name"],
            definition_hash=self._put_json(a["definition_snapshot"], now),
            now=now,
        )
        self.db.queue("resource_insert", resource_id=resource_id, type="run", key=run_id, revision=1, now=now)
        self.db.queue("lease_insert", resource_id=resource_id)
        self.db.queue(
            "run_insert",
            run_id=run_id,
            resource_id=resource_id,
            project_id=self.project_id,
            parent_run_id=parent_id,
            root_run_id=root_run_id,
            lineage_kind=kind if parent_id is not None else None,
            restart_number=restart_number,
            parent_run_revision=parent_revision,
            digest=a["digest"],
            workflow_ref=a["workflow_source_ref"],
            launch_options_hash=self._put_json(a["launch_options"], now),
            input_hash=self._put_json(a["input"], now),
            now=now,
        )
        self.db.queue("viewer_insert", run_id=run_id, now=now)
        source = a["source"]
        placed = [("", source["root"])] + [("/".join(m["mountPath"]), m["source"]) for m in source["mounted"]]
        sources: list[dict[str, str]] = []
        for mount_path, identity in placed:
            source_type, ref, revision = _source_parts(identity) or ("", "", "")
            sources.append(
                {
                    "mount_path": mount_path,
                    "source_type": source_type,
                    "source_ref": ref,
                    "source_revision": revision,
                }
            )
            self.db.queue("run_source_insert", run_id=run_id, **sources[-1])
        self.db.queue(
            "run_binding_insert",
            run_id=run_id,
            origin_session_id=a["origin_session_id"],
            execution_mode=a["execution_mode"],
            now=now,
        )
        self.db.queue(
            "run_queue_insert",
            run_id=run_id,
            project_id=self.project_id,
            origin_session_id=a["origin_session_id"] if interactive else None,
            now=now,
            **queue_columns(a["limit"]),
        )
        self._emit(resource_id, 1, "run.queued", "session", a["origin_session_id"], {}, now)
        self.db.notify("runs")
        # Its sources are the rows just written (the order of run_sources, by mount path, too).
        return self._record_of(run_id, sources=sorted(sources, key=lambda r: r["mount_path"]))

    def _check_adoptable(self, row: Row, a: dict[str, Any]) -> None:
        parent_id = a["parent_run_id"]
        kind = a["lineage_kind"] if parent_id is not None else None
        parent = self._require_row(parent_id) if parent_id is not None else None
        if kind == "restart":
            expected_number = a["restart_number"]
            if expected_number is None:
                expected_number = (parent["restart_number"] if parent is not None else -1) + 1
        else:
            expected_number = parent["restart_number"] if parent is not None else 0
        compatible = (
            row["workflow_name"] == a["workflow_name"]
            and row["workflow_ref"] == a["workflow_source_ref"]
            and bytes(row["definition_digest"]) == a["digest"]
            and canonical_json(self._stored_source(row)) == canonical_json(a["source"])
            and canonical_json(self._read_json(row["input_hash"])) == canonical_json(a["input"])
            and canonical_json(self._read_json(row["launch_options_hash"]))
            == canonical_json(a["launch_options"])
            and row["origin_session_id"] == a["origin_session_id"]
            and row["execution_mode"] == a["execution_mode"]
            and row["parent_run_id"] == parent_id
            and row["root_run_id"] == (parent["root_run_id"] if parent is not None else a["run_id"])
            and row["lineage_kind"] == kind
            and row["restart_number"] == expected_number
            and row["parent_run_revision"] == a["parent_run_revision"]
        )
        if not compatible:
            raise Conflict(f"Workflow run preparation conflicts: {a['run_id']}")

    # -- reads -------------------------------------------------------------------------------
    def get_run(self, run_id: str) -> RunRecord | None:
        """The run's record, or None when no such run exists."""
        require_text("run_id", run_id, limit=1000)
        with self.db.transaction(write=False):
            row = self._row(run_id)
            return None if row is None else self._record(row)

    def get_run_view(self, run_id: str) -> RunView | None:
        require_text("run_id", run_id, limit=1000)
        with self.db.transaction(write=False):
            rows = self.db.all("run_view_get", run_id=run_id)
            return self._view(rows[0]) if rows else None

    def list_revision(self) -> ListRevision:
        """A token that changes whenever any run changes: ``<count>:<revision sum>:<max updated>``."""
        with self.db.transaction(write=False):
            row = self.db.one("run_list_revision")
            assert row is not None
            return ListRevision(row["count"], f"{row['count']}:{row['revision_sum']}:{row['updated_at']}")

    def list_run_views(self, *, offset: int = 0, limit: int = 50) -> RunViewPage:
        """Viewer rows newest first, with the list revision read in the same transaction."""
        require_count("offset", offset)
        require_count("limit", limit, minimum=1)
        with self.db.transaction(write=False):
            current = self.list_revision()
            rows = self.db.all("run_view_list", limit=limit, offset=offset)
            return RunViewPage(current.total, current.revision, [self._view(r) for r in rows])

    def run_project_path(self, run_id: str) -> str | None:
        """The project a run belongs to, or None for an unknown run."""
        require_text("run_id", run_id, limit=1000)
        row = self.db.one("run_project_path", run_id=run_id)
        return None if row is None else str(row["canonical_path"])

    def list_runs(
        self,
        *,
        statuses: Sequence[str] | None = None,
        exclude_run_ids: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """Runs of this store's project (all projects for a global store), newest first."""
        for status in statuses or ():
            if status not in QueueStatus.__members__.values():
                raise InvalidInput(f"Unknown queue status: {status}")
        for run_id in exclude_run_ids or ():
            require_text("exclude_run_ids item", run_id, limit=1000)
        if limit is not None:
            require_count("limit", limit, minimum=0)
        with self.db.transaction(write=False):
            rows = self.db.all(
                "run_list",
                project_id=self.project_id,
                statuses=_json_list(statuses),
                exclude=_json_list(exclude_run_ids),
                limit=-1 if limit is None else limit,
            )
            return [self._record_of(r["run_id"]) for r in rows]

    def find_session_reservation(self, session_id: str) -> RunRecord | None:
        """The session's newest non-terminal interactive run (parked included)."""
        require_text("session_id", session_id)
        with self.db.transaction(write=False):
            row = self.db.one("run_session_reservation", session_id=session_id)
            return None if row is None else self._record_of(row["run_id"])

    def find_session_reservation_view(self, session_id: str) -> RunView | None:
        require_text("session_id", session_id)
        with self.db.transaction(write=False):
            rows = self.db.all("run_view_session", session_id=session_id)
            return self._view(rows[0]) if rows else None

    def run_revision(self, run_id: str) -> int | None:
        """The run's current revision (what a restart pins as ``parent_run_revision``)."""
        require_text("run_id", run_id, limit=1000)
        row = self._row(run_id)
        return None if row is None else int(row["revision"])

    def run_origin(self, run_id: str) -> str | None:
        """The session a run was started from, headless runs included (restarts keep it)."""
        require_text("run_id", run_id, limit=1000)
        row = self._row(run_id)
        return None if row is None else row["origin_session_id"]

    def run_status(self, run_id: str) -> str | None:
        """The run's durable status (a ``RunStatus`` value); None when there is no such run."""
        require_text("run_id", run_id, limit=1000)
        row = self._row(run_id)
        return None if row is None else str(row["run_status"])

    def is_paused(self, run_id: str) -> bool:
        require_text("run_id", run_id, limit=1000)
        row = self._row(run_id)
        return row is not None and row["paused"] == 1

    # -- journal -----------------------------------------------------------------------------
    def record_event(
        self,
        *,
        run_id: str,
        workflow_ref: str,
        type: str,
        payload: Json = None,
        runner_id: str | None = None,
        now: Now = None,
    ) -> RunEvent:
        """Append a caller event to the run's journal (one revision). No claim is checked."""
        require_text("run_id", run_id, limit=1000)
        require_text("workflow_ref", workflow_ref, limit=4096)
        require_text("type", type)
        optional_text("runner_id", runner_id)
        if payload is None:
            payload = {}
        if not isinstance(payload, dict):
            raise InvalidInput("Event payloads must be JSON objects")
        canonical_json(payload)
        at = self._now(now)
        with self.db.transaction():
            row = self._require_row(run_id)
            actor = (owner_type_for(runner_id), runner_id) if runner_id is not None else ("session", None)
            seq = self._bump_emit(row, type, payload, at, actor=actor)
            return RunEvent(
                seq,
                to_datetime(at),
                run_id,
                row["workflow_ref"],
                type,
                runner_id,
                json.loads(canonical_json(payload)),
            )

    def events_after(
        self, seq: int = 0, *, limit: int = 100, run_id: str | None = None, event_type: str | None = None
    ) -> list[RunEvent]:
        """Run events with a sequence above ``seq``, ascending, with the events of the runs' effects;
        only one run's with ``run_id``, only one type's with ``event_type``."""
        require_count("seq", seq)
        require_count("limit", limit, minimum=1)
        if run_id is not None:
            require_text("run_id", run_id, limit=1000)
        if event_type is not None:
            require_text("event_type", event_type)
        if run_id is None:
            self.db.settle_journal()  # every entry committed before this call is readable
        with self.db.transaction(write=False):
            if run_id is None:
                rows = self.db.all("event_list_after", seq=seq, limit=limit, event_type=event_type)
            else:
                rows = self.db.all(
                    "event_list_for_run", run_id=run_id, seq=seq, limit=limit, event_type=event_type
                )
            return [
                RunEvent(
                    r["event_seq"],
                    to_datetime(r["recorded_at"]),
                    r["run_id"],
                    r["workflow_ref"],
                    r["event_type"],
                    r["actor_id"],
                    self._event_payload(r),
                )
                for r in rows
            ]

    def _event_payload(self, row: Row) -> Json:
        """A journal entry's payload: in the entry, or in the blob it names."""
        if row["payload"] is not None:
            return json.loads(row["payload"])
        return {} if row["payload_hash"] is None else self._read_json(row["payload_hash"])

    def last_event_seq(self) -> int:
        """The newest journal sequence number (0 for an empty journal)."""
        self.db.settle_journal()
        row = self.db.one("event_max_seq")
        return 0 if row is None else int(row["seq"])

    def settle_effects(self, run_id: str, effect_type: str, *, now: Now = None) -> int:
        """Mark the run's pending effects of ``effect_type`` applied. How many were settled."""
        require_text("run_id", run_id, limit=1000)
        require_text("effect_type", effect_type)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            return 0 if row is None else self._settle_effects(row, effect_type, at)

    def _run_effects(self, run_id: str) -> list[Row]:
        """Every effect of a run, oldest first."""
        return self.db.all("effects_of_run", run_id=run_id)

    def _settle_effects(self, row: Row, effect_type: str, now: int, effects: list[Row] | None = None) -> int:
        """Apply the run's pending effects of a type; ``effects``: the run's effects, when the
        caller read them already in this transaction."""
        settled = 0
        if effects is None:
            effects = self._run_effects(row["run_id"])
        pending = [e for e in effects if e["status"] == "pending" and e["effect_type"] == effect_type]
        for effect in pending:
            if self.db.run("effect_settle_pending", effect_id=effect["effect_id"], now=now) != 1:
                continue
            self._bump_event(
                effect["resource_id"],
                "effect.applied",
                "system",
                None,
                {"runId": row["run_id"], "effectId": effect["effect_id"], "effectType": effect_type},
                now,
            )
            settled += 1
        return settled
