"""Concurrency limits in the store: the limit a run counts against, the claim-time re-count of a
key's slots, and why a run waits for one.

A run started under a limit carries its ``limit_key`` (its workflow's name and, for a per-key
limit, the key's label and value, as ``Limit.key_of`` computed them when the run was started) and
the cap ``limit_max`` in its queue row. It holds one of the key's slots while a runner holds its
lease: from its claim until it is parked, finished or handed back, or its lease lapses (a crashed
worker's slot frees with its lease). A run parked for a person, a sleep or a retry's backoff holds
none.

``run_claim_next`` skips a run whose key has no free slot. That read alone can race on
PostgreSQL (READ COMMITTED: two claimers of one key each count the slots before the other's claim
commits), so a claim of a limited run re-counts under the key's advisory lock (``slot_free``):
claims of one key are serialized, claims of other keys and of unlimited runs are not, and a
workflow without a limit sends no statement more.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tether.errors import InvalidInput
from tether.store.db import Database, Row
from tether.values import canonical_json

#: At most this many characters in a limit key (its workflow name, label and value).
KEY_LIMIT = 512
#: The largest cap a limit may set.
MAX_LIMIT = 1_000_000
_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}(:.+)?", re.DOTALL)


@dataclass(frozen=True)
class RunLimit:
    """The limit a run counts against: ``key`` (``workflow`` or ``workflow:label=value``) and its
    cap ``max``."""

    key: str
    max: int

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or len(self.key) > KEY_LIMIT or not _KEY.fullmatch(self.key):
            raise InvalidInput(
                f"limit key must be a workflow name, optionally followed by ':' and a label "
                f"({KEY_LIMIT} characters at most)"
            )
        if isinstance(self.max, bool) or not isinstance(self.max, int) or not 1 <= self.max <= MAX_LIMIT:
            raise InvalidInput(f"limit max must be a whole number from 1 to {MAX_LIMIT}")

    @property
    def label(self) -> str:
        """The key as a person reads it: ``customer_id=acme``, or the workflow's name for a
        limit on the whole workflow."""
        return label_of(self.key)


@dataclass(frozen=True)
class SlotWait:
    """A run that waits for a slot of its limit: ``held`` of its ``limit.max`` slots are held by
    other runs."""

    run_id: str
    limit: RunLimit
    held: int

    @property
    def text(self) -> str:
        return f"waiting for a slot of {self.limit.label} ({self.held} of {self.limit.max} in use)"


def label_of(key: str) -> str:
    workflow, _, label = key.partition(":")
    return label or f"workflow {workflow}"


def queue_columns(limit: RunLimit | None) -> dict[str, object]:
    """The queue row's limit columns for a new run (both NULL without a limit)."""
    if limit is not None and not isinstance(limit, RunLimit):
        raise InvalidInput("limit must be a RunLimit or None")
    return {
        "limit_key": None if limit is None else limit.key,
        "limit_max": None if limit is None else limit.max,
    }


def slot_free(db: Database, candidate: Row, now: int) -> bool:
    """Whether the ``candidate`` run (a row with its run id, project, limit key and cap: one of
    ``run_claim_next`` or ``run_row``) may take a slot of its limit now. Called inside the
    claim's write transaction; on PostgreSQL it takes the key's advisory lock, held to the
    transaction's end, so no other claim of the key counts meanwhile; False, without waiting,
    while another transaction holds it."""
    if candidate["limit_key"] is None:
        return True
    key = {"project_id": candidate["project_id"], "limit_key": candidate["limit_key"]}
    locked = db.one("limit_lock", **key)
    if locked is None or not locked["locked"]:
        return False  # another claim of the key is under way: the run waits for the next round
    row = db.one("limit_slots_held", **key, run_id=candidate["run_id"], now=now)
    return row is not None and int(row["held"]) < int(candidate["limit_max"])


def slot_waits(db: Database, run_ids: Sequence[str], now: int) -> dict[str, SlotWait]:
    """Of these runs, those that count against a limit whose slots other runs all hold, by run id
    (read only; whether each also waits for nothing else is the caller's to judge)."""
    if not run_ids:
        return {}
    rows = db.all("limit_waits", run_ids=canonical_json(list(run_ids)), now=now)
    found: dict[str, SlotWait] = {}
    for row in rows:
        limit = RunLimit(row["limit_key"], int(row["limit_max"]))
        if int(row["held"]) >= limit.max:
            found[row["run_id"]] = SlotWait(row["run_id"], limit, int(row["held"]))
    return found
