"""Retention: delete finished runs with everything recorded for them (``Store.prune``).

A run is pruned in a transaction of its own (a few statements, so no lock is held for long and
workers go on meanwhile): its run lock is taken as every writer of the run takes it, the run is
read again (still finished, in a status asked for, before the cut-off: nothing can bring a
finished run back, but the check costs nothing), and it goes only if no run points at it any
more. Then its journal entries, its effects' resources and its own resource are deleted; every
other row of the run goes with its resource (``ON DELETE CASCADE``). The blobs the pruned runs
referred to are deleted afterwards, a few per transaction, each only if no row refers to it any
more (on PostgreSQL under the blob guard, see ``sql/postgres/journal.sql``).

Restart families: a restart child points at its parent (and at its family's root). A run is
pruned only together with every later run of its family, children first; a family whose newest
run must stay keeps all of its runs that it points at.

The per-table statements live in the section "what a run owns" of ``sql/*/retention.sql``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from tether.errors import InvalidInput
from tether.store.db import Database, Row
from tether.values import parse_now

#: The queue statuses of a finished run, which ``prune`` may select.
PRUNABLE_STATUSES = ("done", "cancelled", "failed")
#: Candidate runs read per query, and blobs deleted per transaction.
CANDIDATE_BATCH = 200
BLOB_BATCH = 20


@dataclass
class PruneReport:
    """What ``Store.prune`` deleted (or, with ``dry_run``, would delete): runs, and the rows that
    went with them by kind; ``kept``: runs that matched but stay because a run that stays
    points at them (a restart child)."""

    runs: int = 0
    events: int = 0
    attempts: int = 0
    requests: int = 0
    decisions: int = 0
    effects: int = 0
    messages: int = 0
    viewer_rows: int = 0
    blobs: int = 0
    kept: int = 0
    dry_run: bool = False
    run_ids: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """The counts by name (without the run ids)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type == "int"}


def prune_arguments(
    finished_before: object, statuses: object, limit: object
) -> tuple[int, tuple[str, ...], int | None]:
    """The arguments of ``prune`` checked: the cut-off in epoch ms, the statuses, the limit."""
    if not isinstance(finished_before, datetime):
        raise InvalidInput("finished_before must be a datetime (runs that finished before it are pruned)")
    before = parse_now(finished_before)
    if isinstance(statuses, str) or not isinstance(statuses, Iterable):
        raise InvalidInput(f"statuses must be a list of finished statuses: {', '.join(PRUNABLE_STATUSES)}")
    chosen = tuple(dict.fromkeys(statuses))
    unknown = [s for s in chosen if s not in PRUNABLE_STATUSES]
    if unknown or not chosen:
        what = f"unknown status {', '.join(map(repr, unknown))}" if unknown else "no status given"
        raise InvalidInput(f"Cannot prune: {what}; the finished statuses are {', '.join(PRUNABLE_STATUSES)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInput("limit must be a whole number of at least 1 (or None: no limit)")
    return before, chosen, limit


def prune(
    db: Database,
    project_id: str | None,
    *,
    before: int,
    statuses: Sequence[str],
    limit: int | None,
    dry_run: bool,
) -> PruneReport:
    """Delete (or count, ``dry_run``) the finished runs ``Store.prune`` selects."""
    report = PruneReport(dry_run=dry_run)
    wanted = "," + ",".join(statuses) + ","
    blobs: set[bytes] = set()
    decided: set[str] = set()
    cursor: tuple[int, str] = (-1, "")
    while limit is None or report.runs < limit:
        candidates = db.all(
            "prune_candidates",
            before=before,
            after_at=cursor[0],
            after_id=cursor[1],
            statuses=wanted,
            project_id=project_id,
            limit=CANDIDATE_BATCH,
        )
        if not candidates:
            break
        cursor = (int(candidates[-1]["finished_at"]), str(candidates[-1]["run_id"]))
        for candidate in candidates:
            if candidate["run_id"] in decided:
                continue
            family = db.all("prune_family", root_run_id=candidate["root_run_id"])
            going = _family_going(family, before, statuses, project_id)
            decided.update(str(r["run_id"]) for r in family)
            report.kept += sum(
                1 for r in family if r["run_id"] not in going and _matches(r, before, statuses, project_id)
            )
            # Children first: a run goes only once nothing points at it.
            for run_id in going:
                if limit is not None and report.runs >= limit:
                    break
                if _prune_run(db, run_id, before, statuses, report, blobs, dry_run):
                    report.runs += 1
                    report.run_ids.append(run_id)
                else:
                    report.kept += 1
    if not dry_run:
        report.blobs = _prune_blobs(db, sorted(blobs))
    return report


def _matches(row: Row, before: int, statuses: Sequence[str], project_id: str | None) -> bool:
    finished = row["finished_at"]
    return (
        row["status"] in statuses
        and finished is not None
        and int(finished) < before
        and (project_id is None or row["project_id"] == project_id)
    )


def _family_going(
    family: list[Row], before: int, statuses: Sequence[str], project_id: str | None
) -> list[str]:
    """The runs of a restart family that go, newest first: the longest run of matching runs at
    the chain's end (every run after one that goes goes too, so nothing that stays points at it)."""
    going: list[str] = []
    for row in reversed(family):
        if not _matches(row, before, statuses, project_id):
            break
        going.append(str(row["run_id"]))
    return going


def _prune_run(
    db: Database,
    run_id: str,
    before: int,
    statuses: Sequence[str],
    report: PruneReport,
    blobs: set[bytes],
    dry_run: bool,
) -> bool:
    """Delete one run in a transaction of its own (read-only with ``dry_run``); whether it went."""
    with db.transaction(write=not dry_run):
        row = db.one("prune_run_lock", run_id=run_id)
        if row is None:
            return False  # deleted meanwhile
        finished = row["finished_at"]
        if row["status"] not in statuses or finished is None or int(finished) >= before:
            return False
        if db.one("prune_pointed_at", run_id=run_id) is not None:
            return False
        resource_id = row["resource_id"]
        counts = db.one("prune_run_counts", run_id=run_id, resource_id=resource_id)
        assert counts is not None
        _add_counts(report, counts)
        if dry_run:
            return True
        blobs.update(
            bytes(r["blob_hash"]) for r in db.all("prune_run_blobs", run_id=run_id, resource_id=resource_id)
        )
        db.run("prune_delete_events", resource_id=resource_id)
        db.run("prune_delete_effect_resources", resource_id=resource_id)
        if db.run("prune_delete_run", resource_id=resource_id) != 1:
            raise AssertionError(f"run {run_id} was read under its lock but its resource is gone")
        db.notify("runs")
        return True


def _add_counts(report: PruneReport, counts: Row) -> None:
    for name in ("events", "attempts", "requests", "decisions", "effects", "messages", "viewer_rows"):
        setattr(report, name, getattr(report, name) + int(counts[name]))


def _prune_blobs(db: Database, candidates: list[bytes]) -> int:
    """Delete the candidate blobs no row refers to, ``BLOB_BATCH`` per transaction: how many.
    Each transaction counts one blob prune (``blob_prunes``), so that stores that remember blobs
    as stored stop trusting that."""
    deleted = 0
    for start in range(0, len(candidates), BLOB_BATCH):
        with db.transaction():
            db.one("prune_blob_guard")
            db.run("blob_prunes_bump")
            for digest in candidates[start : start + BLOB_BATCH]:
                deleted += db.run("prune_blob_delete", hash=digest)
    return deleted


def to_report_dict(report: PruneReport) -> dict[str, Any]:
    """The report as the CLI prints it with ``--json``."""
    return {**report.counts(), "dry_run": report.dry_run, "run_ids": list(report.run_ids)}
