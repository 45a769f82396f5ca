"""The shared machinery under every store operation: blobs, revisions, events, viewer revisions."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

from tether.errors import NotFound, StoreError, TetherError
from tether.store.db import Database, Row
from tether.store.records import ViewerChanges, ViewerDelta, ViewerTarget
from tether.values import Json, canonical_bytes, ordered_uuid, sha256

JSON_MEDIA = "application/json"
TEXT_MEDIA = "text/plain"
VIEWER_TARGET_TYPES = ("summary", "graph", "replay", "timeline", "conversation", "inspector")
VIEWER_PATCH_OPS = ("add", "replace", "remove", "append")
VIEWER_RETAINED_REVISIONS = 256
#: The tables whose writes a transaction holds back until it reads them (``_write_viewer``).
VIEWER_TABLES = frozenset({"viewer_runs", "viewer_revisions"})
#: A journal entry's payload up to this size (canonical JSON) is stored in the entry, a larger one
#: as a blob that the entry names.
INLINE_PAYLOAD_BYTES = 2048
#: The in-memory cache of small JSON blobs: how many, and how large each may be.
CACHED_BLOBS = 4096
CACHED_BLOB_BYTES = 16 * 1024
#: What every revision bump of a run shows a viewer.
BUMP_TARGETS = (
    ViewerTarget("summary"),
    ViewerTarget("graph"),
    ViewerTarget("replay"),
    ViewerTarget("inspector", "run"),
)
STATUS_TARGETS = (ViewerTarget("summary"), ViewerTarget("replay"))


def resource_id_for(kind: str, key: str) -> str:
    """Deterministic aggregate id: ``<kind>-`` and 40 hex digits of SHA-256(kind NUL key)."""
    return f"{kind}-" + sha256(f"{kind}\x00{key}".encode("utf-8", "surrogatepass")).hex()[:40]


def owner_type_for(runner_id: str) -> str:
    return "host" if runner_id.startswith("host-") else "session"


class StoredBlobs:
    """Small JSON blobs that committed write transactions of this store wrote or found stored, with
    the count of blob prunes those transactions read. While the database's count is unchanged
    each of them is still stored (only a prune deletes blobs), so writing one again can be skipped."""

    def __init__(self) -> None:
        self._blobs: dict[bytes, bytes] = {}
        self._prunes: int | None = None
        self._lock = threading.Lock()

    def holds(self, digest: bytes, content: bytes, prunes: int) -> bool:
        with self._lock:
            return prunes == self._prunes and self._blobs.get(digest) == content

    def add(self, blobs: dict[bytes, bytes], prunes: int) -> None:
        with self._lock:
            if prunes != self._prunes or len(self._blobs) + len(blobs) > CACHED_BLOBS:
                self._blobs.clear()
                self._prunes = prunes
            self._blobs.update(blobs)


class Journal:
    """Blob, revision, event and viewer helpers; every method runs inside the caller's transaction."""

    db: Database
    #: Small JSON blobs already read, by hash (see ``_get``); shared by the store's threads.
    json_blobs: dict[bytes, bytes]
    #: Small JSON blobs known to be stored (see ``_put``); shared by the store's threads.
    stored_blobs: StoredBlobs

    # -- blobs -------------------------------------------------------------------------------
    def _put(self, content: bytes, media_type: str, now: int, digest: bytes | None = None) -> bytes:
        """Store content under its hash (once). A blob this transaction already stored costs
        nothing, and so does a JSON blob this store's committed writes stored or found, unless a
        prune ran since (``stored_blobs``); any other costs one write whose outcome nobody waits
        for (``queue``): the statement itself refuses different bytes under the hash (a
        collision: ``Conflict``) and promotes the same bytes stored as text to JSON. ``digest``:
        the content's hash, when the caller has it already."""
        if digest is None:
            digest = sha256(content)
        written = self.db.memo.setdefault("blobs", {})
        if written.get(digest) in (media_type, JSON_MEDIA):
            return digest
        if media_type == JSON_MEDIA and self.stored_blobs.holds(digest, content, self._blob_prunes()):
            written[digest] = JSON_MEDIA
            return digest
        self.db.queue(
            "blob_put",
            hash=digest,
            media_type=media_type,
            length=len(content),
            content=content,
            now=now,
        )
        if media_type == JSON_MEDIA:
            self._remember(digest, content, stored=True)
        written[digest] = media_type
        return digest

    def _blob_prunes(self) -> int:
        """The database's count of blob prunes, read once per write transaction (on PostgreSQL
        under the shared blob guard, which keeps a prune out until this transaction commits)."""
        memo = self.db.memo
        prunes = memo.get("blob_prunes")
        if prunes is None:
            row = self.db.one("blob_prunes_get")
            if row is None:
                raise StoreError("The blob_prunes table has no row (the database was changed by hand)")
            prunes = memo["blob_prunes"] = int(row["pruned"])
        return int(prunes)

    def _put_json(self, value: object, now: int) -> bytes:
        return self._put(canonical_bytes(value), JSON_MEDIA, now)

    def _put_text(self, text: str, now: int) -> bytes:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            data = text.encode("utf-8", "replace")
        return self._put(data, TEXT_MEDIA, now)

    def _get(self, digest: bytes) -> tuple[str, bytes] | None:
        """A blob's media type and content. Content under a hash never changes and a committed JSON
        blob stays JSON (text is only ever promoted to JSON), so small JSON blobs are kept in
        memory, and so are the ones this transaction stored or read already."""
        cached = self.json_blobs.get(digest)
        if cached is None:
            cached = self.db.memo.get("json_blobs", {}).get(digest)
        if cached is not None:
            return JSON_MEDIA, cached
        stored = self.db.one("blob_get", hash=digest)
        if stored is None:
            return None
        content = bytes(stored["content"])
        if stored["media_type"] == JSON_MEDIA:
            self._remember(digest, content)
        return str(stored["media_type"]), content

    def _remember(self, digest: bytes, content: bytes, *, stored: bool = False) -> None:
        """Hold a small JSON blob once the transaction that saw it commits (a rolled-back promotion
        from text must not be remembered as JSON); ``stored``: a write transaction stored it or
        found it stored, so it also counts as stored until the next prune."""
        if len(content) > CACHED_BLOB_BYTES:
            return
        memo = self.db.memo
        pending = memo.get("json_blobs")
        if pending is None:
            pending = memo["json_blobs"] = {}
            memo.setdefault("on_commit", []).append(lambda: self._hold(pending))
        pending[digest] = content
        if stored:
            written = memo.get("stored_blobs")
            if written is None:
                written = memo["stored_blobs"] = {}
                prunes = self._blob_prunes()
                memo["on_commit"].append(lambda: self.stored_blobs.add(written, prunes))
            written[digest] = content

    def _hold(self, blobs: dict[bytes, bytes]) -> None:
        if len(self.json_blobs) + len(blobs) > CACHED_BLOBS:
            self.json_blobs.clear()
        self.json_blobs.update(blobs)

    def _read_json(self, digest: bytes | None) -> Json:
        if digest is None:
            return None
        stored = self._get(digest)
        if stored is None or stored[0] != JSON_MEDIA:
            raise StoreError("JSON blob is missing or has the wrong media type")
        return json.loads(stored[1].decode("utf-8"))

    def _read_text(self, digest: bytes | None) -> str | None:
        if digest is None:
            return None
        stored = self._get(digest)
        return None if stored is None else stored[1].decode("utf-8", "replace")

    # -- revisions and events ----------------------------------------------------------------
    def _emit(
        self,
        resource_id: str,
        revision: int,
        event_type: str,
        actor_type: str,
        actor_id: str | None,
        payload: Json,
        now: int,
        generation: int | None = None,
    ) -> int:
        """Append one event at ``revision``; a generation of 0 is stored NULL. Its sequence."""
        params = self._event_params(resource_id, event_type, actor_type, actor_id, payload, now, generation)
        row = self.db.one("event_insert", revision=revision, **params)
        assert row is not None
        self.db.notify("events")
        seq = self.db.memo["event_seq"] = int(row["event_seq"])
        self.db.memo.setdefault("last_event_type", {})[resource_id] = event_type
        return seq

    def _event_params(
        self,
        resource_id: str,
        event_type: str,
        actor_type: str,
        actor_id: str | None,
        payload: Json,
        now: int,
        generation: int | None,
    ) -> dict[str, object]:
        """The parameters of one journal entry: its payload in the entry as canonical JSON text, or
        stored as a blob when larger than ``INLINE_PAYLOAD_BYTES``; a generation of 0 is stored
        NULL."""
        content = canonical_bytes(payload)
        inline = len(content) <= INLINE_PAYLOAD_BYTES
        return {
            "event_id": f"event-{ordered_uuid(now)}",
            "resource_id": resource_id,
            "type": event_type,
            "actor_type": actor_type,
            "actor_id": actor_id,
            "generation": generation or None,
            "payload_hash": None if inline else self._put(content, JSON_MEDIA, now),
            "payload": content.decode("utf-8") if inline else None,
            "now": now,
        }

    def _bump_event(
        self,
        resource_id: str,
        event_type: str,
        actor_type: str,
        actor_id: str | None,
        payload: Json,
        now: int,
        generation: int | None = None,
        *,
        run_id: str | None = None,
    ) -> int:
        """BUMP then EMIT, in one query (one statement on PostgreSQL): the aggregate's revision one
        up and one event at it (a generation of 0 is stored NULL); for a run, also one viewer
        revision. Its sequence. (On PostgreSQL the statement waits for the row and increments what
        committed, so two transactions on one resource take consecutive revisions.)

        A resource this transaction bumped already is bumped by a queued write (``queue``): its
        row stays locked by the transaction to its end, so the resource is still there, and the
        sequence is the one after the last this transaction appended (a transaction's journal
        entries are numbered consecutively on both backends)."""
        params = self._event_params(resource_id, event_type, actor_type, actor_id, payload, now, generation)
        memo = self.db.memo
        bumped: set[str] = memo.setdefault("bumped", set())
        row: Row | None
        advanced: Row | None = None
        if resource_id in bumped:
            self.db.queue("resource_bump_event", **params)
            seq = int(memo["event_seq"]) + 1
        else:
            if run_id is not None and run_id not in memo.get("viewer_advanced", {}):
                # The run's first viewer advance in this transaction too: both in one round trip.
                bump, advance = self.db.each(
                    [("resource_bump_event", params), ("viewer_advance", self._advance_params(run_id, now))]
                )
                if bump and not advance:
                    raise NotFound(f"Viewer projection does not exist for workflow run: {run_id}")
                row, advanced = (bump[0], advance[0]) if bump else (None, None)
            else:
                row = self.db.one("resource_bump_event", **params)
            if row is None:
                raise NotFound(f"Resource not found: {resource_id}")
            seq = int(row["event_seq"])
            bumped.add(resource_id)
        memo["event_seq"] = seq
        memo.setdefault("last_event_type", {})[resource_id] = event_type
        self.db.notify("events")
        if run_id is not None:
            self._viewer_record(run_id, BUMP_TARGETS, now, advanced)
        return seq

    def _bump_emit(
        self,
        row: Row,
        event_type: str,
        payload: Json,
        now: int,
        *,
        actor: tuple[str, str | None] | None = None,
        generation: int | None = None,
    ) -> int:
        """BUMP then EMIT on a run; the actor defaults to the lease owner read before the change."""
        actor_type, actor_id = actor or (row["owner_type"] or "system", row["owner_id"])
        return self._bump_event(
            row["resource_id"],
            event_type,
            actor_type,
            actor_id,
            payload,
            now,
            row["generation"] if generation is None else generation,
            run_id=row["run_id"],
        )

    def _journaled_last(self, resource_id: str, event_type: str) -> bool:
        """Whether the last journal entry this transaction appended on the resource is of
        ``event_type``."""
        return bool(self.db.memo.get("last_event_type", {}).get(resource_id) == event_type)

    # -- viewer projection -------------------------------------------------------------------
    def _viewer_record(
        self, run_id: str, targets: Sequence[ViewerTarget], now: int, advanced: Row | None = None
    ) -> int:
        """Record one viewer revision naming ``targets``. The new presentation revision.
        ``advanced``: the row of a viewer advance the caller ran already for this revision.

        The revisions a transaction records for a run are written as one ``viewer_revisions``
        row (``_write_viewer``): the first and last revision and, per revision, what it names
        (``_encode_change``); a patch follows from the target and the revision number, so no
        patch is stored apart."""
        if not self.db.in_transaction:
            raise TetherError("Viewer changes must be recorded inside the durable state transaction")
        if not targets:
            raise TetherError("Viewer change must name at least one bounded target")
        revision, retained = self._viewer_advance(run_id, now, advanced)
        held: dict[str, dict[str, object]] = self.db.memo.setdefault("viewer_changes", {})
        batch = held.get(run_id)
        change = _encode_change(targets)
        if batch is None:
            held[run_id] = {
                "run_id": run_id,
                "first": revision,
                "last": revision,
                "changes": [change],
                "now": now,
            }
        else:
            batch["last"] = revision
            changes = batch["changes"]
            assert isinstance(changes, list)
            changes.append(change)
        self.db.defer("viewer", VIEWER_TABLES, self._write_viewer)
        if retained > 1 and retained == revision - VIEWER_RETAINED_REVISIONS + 1:
            # The window moved with this revision: the rows wholly out of it are forgotten once
            # this transaction's rows are written.
            self.db.memo.setdefault("viewer_prunes", {})[run_id] = retained
        return revision

    def _viewer_advance(self, run_id: str, now: int, advanced: Row | None = None) -> tuple[int, int]:
        """The run's presentation revision one up: the new revision and the first one its
        retention window keeps (``advanced``: the row of that advance, run by the caller).
        Advanced once already in this transaction, the row stays locked by it to its end, so
        both numbers follow from the last advance (as ``viewer_advance`` computes them), and the
        row is written once, with the last of them, when the viewer writes are sent
        (``_write_viewer``)."""
        memo = self.db.memo
        done: dict[str, tuple[int, int]] = memo.setdefault("viewer_advanced", {})
        last = done.get(run_id)
        if last is None:
            row = (
                self.db.one("viewer_advance", **self._advance_params(run_id, now))
                if advanced is None
                else advanced
            )
            if row is None:
                raise NotFound(f"Viewer projection does not exist for workflow run: {run_id}")
            revision, retained = int(row["presentation_revision"]), int(row["retained_from_revision"])
        else:
            revision = last[0] + 1
            retained = max(last[1], revision + 1 - VIEWER_RETAINED_REVISIONS)
            memo.setdefault("viewer_advances", {})[run_id] = {
                "run_id": run_id,
                "revision": revision,
                "retained": retained,
                "now": now,
            }
            self.db.defer("viewer", VIEWER_TABLES, self._write_viewer)
        done[run_id] = (revision, retained)
        return revision, retained

    def _write_viewer(self) -> None:
        """Send the viewer writes the transaction held back (``Database.defer``): each run's
        projection row at its last revision, then each run's revisions since as one row, in one
        ``run_many`` each."""
        memo = self.db.memo
        advances = memo.pop("viewer_advances", None)
        if advances:
            self.db.run_many("viewer_set", list(advances.values()))
        held = memo.pop("viewer_changes", None)
        if held:
            self.db.run_many(
                "viewer_revision_insert",
                [{**batch, "changes": canonical_bytes(batch["changes"]).decode()} for batch in held.values()],
            )
        prunes = memo.pop("viewer_prunes", None)
        if prunes:
            self.db.run_many(
                "viewer_revision_prune", [{"run_id": run, "retained": kept} for run, kept in prunes.items()]
            )

    @staticmethod
    def _advance_params(run_id: str, now: int) -> dict[str, object]:
        return {"run_id": run_id, "window": VIEWER_RETAINED_REVISIONS, "now": now}

    def _forget_advances(self) -> None:
        """Forget which resources and viewer rows this transaction advanced (after a delete:
        later writes must not count on those rows being there)."""
        self.db.memo.pop("bumped", None)
        self.db.memo.pop("viewer_advanced", None)

    def _viewer_changes(self, run_id: str, revision: int) -> ViewerChanges:
        current = self.db.one("viewer_get", run_id=run_id)
        if current is None:
            raise NotFound(f"Viewer projection does not exist for workflow run: {run_id}")
        latest = int(current["presentation_revision"])
        retained = int(current["retained_from_revision"])
        deltas: list[ViewerDelta] = []
        seen: set[int] = set()
        for row in self.db.all("viewer_revisions_after", run_id=run_id, revision=revision):
            for delta in stored_viewer_deltas(int(row["first_revision"]), row["changes"]):
                if delta.presentation_revision > revision:
                    seen.add(delta.presentation_revision)
                    deltas.append(delta)
        if (
            revision <= 0
            or revision > latest
            or revision < retained - 1
            or any(r not in seen for r in range(revision + 1, latest + 1))
        ):
            return ViewerChanges(run_id, latest, True, [], [])
        targets = list(dict.fromkeys((d.target_type, d.target_key) for d in deltas))
        return ViewerChanges(run_id, latest, False, deltas, targets)

    # -- time accounting ---------------------------------------------------------------------
    def _close_run_time(self, run_id: str) -> None:
        self.db.queue("interval_close_run", run_id=run_id)


#: How a stored viewer revision names its targets: these two sets by a number, any other as a
#: list of ``[target_type, target_key, ops]``.
_CHANGE_CODES = {BUMP_TARGETS: 0, STATUS_TARGETS: 1}
_CODED_TARGETS = {code: targets for targets, code in _CHANGE_CODES.items()}


def _encode_change(targets: Sequence[ViewerTarget]) -> Json:
    """What one viewer revision names, as stored in ``viewer_revisions.changes``."""
    if not any(t.ops for t in targets):  # (ops are dicts: only a target without ops hashes)
        code = _CHANGE_CODES.get(tuple(targets))
        if code is not None:
            return code
    return [[t.target_type, t.target_key, list(t.ops)] for t in targets]


def stored_viewer_deltas(first_revision: int, changes: str) -> list[ViewerDelta]:
    """The deltas of one ``viewer_revisions`` row, in order."""
    decoded = json.loads(changes)
    if not isinstance(decoded, list):
        raise StoreError("A stored viewer revision row does not hold a list")
    return [delta for n, change in enumerate(decoded) for delta in _decode_change(change, first_revision + n)]


def _decode_change(change: Json, revision: int) -> list[ViewerDelta]:
    """The deltas of one stored viewer revision: per target, its new revision numbers, then the
    target's ops."""
    if isinstance(change, int):
        named = [(t.target_type, t.target_key, list(t.ops)) for t in _CODED_TARGETS[change]]
    elif isinstance(change, list):
        named = [(str(t[0]), str(t[1]), list(t[2])) for t in change if isinstance(t, list)]
    else:
        raise StoreError("A stored viewer revision is neither a code nor a list of targets")
    return [ViewerDelta(revision, kind, key, _revision_ops(kind, revision) + ops) for kind, key, ops in named]


def _revision_ops(target_type: str, revision: int) -> list[Json]:
    ops: list[Json] = [{"op": "replace", "path": "/presentationRevision", "value": revision}]
    if target_type == "graph":
        ops.append({"op": "replace", "path": "/graphRevision", "value": revision})
    return ops


def viewer_targets(targets: Sequence[ViewerTarget | str]) -> tuple[ViewerTarget, ...]:
    """Validate caller-supplied viewer targets (a bare string names a target with no ops)."""
    from tether.errors import InvalidInput

    checked = []
    for target in targets:
        if isinstance(target, str):
            target = ViewerTarget(target)
        if not isinstance(target, ViewerTarget) or target.target_type not in VIEWER_TARGET_TYPES:
            raise InvalidInput(f"Viewer targets must be one of {', '.join(VIEWER_TARGET_TYPES)}")
        for op in target.ops:
            if (
                not isinstance(op, dict)
                or op.get("op") not in VIEWER_PATCH_OPS
                or not isinstance(op.get("path"), str)
            ):
                raise InvalidInput(
                    "Viewer patch operations are objects with op (add, replace, remove, append) and path"
                )
        checked.append(target)
    return tuple(checked)
