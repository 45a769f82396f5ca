"""Cron arithmetic for schedules: checking a cron expression, a time zone and a catch-up policy,
the ticks of a schedule, what a worker does with a schedule that is due (``plan``), and the run
id of a tick.

Nothing here reads a clock: every function is given the instant it judges by (the store's clock,
so that every worker of a shared database judges due ticks alike). Instants are epoch
milliseconds; a cron expression is read in its schedule's time zone (daylight saving followed:
``0 9 * * *`` in ``Europe/Paris`` is 09:00 Paris time in winter and in summer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter

from tether.errors import InvalidInput

#: A schedule's own name: what a user types after ``tether schedule pause``.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,79}")
#: A tick fired at most this late is on time; one later than that was missed (no worker was up,
#: or none had the workflow loaded), and the catch-up policy decides.
ON_TIME_MS = 60_000
#: At most this many missed tick times are listed in a catch-up run's launch options.
MISSED_LISTED = 100
#: How far ahead ticks are looked for: a cron that never matches (``0 0 31 2 *``) is refused.
HORIZON_YEARS = 5


class CatchUp(StrEnum):
    """What a schedule does with the ticks it missed while no worker fired it."""

    SKIP = "skip"  #: no run for missed ticks; the next tick to come is scheduled
    ONE = "one"  #: one run for all the missed ticks (the latest), naming them all


@dataclass(frozen=True)
class FirePlan:
    """What a worker does with a due schedule: start a run for ``tick`` (None: start nothing),
    naming the ``missed`` ticks before it (the latest ``MISSED_LISTED``) and how many were
    missed in all; the schedule is next due at ``next_due``."""

    tick: int | None
    missed: tuple[int, ...]
    missed_count: int
    next_due: int


def check_name(name: object) -> str:
    """A schedule name as a user gives it."""
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise InvalidInput(
            f"Invalid schedule name {name!r}: use a letter or digit, then letters, digits, _ or - "
            "(at most 80 characters)"
        )
    return name


def check_cron(cron: object) -> str:
    """A cron expression of five fields that matches at least once in the coming years."""
    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise InvalidInput(
            f"Invalid cron expression {cron!r}: give five fields, minute hour day-of-month month "
            "day-of-week (for example '0 9 * * 1-5': 09:00 on weekdays)"
        )
    try:
        valid = bool(croniter.is_valid(cron))
    except Exception:  # croniter raises assorted errors on odd input
        valid = False
    if not valid:
        raise InvalidInput(
            f"Invalid cron expression {cron!r}: a field is out of range or malformed (minute 0-59, "
            "hour 0-23, day 1-31, month 1-12, weekday 0-6; *, lists, ranges and /steps)"
        )
    try:
        next_tick(cron, "UTC", 0)
    except InvalidInput:
        raise InvalidInput(
            f"Invalid cron expression {cron!r}: it matches no date (a day the month never has?)"
        ) from None
    return cron


def check_zone(tz: object) -> str:
    """An IANA time zone name this system knows."""
    if not isinstance(tz, str) or not tz or tz != tz.strip():
        raise InvalidInput("The time zone must be an IANA name such as UTC or Europe/Paris")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        close = sorted(z for z in available_timezones() if z.lower() == tz.lower())
        hint = f" (did you mean {close[0]}?)" if close else " such as UTC or Europe/Paris"
        raise InvalidInput(f"Unknown time zone {tz!r}: give an IANA name{hint}") from None
    return tz


def check_catch_up(catch_up: object) -> str:
    if catch_up not in tuple(CatchUp):
        raise InvalidInput(
            f"Invalid catch-up policy {catch_up!r}: 'skip' (no run for missed ticks) or 'one' "
            "(one run for all missed ticks)"
        )
    return str(catch_up)


def next_tick(cron: str, tz: str, after_ms: int) -> int:
    """The first tick of ``cron`` in zone ``tz`` strictly after ``after_ms``."""
    try:
        zone = ZoneInfo(tz)
        after = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(zone)
        found = croniter(cron, after).get_next(datetime)
    except (ZoneInfoNotFoundError, ValueError, KeyError, ArithmeticError) as error:
        # A zone this system no longer knows, a cron croniter gives up on: the caller's refusal.
        raise InvalidInput(f"Cannot compute the next tick of {cron!r} in {tz}: {error}") from None
    if found.year > after.year + HORIZON_YEARS:
        raise InvalidInput(f"The cron expression {cron!r} matches no date in the next {HORIZON_YEARS} years")
    return int(found.timestamp() * 1000)


def plan(cron: str, tz: str, catch_up: str, due: int, now: int) -> FirePlan:
    """What to do with a schedule next due at ``due`` (at most ``now``): the latest tick at or
    before ``now`` is the one to run, the ticks before it were missed. ``skip`` runs the latest
    tick only when it is on time (at most ``ON_TIME_MS`` late); ``one`` runs it in any case,
    naming the missed ones. Either way the schedule is next due at the first tick after ``now``."""
    ticks = [due]
    missed_count = 0
    following = next_tick(cron, tz, due)
    while following <= now:
        missed_count += 1
        ticks.append(following)
        if len(ticks) > MISSED_LISTED + 1:
            ticks.pop(0)
        following = next_tick(cron, tz, following)
    latest = ticks[-1]
    if catch_up == CatchUp.SKIP and now - latest > ON_TIME_MS:
        return FirePlan(None, tuple(ticks), missed_count + 1, following)
    return FirePlan(latest, tuple(ticks[:-1]), missed_count, following)


def tick_run_id(schedule_name: str, tick_ms: int) -> str:
    """The run id of a schedule's tick: the same for every worker, so that a tick starts one run
    (``sched-<name>-<UTC time>``; the ``:`` of a declared schedule's name becomes ``.``)."""
    stamp = datetime.fromtimestamp(tick_ms / 1000, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"sched-{schedule_name.replace(':', '.')}-{stamp}"


def iso(ms: int) -> str:
    """An instant as ISO 8601 UTC text (``2026-03-30T07:00:00Z``)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")
