"""Run operations: reservation, reads, claims, status moves, pause/resume, terminal transitions.

Each public method is one transaction that re-reads the run and re-checks the claim it acts
under; a ``False``/``None`` return means nothing was written.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from tether.errors import (
    CommitUnknown,
    Conflict,
    InconsistentState,
    InvalidInput,
    NotFound,
    ProjectNotRegistered,
)
from tether.store.db import Row
from tether.store.journal import STATUS_TARGETS, Journal, owner_type_for, resource_id_for
from tether.store.records import (
    Actor,
    ClaimAuthority,
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
    queue_sources,
    run_sources,
)
from tether.values import (
    MAX_INT,
    Json,
    canonical_json,
    digest_bytes,
    iso,
    optional_text,
    parse_now,
    require_count,
    require_lease_ms,
    require_run_id,
    require_text,
    to_datetime,
    token_hash,
)

Now = datetime | str | None
DETAIL_LIMIT = 8192
CONTROL_LEASE_MS = 30_000
DEFAULT_CONTROL_ID = "workflow-control"
CANCELLED_TEXT = "Workflow run cancelled"
MESSAGE_KINDS_CANCELLED_WITH_RUN = ("step", "decision", "followUp")
EXECUTION_MODES = ("interactive", "headless")


def _json_list(values: Sequence[str] | None) -> str | None:
    return None if not values else json.dumps(list(values))


def _sources(statuses: Sequence[str]) -> str:
    return json.dumps(list(statuses))


def _is_live(row: Row, now: int) -> bool:
    return row["owner_id"] is not None and row["expires_at"] is not None and row["expires_at"] > now


def _holds(row: Row | None, claim_token: str, now: int) -> bool:
    """VERIFY: the run exists, is owned, and the live lease was taken with this token."""
    return (
        row is not None
        and _is_live(row, now)
        and row["token_hash"] is not None
        and bytes(row["token_hash"]) == token_hash(claim_token)
    )


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
        return self.db.one("run_row", run_id=run_id)

    def _require_row(self, run_id: str) -> Row:
        row = self._row(run_id)
        if row is None:
            raise NotFound(f"Workflow run not found: {run_id}")
        return row

    def _stored_source(self, row: Row) -> dict[str, Any]:
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

    def _record(self, row: Row, claim_token: str | None = None) -> RunRecord:
        owned = row["owner_id"] is not None
        return RunRecord(
            run_id=row["run_id"],
            workflow_name=row["workflow_name"],
            workflow_source_ref=row["workflow_ref"],
            workflow_source=self._stored_source(row),
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
        now: Now = None,
    ) -> RunRecord:
        """Reserve a new queued run, atomically: on any error no row is written.

        Raises ``Conflict`` when the id is taken (``Workflow run already reserved: <id>``),
        ``SessionBusy`` when the session already has an active interactive run.
        """
        args = self._reservation_args(locals())
        try:
            with self.db.transaction():
                return self._reserve(args)
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
        now: Now = None,
    ) -> Preparation:
        """Reserve the run, or adopt the existing one when every prepared field matches.

        Adopting writes nothing; a mismatch raises ``Workflow run preparation conflicts: <id>``.
        """
        args = self._reservation_args(locals())
        for attempt in (1, 2):
            try:
                with self.db.transaction():
                    existing = self._row(args["run_id"])
                    if existing is None:
                        return Preparation("reserved", self._reserve(args))
                    self._check_adoptable(existing, args)
                    return Preparation("adopted", self._record(existing))
            except CommitUnknown:
                # Reading the run back is this call's own first step: run it once more.
                if attempt == 2:
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
        return args

    def _reserve(self, a: dict[str, Any]) -> RunRecord:
        run_id, now = a["run_id"], a["now"]
        if self.project_id is None:
            raise ProjectNotRegistered()
        if self._row(run_id) is not None:
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
                from tether.errors import SessionBusy

                raise SessionBusy(
                    f"Session {a['origin_session_id']} already has an active interactive run: "
                    f"{holder['run_id']}"
                )
        resource_id = resource_id_for("run", run_id)
        self.db.run(
            "definition_insert",
            digest=a["digest"],
            name=a["workflow_name"],
            definition_hash=self._put_json(a["definition_snapshot"], now),
            now=now,
        )
        self.db.run("resource_insert", resource_id=resource_id, type="run", key=run_id, revision=1, now=now)
        self.db.run("lease_insert", resource_id=resource_id)
        self.db.run(
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
        self.db.run("viewer_insert", run_id=run_id, now=now)
        source = a["source"]
        placed = [("", source["root"])] + [("/".join(m["mountPath"]), m["source"]) for m in source["mounted"]]
        for mount_path, identity in placed:
            source_type, ref, revision = _source_parts(identity) or ("", "", "")
            self.db.run(
                "run_source_insert",
                run_id=run_id,
                mount_path=mount_path,
                source_type=source_type,
                source_ref=ref,
                source_revision=revision,
            )
        self.db.run(
            "run_binding_insert",
            run_id=run_id,
            origin_session_id=a["origin_session_id"],
            execution_mode=a["execution_mode"],
            now=now,
        )
        self.db.run(
            "run_queue_insert",
            run_id=run_id,
            project_id=self.project_id,
            origin_session_id=a["origin_session_id"] if interactive else None,
            now=now,
        )
        self._emit(resource_id, 1, "run.queued", "session", a["origin_session_id"], {}, now)
        self.db.notify("runs")
        return self._record(self._require_row(run_id))

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
            return [self._record(self._require_row(r["run_id"])) for r in rows]

    def find_session_reservation(self, session_id: str) -> RunRecord | None:
        """The session's newest non-terminal interactive run (parked included)."""
        require_text("session_id", session_id)
        with self.db.transaction(write=False):
            row = self.db.one("run_session_reservation", session_id=session_id)
            return None if row is None else self._record(self._require_row(row["run_id"]))

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

    def is_paused(self, run_id: str) -> bool:
        require_text("run_id", run_id, limit=1000)
        row = self._row(run_id)
        return row is not None and row["paused"] == 1

    # -- claims ------------------------------------------------------------------------------
    def claim(
        self, *, run_id: str, runner_id: str, claim_token: str, lease_ms: int, now: Now = None
    ) -> RunRecord | None:
        """Claim one run for a runner. None when terminal, waiting on input, or held by another."""
        return self._claim_checked(run_id, runner_id, claim_token, lease_ms, now)

    def claim_for_interaction_validation(
        self, *, run_id: str, runner_id: str, claim_token: str, lease_ms: int, now: Now = None
    ) -> RunRecord | None:
        """Claim a run to validate a pending interactive submission (pending requests allowed)."""
        return self._claim_checked(run_id, runner_id, claim_token, lease_ms, now, allow_pending=True)

    def claim_for_control(
        self, *, run_id: str, runner_id: str, claim_token: str, lease_ms: int, now: Now = None
    ) -> RunRecord | None:
        """Take a short control claim that leaves the queue status and errors as they are."""
        return self._claim_checked(
            run_id, runner_id, claim_token, lease_ms, now, allow_pending=True, preserve_status=True
        )

    def claim_next(
        self,
        *,
        runner_id: str,
        claim_token: str,
        lease_ms: int,
        now: Now = None,
        exclude_run_ids: Sequence[str] | None = None,
    ) -> RunRecord | None:
        """Claim the first eligible run in (available_at, created_at, run_id) order, or None.

        The candidate is chosen and claimed in one write transaction, so it cannot be taken by
        another runner in between.
        """
        require_text("runner_id", runner_id)
        require_text("claim_token", claim_token, limit=1000)
        require_lease_ms(lease_ms)
        for run_id in exclude_run_ids or ():
            require_text("exclude_run_ids item", run_id, limit=1000)
        at = self._now(now)
        candidate: Row | None = None
        try:
            with self.db.transaction():
                query = "run_claim_next" if self.project_id is not None else "run_claim_next_global"
                params: dict[str, Any] = {
                    "now": at,
                    "runner_id": runner_id,
                    "exclude": _json_list(exclude_run_ids),
                }
                if self.project_id is not None:
                    params["project_id"] = self.project_id
                candidate = self.db.one(query, **params)
                if candidate is None:
                    return None
                scope = {"project_id": self.project_id, "exclude": params["exclude"]}
                chosen = candidate["run_id"]
                return self._claim(chosen, runner_id, claim_token, lease_ms, at, next_scope=scope)
        except CommitUnknown:
            if candidate is None:
                raise
            return self._claim_landed(candidate["run_id"], claim_token)

    def next_lease_lapse_ms(self, *, runner_id: str, now: Now = None) -> int | None:
        """Milliseconds from ``now`` until the earliest live lease that a runner other than
        ``runner_id`` holds on a run (of this store's project) lapses: from then on ``claim_next``
        may take that run over. None when no other runner holds a live lease. A runner with
        nothing to claim waits at most this long, so a dead runner's runs are taken over when their
        leases lapse rather than at the next poll."""
        require_text("runner_id", runner_id)
        at = self._now(now)
        row = self.db.one("lease_next_lapse", now=at, runner_id=runner_id, project_id=self.project_id)
        return None if row is None else int(row["expires_at"]) - at

    def _claim_landed(self, run_id: str, claim_token: str) -> RunRecord | None:
        """After a commit of unknown outcome: the claim if the lease holds this token (it landed),
        else None (nothing was written)."""
        with self.db.transaction(write=False):
            row = self._row(run_id)
            if row is None or row["token_hash"] != token_hash(claim_token):
                return None
            return self._record(row, claim_token)

    def _claim_checked(
        self,
        run_id: str,
        runner_id: str,
        claim_token: str,
        lease_ms: int,
        now: Now,
        *,
        allow_pending: bool = False,
        preserve_status: bool = False,
    ) -> RunRecord | None:
        require_text("run_id", run_id, limit=1000)
        require_text("runner_id", runner_id)
        require_text("claim_token", claim_token, limit=1000)
        require_lease_ms(lease_ms)
        at = self._now(now)
        try:
            with self.db.transaction():
                return self._claim(
                    run_id, runner_id, claim_token, lease_ms, at, allow_pending, preserve_status
                )
        except CommitUnknown:
            return self._claim_landed(run_id, claim_token)

    def _claim(
        self,
        run_id: str,
        runner_id: str,
        claim_token: str,
        lease_ms: int,
        now: int,
        allow_pending: bool = False,
        preserve_status: bool = False,
        next_scope: dict[str, Any] | None = None,
    ) -> RunRecord | None:
        """Claim one run. ``next_scope`` (claim_next's project and exclusions): the statement that
        takes the lease re-checks every claim_next clause."""
        row = self._row(run_id)
        if row is None or row["status"] in QUEUE_TERMINAL:
            return None
        if self.project_id is not None and row["project_id"] != self.project_id:
            return None  # a project's store claims only its own runs
        if not allow_pending and self.db.one("run_has_pending_request", run_id=run_id) is not None:
            return None
        if _is_live(row, now) and row["owner_id"] != runner_id:
            return None
        if not preserve_status and self._session_slot_taken(row):
            return None
        expires_at = now + lease_ms
        owner_type = owner_type_for(runner_id)
        taken = self.db.run(
            "lease_take" if next_scope is None else "lease_take_next",
            resource_id=row["resource_id"],
            generation=row["generation"],
            owner_type=owner_type,
            owner_id=runner_id,
            token_hash=token_hash(claim_token),
            now=now,
            expires_at=expires_at,
            require_free=0,
            **(next_scope or {}),
        )
        if taken != 1:
            return None
        if not preserve_status:
            self._set_queue(run_id, QueueStatus.STARTING, now, clear_error=True)
        self._bump_emit(
            row,
            "lease.claimed",
            {"expiresAt": iso(expires_at)},
            now,
            actor=(owner_type, runner_id),
            generation=row["generation"] + 1,
        )
        return self._record(self._require_row(run_id), claim_token)

    def _set_queue(
        self,
        run_id: str,
        status: QueueStatus,
        now: int,
        *,
        clear_error: bool = False,
        stamp_start: bool = False,
    ) -> bool:
        changed = (
            self.db.run(
                "queue_set_status",
                run_id=run_id,
                status=status.value,
                now=now,
                clear_error=int(clear_error),
                stamp_start=int(stamp_start),
                sources=_sources(queue_sources(status)),
            )
            == 1
        )
        if changed and status in (QueueStatus.QUEUED, QueueStatus.PARKED):
            self.db.notify("runs")
        return changed

    def _session_slot_taken(self, row: Row) -> bool:
        """Whether starting this interactive run would give its session a second active run."""
        if row["execution_mode"] != "interactive" or row["status"] not in (
            QueueStatus.PARKED,
            QueueStatus.QUEUED,
        ):
            return False
        holder = self.db.one("run_session_active", session_id=row["origin_session_id"])
        return holder is not None and holder["run_id"] != row["run_id"]

    def runs_awaiting_resume(self) -> list[str]:
        """Parked runs whose decisions are all answered and that wait for nothing else."""
        return [r["run_id"] for r in self.db.all("run_awaiting_resume", project_id=self.project_id)]

    def renew(self, *, run_id: str, claim_token: str, lease_ms: int, now: Now = None) -> bool:
        """Extend a live claim. False when the claim expired, was superseded or never existed."""
        require_text("run_id", run_id, limit=1000)
        require_text("claim_token", claim_token, limit=1000)
        require_lease_ms(lease_ms)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if row is None or row["owner_id"] is None:
                return False
            renewed = self.db.run(
                "lease_renew",
                resource_id=row["resource_id"],
                owner_type=row["owner_type"],
                owner_id=row["owner_id"],
                token_hash=token_hash(claim_token),
                generation=row["generation"],
                now=at,
                expires_at=at + lease_ms,
            )
            if renewed != 1:
                return False
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def verify_claim(self, *, run_id: str, claim_token: str, now: Now = None) -> bool:
        """Whether ``claim_token`` holds the run's live lease at ``now`` (read only)."""
        require_text("run_id", run_id, limit=1000)
        require_text("claim_token", claim_token, limit=1000)
        return _holds(self._row(run_id), claim_token, self._now(now))

    def claim_authority(self, run_id: str, claim_token: str) -> ClaimAuthority | None:
        """Who holds the run under this token (expiry is not judged here: see ``verify_claim``)."""
        require_text("run_id", run_id, limit=1000)
        require_text("claim_token", claim_token, limit=1000)
        row = self._row(run_id)
        if (
            row is None
            or row["owner_id"] is None
            or row["expires_at"] is None
            or bytes(row["token_hash"]) != token_hash(claim_token)
        ):
            return None
        owner_type = owner_type_for(row["owner_id"])
        return ClaimAuthority(
            actor=Actor(owner_type, row["owner_id"]),
            owner_type=owner_type,
            owner_id=row["owner_id"],
            token=claim_token,
            generation=row["generation"],
            lease_ms=row["expires_at"] - row["heartbeat_at"],
        )

    # -- moves under a claim -----------------------------------------------------------------
    def _claimed_row(self, run_id: str, claim_token: str, now: int) -> Row | None:
        row = self._row(run_id)
        return row if _holds(row, claim_token, now) else None

    def _args(self, run_id: str, claim_token: str, now: Now) -> int:
        require_text("run_id", run_id, limit=1000)
        require_text("claim_token", claim_token, limit=1000)
        return self._now(now)

    def mark_running(self, *, run_id: str, claim_token: str, now: Now = None) -> bool:
        """The claimer reports it executes the run (``started_at`` is kept from the first time)."""
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            row = self._claimed_row(run_id, claim_token, at)
            if row is None or not self._set_queue(run_id, QueueStatus.RUNNING, at, stamp_start=True):
                return False
            self._bump_emit(row, "run.queue_running", {"status": "running"}, at)
            return True

    def park(self, *, run_id: str, claim_token: str, now: Now = None) -> bool:
        """Release the claim and leave the run resumable."""
        return self._release(run_id, claim_token, QueueStatus.PARKED, now)

    def complete(self, *, run_id: str, claim_token: str, now: Now = None) -> bool:
        """Release the claim and finish the run's queue entry as done."""
        return self._release(run_id, claim_token, QueueStatus.DONE, now)

    def _release(self, run_id: str, claim_token: str, status: QueueStatus, now: Now) -> bool:
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            row = self._claimed_row(run_id, claim_token, at)
            if row is None or not self._set_queue(run_id, status, at):
                return False
            self._release_lease(row, claim_token, at, "claim changed during release")
            self._bump_emit(row, f"run.queue_{status}", {"status": status.value}, at)
            self._settle_effects(
                row, "run.park_queue" if status == QueueStatus.PARKED else "run.settle_queue", at
            )
            if status == QueueStatus.DONE:
                owner = (row["owner_type"], row["owner_id"])
                text = "Workflow run completed while the effect was applying"
                self._end_run_effects(run_id, ("applying",), owner, text, at, "workflowCompleted")
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def _release_lease(self, row: Row, claim_token: str, now: int, what: str) -> None:
        released = self.db.run(
            "lease_release",
            resource_id=row["resource_id"],
            token_hash=token_hash(claim_token),
            generation=row["generation"],
            now=now,
        )
        if released != 1:
            raise InconsistentState(f"Workflow run {row['run_id']} {what}")

    def park_for_no_progress(self, *, run_id: str, claim_token: str, detail: str, now: Now = None) -> bool:
        """Park a run whose runner made no progress; claim_next skips it until an operator resumes."""
        return self._special_park(
            run_id,
            claim_token,
            detail,
            now,
            code="runnerNoProgress",
            event="run.worker_no_progress",
            state_error="changed during runner recovery",
            claim_error="claim changed during runner recovery",
        )

    def park_for_source_change(self, *, run_id: str, claim_token: str, detail: str, now: Now = None) -> bool:
        """Park a run whose workflow source changed since it was reserved."""
        return self._special_park(
            run_id,
            claim_token,
            detail,
            now,
            code="workflowSourceChanged",
            event="run.source_changed",
            state_error="has inconsistent source-change state",
            claim_error="claim changed during source recovery",
        )

    def _special_park(
        self,
        run_id: str,
        claim_token: str,
        detail: str,
        now: Now,
        *,
        code: str,
        event: str,
        state_error: str,
        claim_error: str,
    ) -> bool:
        at = self._args(run_id, claim_token, now)
        if not isinstance(detail, str):
            raise InvalidInput("detail must be a string")
        detail = detail[:DETAIL_LIMIT]
        with self.db.transaction():
            row = self._claimed_row(run_id, claim_token, at)
            if row is None:
                return False
            error_hash = self._put_text(detail, at)
            run_changed = self.db.run("run_set_detail", run_id=run_id, detail=detail, now=at)
            queue_changed = self.db.run(
                "queue_park_with_error",
                run_id=run_id,
                code=code,
                error_hash=error_hash,
                now=at,
                touch_available=1,
                sources=_sources(queue_sources(QueueStatus.PARKED)),
            )
            if run_changed != 1 or queue_changed != 1:
                raise InconsistentState(f"Workflow run {run_id} {state_error}")
            self._release_lease(row, claim_token, at, claim_error)
            self._bump_emit(row, event, {"status": "parked", "code": code}, at)
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def park_for_ambiguous_effect(self, *, run_id: str, claim_token: str, now: Now = None) -> bool:
        """Park a running run whose effect outcome is unknown; an operator must decide."""
        at = self._args(run_id, claim_token, now)
        detail = "effect outcome is ambiguous; explicit recovery is required"
        with self.db.transaction():
            row = self._claimed_row(run_id, claim_token, at)
            if row is None:
                return False
            error_hash = self._put_text(detail, at)
            self.db.run(
                "attempt_set_waiting",
                run_id=run_id,
                attempt_id=None,
                now=at,
                sources=_sources(("pending", "running")),
            )
            run_changed = self._set_run(run_id, RunStatus.WAITING, at, detail=detail, only_from=("running",))
            queue_changed = self.db.run(
                "queue_park_with_error",
                run_id=run_id,
                code="effectAmbiguous",
                error_hash=error_hash,
                now=at,
                touch_available=0,
                sources=_sources(("starting", "running", "parked")),
            )
            if not run_changed or queue_changed != 1:
                raise InconsistentState(f"Workflow run {run_id} has inconsistent ambiguous-effect state")
            self._release_lease(row, claim_token, at, "claim changed during effect recovery")
            self._bump_emit(row, "run.effect_ambiguous", {"status": "waiting", "code": "effectAmbiguous"}, at)
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def _set_run(
        self,
        run_id: str,
        status: RunStatus,
        now: int,
        *,
        detail: str | None = None,
        error_hash: bytes | None = None,
        only_from: Sequence[str] | None = None,
    ) -> bool:
        sources = run_sources(status) if only_from is None else tuple(only_from)
        self.db.notify("runs")  # a parked run waiting on its status may now be claimable
        return (
            self.db.run(
                "run_set_status",
                run_id=run_id,
                status=status.value,
                detail=detail,
                error_hash=error_hash,
                now=now,
                sources=_sources(sources),
            )
            == 1
        )

    # -- pause and resume --------------------------------------------------------------------
    def pause_parked(self, *, run_id: str, now: Now = None) -> bool:
        """Pause a parked run that waits on its session (its deadline clock stops)."""
        require_text("run_id", run_id, limit=1000)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if row is None or row["status"] != QueueStatus.PARKED or _is_live(row, at):
                return False
            if self.db.one("run_has_pending_request", run_id=run_id) is None:
                return False
            if row["paused"] == 1:
                return True
            changed = self.db.run(
                "run_set_paused",
                run_id=run_id,
                paused=1,
                detail="paused",
                now=at,
                sources=_sources(("running", "waiting")),
            )
            if changed != 1:
                return False
            self._close_run_time(run_id)
            self._bump_emit(
                row, "run.paused", {"status": "parked"}, at, actor=("control", None), generation=0
            )
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def resume_paused_interaction(self, *, run_id: str, now: Now = None) -> bool:
        """Unpause a parked run that waits on its session's input."""
        require_text("run_id", run_id, limit=1000)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if (
                row is None
                or row["status"] != QueueStatus.PARKED
                or row["run_status"] != RunStatus.WAITING
                or row["paused"] != 1
                or _is_live(row, at)
                or self.db.one("run_has_pending_request", run_id=run_id) is None
            ):
                return False
            changed = self.db.run(
                "run_set_paused",
                run_id=run_id,
                paused=0,
                detail="waiting for origin-session input",
                now=at,
                sources=_sources(("waiting",)),
            )
            if changed != 1:
                return False
            self.db.notify("runs")
            self._bump_emit(
                row, "run.resumed", {"status": "waiting"}, at, actor=("control", None), generation=0
            )
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def request_resume(self, *, run_id: str, now: Now = None) -> bool:
        """Put an unclaimed, non-terminal run back in the queue (operator resume).

        False when the run is terminal, held by a live claim, waits on its session, still has an
        effect whose outcome is ambiguous, or its session's active slot is taken by another run.
        """
        require_text("run_id", run_id, limit=1000)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if row is None or row["status"] in QUEUE_TERMINAL or _is_live(row, at):
                return False
            if self.db.one("run_has_pending_request", run_id=run_id) is not None:
                return False
            if self.db.all(
                "effect_select",
                effect_id=None,
                run_id=run_id,
                idempotency_key=None,
                status="ambiguous",
                effect_type=None,
            ):
                return False
            if self._session_slot_taken(row):
                return False
            self.db.run(
                "run_set_paused",
                run_id=run_id,
                paused=0,
                detail=None,
                now=at,
                sources=_sources((*run_sources(RunStatus.RUNNING), "queued")),
            )
            self.db.run(
                "queue_requeue", run_id=run_id, now=at, sources=_sources(queue_sources(QueueStatus.QUEUED))
            )
            self.db.notify("runs")
            self._bump_emit(
                row, "run.resume_requested", {"status": "queued"}, at, actor=("control", None), generation=0
            )
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    # -- terminal transitions ----------------------------------------------------------------
    def fail(
        self,
        *,
        run_id: str,
        error_code: str,
        error_message: str,
        claim_token: str | None = None,
        now: Now = None,
    ) -> bool:
        """Fail the run. With a token: the live claimer. Without: only a queued/starting unowned run."""
        require_text("error_code", error_code)
        if not isinstance(error_message, str):
            raise InvalidInput("error_message must be a string")
        return self._terminal(run_id, claim_token, QueueStatus.FAILED, error_code, error_message, now)

    def cancel(self, *, run_id: str, claim_token: str | None = None, now: Now = None) -> bool:
        """Cancel the run. Without a token, a run whose claim is absent or expired is cancelled
        through ``cancel_stale``; with a wrong token nothing happens."""
        cancelled = self._terminal(
            run_id, claim_token, QueueStatus.CANCELLED, "cancelled", CANCELLED_TEXT, now
        )
        if cancelled or claim_token is not None:
            return cancelled
        return self.cancel_stale(run_id=run_id, now=now)

    def _terminal(
        self, run_id: str, claim_token: str | None, status: QueueStatus, code: str, error: str, now: Now
    ) -> bool:
        require_text("run_id", run_id, limit=1000)
        if claim_token is not None:
            require_text("claim_token", claim_token, limit=1000)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if row is None or row["status"] in QUEUE_TERMINAL or row["run_status"] in RUN_TERMINAL:
                return False
            if claim_token is None:
                if (
                    row["status"] not in (QueueStatus.QUEUED, QueueStatus.STARTING)
                    or row["owner_id"] is not None
                ):
                    return False
            elif not _holds(row, claim_token, at):
                return False
            error_hash = self._put_text(error, at)
            finished = self.db.run(
                "queue_finish",
                run_id=run_id,
                status=status.value,
                code=code,
                error_hash=error_hash,
                now=at,
                sources=_sources(queue_sources(status)),
            )
            if finished != 1:
                return False
            if claim_token is not None:
                self._release_lease(row, claim_token, at, "claim changed during terminal transition")
            run_status = RunStatus(status.value)
            self._set_run(run_id, run_status, at, error_hash=error_hash)
            self._cancel_pending_messages(run_id, at)
            if status == QueueStatus.FAILED:
                self._close_run_time(run_id)
                self.db.run(
                    "attempt_end_active", run_id=run_id, status="failed", error_hash=error_hash, now=at
                )
                self.db.run("request_cancel_pending", run_id=run_id, now=at)
                # An effect caught applying is classified (pending ones were never applied).
                owner = (row["owner_type"] or "system", row["owner_id"])
                self._end_run_effects(run_id, ("applying",), owner, error_hash, at, "workflowFailed")
            else:
                self._cancel_dependents(run_id, row["owner_id"] or DEFAULT_CONTROL_ID, error_hash, at)
            self._bump_emit(
                row, f"run.queue_{status}", {"status": status.value, "code": code, "error": error}, at
            )
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def cancel_stale(
        self,
        *,
        run_id: str,
        control_id: str | None = None,
        claim_token: str | None = None,
        now: Now = None,
    ) -> bool:
        """Cancel a non-terminal run whose claim is absent or expired, under a short control claim
        (it consumes one lease generation). False for a live or terminal run."""
        require_text("run_id", run_id, limit=1000)
        control_id = require_text("control_id", control_id or DEFAULT_CONTROL_ID)
        claim_token = require_text("claim_token", claim_token or str(uuid.uuid4()), limit=1000)
        at = self._now(now)
        with self.db.transaction():
            row = self._row(run_id)
            if (
                row is None
                or row["status"] in QUEUE_TERMINAL
                or row["run_status"] in RUN_TERMINAL
                or _is_live(row, at)
            ):
                return False
            generation = row["generation"] + 1
            taken = self.db.run(
                "lease_take",
                resource_id=row["resource_id"],
                generation=row["generation"],
                owner_type="system",
                owner_id=control_id,
                token_hash=token_hash(claim_token),
                now=at,
                expires_at=at + CONTROL_LEASE_MS,
                require_free=1,
            )
            if taken != 1:
                return False
            error_hash = self._put_text(CANCELLED_TEXT, at)
            finished = self.db.run(
                "queue_finish",
                run_id=run_id,
                status="cancelled",
                code="cancelled",
                error_hash=error_hash,
                now=at,
                sources=_sources(queue_sources(QueueStatus.CANCELLED)),
            )
            if finished != 1:
                raise InconsistentState(f"Workflow run {run_id} has inconsistent queue state")
            if not self._set_run(run_id, RunStatus.CANCELLED, at, error_hash=error_hash):
                raise InconsistentState(f"Workflow run {run_id} has inconsistent durable state")
            self._cancel_pending_messages(run_id, at)
            self._cancel_dependents(run_id, control_id, error_hash, at)
            control = self._require_row(run_id)
            self._release_lease(control, claim_token, at, "control claim changed during cancellation")
            self._bump_emit(
                row,
                "run.queue_cancelled",
                {"status": "cancelled", "code": "cancelled", "staleControl": True},
                at,
                actor=("control", control_id),
                generation=generation,
            )
            self._viewer_record(run_id, STATUS_TARGETS, at)
            return True

    def _cancel_pending_messages(
        self, run_id: str, now: int, kinds: Sequence[str] = MESSAGE_KINDS_CANCELLED_WITH_RUN
    ) -> int:
        if not kinds:
            return 0
        return self.db.run("message_cancel_pending", run_id=run_id, now=now, kinds=_sources(kinds))

    def _cancel_dependents(self, run_id: str, actor_id: str, error_hash: bytes, now: int) -> None:
        self._close_run_time(run_id)
        self.db.run("attempt_end_active", run_id=run_id, status="cancelled", error_hash=error_hash, now=now)
        self._end_run_effects(
            run_id, ("pending", "applying"), ("control", actor_id), error_hash, now, "workflowCancelled"
        )
        self.db.run("decision_cancel_open", run_id=run_id, actor_id=actor_id, now=now)
        receipt = self._put_json({"status": "rejected", "error": CANCELLED_TEXT}, now)
        self.db.run("submission_reject_for_run", run_id=run_id, receipt_hash=receipt, now=now)
        self.db.run("request_cancel_pending", run_id=run_id, now=now)

    def _end_run_effects(
        self,
        run_id: str,
        statuses: Sequence[str],
        actor: tuple[str, str | None],
        error: bytes | str,
        now: int,
        reason: str,
    ) -> None:
        """Classify the run-scoped effects a run leaves behind as it ends (``statuses`` among
        pending/applying): one caught applying becomes ``ambiguous`` (its open attempt
        ``interrupted``), a pending one ``cancelled``; each gets one event on its own resource."""
        effects = self.db.all(
            "effect_select",
            effect_id=None,
            run_id=run_id,
            idempotency_key=None,
            status=None,
            effect_type=None,
        )
        for effect in sorted(effects, key=lambda e: e["effect_id"]):
            if effect["owner_scope"] != "run" or effect["status"] not in statuses:
                continue
            if isinstance(error, str):
                error = self._put_text(error, now)
            error_hash = error
            status = "ambiguous" if effect["status"] == "applying" else "cancelled"
            changed = self.db.run(
                "effect_set_status",
                effect_id=effect["effect_id"],
                status=status,
                attempt_count=effect["attempt_count"],
                result_hash=None,
                error_hash=error_hash,
                now=now,
                old_status=effect["status"],
                old_attempt_count=effect["attempt_count"],
            )
            if changed != 1:
                raise InconsistentState(f"Workflow effect {effect['effect_id']} changed during cancellation")
            if effect["status"] == "applying":
                self.db.run(
                    "effect_attempt_finish",
                    effect_id=effect["effect_id"],
                    attempt_number=effect["attempt_count"],
                    outcome="interrupted",
                    error_hash=error_hash,
                    now=now,
                )
            revision = self._bump(effect["resource_id"], now)
            self._emit(
                effect["resource_id"],
                revision,
                f"effect.{status}",
                actor[0],
                actor[1],
                {"runId": run_id, "reason": reason},
                now,
            )

    def delete(self, *, run_id: str, claim_token: str, now: Now = None) -> bool:
        """Delete a run and everything recorded for it, under its live claim.

        False when the run is missing or the claim is not live. Raises ``Conflict`` while restart
        children still point at the run.
        """
        at = self._args(run_id, claim_token, now)
        with self.db.transaction():
            row = self._claimed_row(run_id, claim_token, at)
            if row is None:
                return False
            child = self.db.one("run_delete_children_exist", run_id=run_id)
            if child is not None:
                raise Conflict(f"Workflow run {run_id} has restart children; delete {child['run_id']} first")
            self.db.run("run_delete_events", resource_id=row["resource_id"])
            self.db.run("run_delete_effect_resources", resource_id=row["resource_id"])
            return self.db.run("run_delete_resource", resource_id=row["resource_id"]) == 1

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
        """Run events with a sequence above ``seq``, ascending (effect events are not included);
        only one run's with ``run_id``, only one type's with ``event_type``."""
        require_count("seq", seq)
        require_count("limit", limit, minimum=1)
        if run_id is not None:
            require_text("run_id", run_id, limit=1000)
        if event_type is not None:
            require_text("event_type", event_type)
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
                    {} if r["payload_hash"] is None else self._read_json(r["payload_hash"]),
                )
                for r in rows
            ]

    def last_event_seq(self) -> int:
        """The newest journal sequence number (0 for an empty journal)."""
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

    def _settle_effects(self, row: Row, effect_type: str, now: int) -> int:
        settled = 0
        pending = self.db.all(
            "effect_select",
            effect_id=None,
            run_id=row["run_id"],
            idempotency_key=None,
            status="pending",
            effect_type=effect_type,
        )
        for effect in pending:
            if self.db.run("effect_settle_pending", effect_id=effect["effect_id"], now=now) != 1:
                continue
            revision = self._bump(effect["resource_id"], now)
            self._emit(
                effect["resource_id"],
                revision,
                "effect.applied",
                "system",
                None,
                {"runId": row["run_id"], "effectType": effect_type},
                now,
            )
            settled += 1
        return settled

    # -- interaction deadlines ---------------------------------------------------------------
    def begin_interaction_timeout(
        self, *, run_id: str, target_session_id: str, claim_token: str, now: Now = None
    ) -> bool:
        """Cancel the first expired pending request of the run for the session and hand the run
        back to the claimer to finish the node. False when nothing expired (active time only)."""
        at = self._args(run_id, claim_token, now)
        require_text("target_session_id", target_session_id)
        with self.db.transaction():
            row = self._claimed_row(run_id, claim_token, at)
            if row is None or row["run_status"] != RunStatus.WAITING or row["status"] != QueueStatus.PARKED:
                return False
            expired = self.db.one("request_expired", run_id=run_id, session_id=target_session_id)
            if expired is None:
                return False
            self._close_run_time(run_id)
            request = self.db.run(
                "request_set_status", request_id=expired["request_id"], status="cancelled", now=at
            )
            run = self._set_run(
                run_id,
                RunStatus.RUNNING,
                at,
                detail="finishing expired interaction deadline",
                only_from=("waiting",),
            )
            queue = self.db.run(
                "queue_set_status",
                run_id=run_id,
                status="starting",
                now=at,
                clear_error=1,
                stamp_start=0,
                sources=_sources(("parked",)),
            )
            if request != 1 or not run or queue != 1:
                raise InconsistentState(f"Workflow run {run_id} changed during interaction timeout")
            receipt = self._put_json(
                {"status": "rejected", "error": "Workflow node model-turn deadline expired"}, at
            )
            self.db.run(
                "submission_reject_for_request",
                request_id=expired["request_id"],
                receipt_hash=receipt,
                now=at,
            )
            self._bump_emit(
                row,
                "run.interaction_timeout_started",
                {"requestId": expired["request_id"], "attemptId": expired["attempt_id"]},
                at,
            )
            from tether.store.records import ViewerTarget

            self._viewer_record(
                run_id, (ViewerTarget("summary"), ViewerTarget("replay"), ViewerTarget("conversation")), at
            )
            return True
