"""Schedules declared on a workflow: ``Workflow(..., schedules=[Schedule("0 9 * * 1-5",
tz="Europe/Paris", input={...})])``.

A declared schedule is stored as ``<workflow>:<name>`` (its ``name``, or its position in the
list), so it never collides with one added at run time (``tether schedule add``, whose names
have no ``:``). Declared schedules belong to the code: a worker that loads the workflow writes
them as declared (``Store.schedules_declare``): a new one is due from its next tick, a changed
one (cron, zone, input or catch-up policy) starts over from its next tick, an unchanged one keeps
its next tick and its pause, and a declared schedule the code no longer has is deleted. A
schedule is not part of the workflow's definition digest: changing one changes no run's
definition.

The arithmetic (cron, zones, catch-up) is ``tether.cron``; the rows are ``tether.store.schedules``;
the workers fire the due ticks in ``tether.engine.worker.scheduling``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tether.cron import CatchUp, check_catch_up, check_cron, check_name, check_zone
from tether.errors import InvalidInput
from tether.store.schedules import ScheduleSpec
from tether.values import Json, require_json

__all__ = ["CatchUp", "Schedule", "check_declared", "declared_specs"]


@dataclass(frozen=True)
class Schedule:
    """A cron schedule declared on a workflow: ``cron`` (five fields: minute, hour, day of
    month, month, day of week) read in the time zone ``tz`` (an IANA name such as
    ``Europe/Paris``), the ``input`` each of its runs gets, an optional ``name`` (else its
    position in the workflow's list) and the ``catch_up`` policy for ticks missed while no worker
    ran: ``"skip"`` (the default: no run for them) or ``"one"`` (one run for all of them)."""

    cron: str
    tz: str = "UTC"
    input: Json = None
    name: str | None = None
    catch_up: str = CatchUp.SKIP

    def __post_init__(self) -> None:
        check_cron(self.cron)
        check_zone(self.tz)
        check_catch_up(self.catch_up)
        if self.name is not None:
            check_name(self.name)
        require_json("schedule input", self.input)


def check_declared(workflow: str, schedules: object) -> tuple[Schedule, ...]:
    """The schedules declared on a workflow, checked: Schedule objects with distinct names."""
    if isinstance(schedules, str | bytes) or not isinstance(schedules, Sequence):
        raise InvalidInput(f"Workflow {workflow}: schedules must be a list of Schedule objects")
    found: list[Schedule] = []
    names: set[str] = set()
    for index, schedule in enumerate(schedules):
        if not isinstance(schedule, Schedule):
            raise InvalidInput(
                f"Workflow {workflow}: schedules must be Schedule objects, not {type(schedule).__name__}"
            )
        name = _declared_name(workflow, schedule, index)
        if name in names:
            raise InvalidInput(f"Workflow {workflow} declares two schedules named {name}")
        names.add(name)
        found.append(schedule)
    return tuple(found)


def declared_specs(workflow: str, schedules: Sequence[Schedule]) -> list[ScheduleSpec]:
    """The rows the schedules declared on ``workflow`` are stored as."""
    return [
        ScheduleSpec(
            name=_declared_name(workflow, schedule, index),
            workflow_name=workflow,
            cron=schedule.cron,
            timezone=schedule.tz,
            input=schedule.input,
            catch_up=str(schedule.catch_up),
        )
        for index, schedule in enumerate(schedules)
    ]


def _declared_name(workflow: str, schedule: Schedule, index: int) -> str:
    return f"{workflow}:{schedule.name if schedule.name is not None else index}"
