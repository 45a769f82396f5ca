"""Schedules: cron schedules in a time zone that start runs of a workflow (``schedules`` table).

Each schedule row holds the instant its next tick is due (``next_due_at``, judged by the store's
clock). A worker fires a due tick in one transaction: ``schedule_advance`` moves ``next_due_at``
on by compare-and-set (``WHERE next_due_at = <the instant it read>``), and only when that wrote
the row does the worker reserve the tick's run in the same transaction. Two workers racing the
same tick: on SQLite the second transaction starts after the first committed; on PostgreSQL the
second update waits for the first's row lock and then finds the row moved on. Either way one
advance writes and one run is reserved; the run id is the schedule's name and the tick
(``tether.cron.tick_run_id``), so even a reservation repeated after an unknown commit adopts the
same run.

Rows come from two places (``origin``): ``declared`` on a workflow in code (written by the
workers that load it, ``schedules_declare``) and ``added`` at run time (``schedule_add``). See
``tether.engine.schedules`` for how the two coexist.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from tether.cron import check_catch_up, check_cron, check_name, check_zone, next_tick
from tether.errors import Conflict, InvalidInput, NotFound, ProjectNotRegistered
from tether.store.db import Database, Row
from tether.values import Json, canonical_json, parse_now, require_json, require_text, to_datetime

#: Due schedules a worker reads per sweep.
DUE_BATCH = 20


@dataclass(frozen=True)
class ScheduleSpec:
    """What a schedule is: its name, workflow, cron expression, time zone, the input each run
    gets, and the catch-up policy (``skip`` or ``one``)."""

    name: str
    workflow_name: str
    cron: str
    timezone: str
    input: Json
    catch_up: str


@dataclass(frozen=True)
class ScheduleRecord:
    """A stored schedule: its spec, where it came from (``declared`` or ``added``), whether it
    is paused, when its next tick is due, and the last tick it fired with its run."""

    name: str
    workflow_name: str
    origin: str
    cron: str
    timezone: str
    input: Json
    catch_up: str
    paused: bool
    next_due_at: datetime
    last_tick_at: datetime | None
    last_run_id: str | None
    created_at: datetime
    updated_at: datetime


def _record(row: Row) -> ScheduleRecord:
    return ScheduleRecord(
        name=row["name"],
        workflow_name=row["workflow_name"],
        origin=row["origin"],
        cron=row["cron"],
        timezone=row["timezone"],
        input=json.loads(row["input_json"]),
        catch_up=row["catch_up"],
        paused=bool(row["paused"]),
        next_due_at=to_datetime(int(row["next_due_at"])),
        last_tick_at=to_datetime(None if row["last_tick_at"] is None else int(row["last_tick_at"])),
        last_run_id=row["last_run_id"],
        created_at=to_datetime(int(row["created_at"])),
        updated_at=to_datetime(int(row["updated_at"])),
    )


def check_spec(spec: ScheduleSpec, *, declared: bool) -> str:
    """The spec checked (a refused spec writes nothing); its input as canonical JSON."""
    if not isinstance(spec, ScheduleSpec):
        raise InvalidInput("A schedule must be given as a ScheduleSpec")
    name = require_text("schedule name", spec.name)
    if declared:
        workflow, colon, own = name.partition(":")
        if not colon or workflow != spec.workflow_name:
            raise InvalidInput(f"A declared schedule's name is <workflow>:<name>, not {name!r}")
        check_name(own)
    else:
        check_name(name)
    require_text("workflow name", spec.workflow_name)
    check_cron(spec.cron)
    check_zone(spec.timezone)
    check_catch_up(spec.catch_up)
    require_json("schedule input", spec.input)
    return canonical_json(spec.input)


class ScheduleOps:
    """The schedule rows of the store's project (see the module docstring)."""

    db: Database
    project_id: str | None

    def _schedule_now(self, now: datetime | str | None) -> int:
        return self.db.now_ms() if now is None else parse_now(now)

    def _require_project(self) -> str:
        if self.project_id is None:
            raise ProjectNotRegistered("Schedules belong to a project: open the store with a project")
        return self.project_id

    def schedule_add(self, spec: ScheduleSpec, *, now: datetime | str | None = None) -> ScheduleRecord:
        """Add a schedule at run time (origin ``added``), due at its first tick after ``now``
        (the store's clock). ``Conflict`` when the name is taken (nothing is written)."""
        input_json = check_spec(spec, declared=False)
        project_id = self._require_project()
        with self.db.transaction():
            at = self._schedule_now(now)
            if self.db.one("schedule_get", project_id=project_id, name=spec.name) is not None:
                raise Conflict(
                    f"A schedule named {spec.name} exists already: remove it first, or choose another --name"
                )
            self.db.run(
                "schedule_insert",
                project_id=project_id,
                name=spec.name,
                workflow_name=spec.workflow_name,
                origin="added",
                cron=spec.cron,
                timezone=spec.timezone,
                input_json=input_json,
                catch_up=spec.catch_up,
                next_due_at=next_tick(spec.cron, spec.timezone, at),
                now=at,
            )
            found = self.db.one("schedule_get", project_id=project_id, name=spec.name)
            assert found is not None
            return _record(found)

    def schedules_declare(
        self, workflow_name: str, specs: Sequence[ScheduleSpec], *, now: datetime | str | None = None
    ) -> list[str]:
        """Write the schedules a workflow's code declares, in one transaction: new ones are due
        from their next tick, changed ones start over from their next tick, unchanged ones keep
        their next tick and their pause, declared ones the code no longer has are deleted. The
        names of the schedules written or deleted."""
        require_text("workflow name", workflow_name)
        checked = [(spec, check_spec(spec, declared=True)) for spec in specs]
        if any(spec.workflow_name != workflow_name for spec, _ in checked):
            raise InvalidInput(f"Every schedule declared on {workflow_name} must name that workflow")
        project_id = self._require_project()
        changed: list[str] = []
        with self.db.transaction():
            at = self._schedule_now(now)
            stored = {
                row["name"]: row
                for row in self.db.all(
                    "schedules_declared", project_id=project_id, workflow_name=workflow_name
                )
            }
            for spec, input_json in checked:
                values = {
                    "project_id": project_id,
                    "name": spec.name,
                    "cron": spec.cron,
                    "timezone": spec.timezone,
                    "input_json": input_json,
                    "catch_up": spec.catch_up,
                    "next_due_at": next_tick(spec.cron, spec.timezone, at),
                    "now": at,
                }
                row = stored.pop(spec.name, None)
                if row is None:
                    existing = self.db.one("schedule_get", project_id=project_id, name=spec.name)
                    if existing is not None:
                        raise Conflict(f"Schedule {spec.name} exists already and was not declared by code")
                    if self.db.run(
                        "schedule_insert", workflow_name=workflow_name, origin="declared", **values
                    ):
                        changed.append(spec.name)
                elif (row["cron"], row["timezone"], row["input_json"], row["catch_up"]) != (
                    spec.cron,
                    spec.timezone,
                    input_json,
                    spec.catch_up,
                ):
                    self.db.run("schedule_redeclare", **values)
                    changed.append(spec.name)
            for name in stored:
                self.db.run("schedule_delete", project_id=project_id, name=name)
                changed.append(name)
        return changed

    def schedule(self, name: str) -> ScheduleRecord | None:
        """The schedule of that name, or None."""
        require_text("schedule name", name)
        row = self.db.one("schedule_get", project_id=self.project_id, name=name)
        return None if row is None else _record(row)

    def schedules(self, *, workflow_name: str | None = None) -> list[ScheduleRecord]:
        """The project's schedules by name (every project's in the global view), with
        ``workflow_name`` only that workflow's."""
        found = [_record(row) for row in self.db.all("schedules_list", project_id=self.project_id)]
        return [s for s in found if workflow_name is None or s.workflow_name == workflow_name]

    def schedule_set_paused(self, name: str, paused: bool, *, now: datetime | str | None = None) -> bool:
        """Pause a schedule (it fires nothing), or resume it: due again at its first tick after
        ``now``, so ticks that passed while it was paused start nothing. Whether it changed
        (False: it was so already). ``NotFound`` for an unknown name."""
        require_text("schedule name", name)
        if not isinstance(paused, bool):
            raise InvalidInput("paused must be True or False")
        project_id = self._require_project()
        with self.db.transaction():
            at = self._schedule_now(now)
            row = self.db.one("schedule_get", project_id=project_id, name=name)
            if row is None:
                raise NotFound(f"Schedule not found: {name} (`tether schedule list` shows them)")
            next_due = int(row["next_due_at"]) if paused else next_tick(row["cron"], row["timezone"], at)
            return (
                self.db.run(
                    "schedule_set_paused",
                    project_id=project_id,
                    name=name,
                    paused=int(paused),
                    next_due_at=next_due,
                    now=at,
                )
                == 1
            )

    def schedule_remove(self, name: str) -> None:
        """Delete a schedule added at run time (the runs it started stay). A declared schedule is
        refused (``Conflict``): it belongs to the workflow's code (pause it, or remove it from
        the code). ``NotFound`` for an unknown name."""
        require_text("schedule name", name)
        project_id = self._require_project()
        with self.db.transaction():
            row = self.db.one("schedule_get", project_id=project_id, name=name)
            if row is None:
                raise NotFound(f"Schedule not found: {name} (`tether schedule list` shows them)")
            if row["origin"] == "declared":
                raise Conflict(
                    f"Schedule {name} is declared by workflow {row['workflow_name']}'s code: remove it "
                    f"there (or pause it: tether schedule pause {name})"
                )
            self.db.run("schedule_delete", project_id=project_id, name=name)

    def schedules_due(
        self, *, workflow_names: Sequence[str], now: datetime | str | None = None, limit: int = DUE_BATCH
    ) -> list[ScheduleRecord]:
        """The schedules of these workflows due at ``now`` (the store's clock) and not paused,
        the longest overdue first."""
        if not workflow_names or self.project_id is None:
            return []
        rows = self.db.all(
            "schedules_due",
            project_id=self.project_id,
            workflows=json.dumps(list(workflow_names)),
            now=self._schedule_now(now),
            limit=limit,
        )
        return [_record(row) for row in rows]

    def schedules_next_due(self, *, workflow_names: Sequence[str]) -> datetime | None:
        """When the next of these workflows' schedules that are not paused is due (None: none)."""
        if not workflow_names or self.project_id is None:
            return None
        row = self.db.one(
            "schedules_next_due", project_id=self.project_id, workflows=json.dumps(list(workflow_names))
        )
        value = None if row is None else row["next_due_at"]
        return None if value is None else to_datetime(int(value))

    def schedule_advance(
        self,
        *,
        name: str,
        expected_due: datetime,
        next_due: datetime,
        tick: datetime | None = None,
        run_id: str | None = None,
        now: datetime | str | None = None,
    ) -> bool:
        """Compare-and-set: move the schedule due at ``expected_due`` on to ``next_due``,
        recording ``tick`` and its ``run_id`` when a run is started for it. False (nothing
        written) when the schedule is no longer due then: another worker fired the tick, or it
        was paused, changed or removed. Called in the transaction that reserves the tick's run,
        before the reservation (so a worker that lost the race reserves nothing)."""
        require_text("schedule name", name)
        project_id = self._require_project()
        expected, following = parse_now(expected_due), parse_now(next_due)
        if following <= expected:
            raise InvalidInput("A schedule's next tick must come after the one it replaces")
        with self.db.transaction():
            return (
                self.db.run(
                    "schedule_advance",
                    project_id=project_id,
                    name=name,
                    expected=expected,
                    next_due_at=following,
                    tick=None if tick is None else parse_now(tick),
                    run_id=run_id,
                    now=self._schedule_now(now),
                )
                == 1
            )
