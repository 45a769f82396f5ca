"""What the console reads from the store, shaped for the API and the pages.

Only ``tether.client.Tether`` and the store's public reads are used. Records become plain JSON
(datetimes as ISO 8601 in UTC); claim tokens and other claim details never leave the process.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from tether.client import Tether
from tether.clioutput import statuses, waits_for_an_event
from tether.describe import message_words, progress_text
from tether.engine.graph import is_item
from tether.errors import InvalidInput, NotFound
from tether.store import Progress, RunView
from tether.store.states import QUEUE_TERMINAL

#: Fields no response carries (the claim's secret and its bookkeeping).
HIDDEN_FIELDS = frozenset({"claim_token", "claim_generation", "claim_expires_at"})
#: How many runs a filtered list looks through (newest first) before it stops.
FILTER_SCAN_LIMIT = 5000
MAX_PAGE = 500
#: The runs list's filter for runs parked at a ``wait_for_event`` node (not a queue status).
WAITING_FOR_EVENT = "waiting_for_event"


def plain(value: Any) -> Any:
    """A record (or a list, dict, datetime) as JSON-ready values."""
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.name not in HIDDEN_FIELDS
        }
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def page_numbers(offset: str | None, limit: str | None) -> tuple[int, int]:
    try:
        first = int(offset or 0)
        size = int(limit or 50)
    except ValueError:
        raise InvalidInput("offset and limit must be whole numbers") from None
    if first < 0 or not 1 <= size <= MAX_PAGE:
        raise InvalidInput(f"offset must not be negative and limit must be 1 to {MAX_PAGE}")
    return first, size


def list_runs(
    tether: Tether,
    *,
    status: str | None = None,
    workflow: str | None = None,
    search: str | None = None,
    offset: int = 0,
    limit: int = 50,
) -> dict[str, Any]:
    """Runs newest first, filtered by queue status (or ``WAITING_FOR_EVENT``: the runs parked
    at a ``wait_for_event`` node), workflow name and a text in the run id. Each run carries its
    human status (``summary``, as ``tether runs`` says it, and the ``action`` acting on it).

    Without a filter this is one page of the store's list. With one, the newest
    ``FILTER_SCAN_LIMIT`` runs are looked through (``truncated`` says when there were more)."""
    store = tether.store
    if not (status or workflow or search):
        page = store.list_run_views(offset=offset, limit=limit)
        return {
            "total": page.total,
            "revision": page.revision,
            "truncated": False,
            "runs": described(tether, page.runs),
        }
    needle = (search or "").lower()
    matched: list[RunView] = []
    scanned = 0
    revision = store.list_revision().revision
    total = 0
    while scanned < FILTER_SCAN_LIMIT:
        page = store.list_run_views(offset=scanned, limit=MAX_PAGE)
        total = page.total
        if scanned == 0:
            revision = page.revision
        for view in page.runs:
            if status == WAITING_FOR_EVENT:
                if not waits_for_an_event(tether, view):
                    continue
            elif status and view.status != status and view.run_state_status != status:
                continue
            if workflow and view.workflow_name != workflow:
                continue
            if needle and needle not in view.run_id.lower():
                continue
            matched.append(view)
        scanned += len(page.runs)
        if len(page.runs) < MAX_PAGE:
            break
    return {
        "total": len(matched),
        "revision": revision,
        "truncated": scanned < total,
        "runs": described(tether, matched[offset : offset + limit]),
    }


def described(tether: Tether, runs: list[RunView]) -> list[dict[str, Any]]:
    """The runs as JSON, each with its human status: ``summary`` (what it waits for, as the
    command line says it) and ``action`` (the command acting on it, if any)."""
    found = statuses(tether, runs)
    return [{**plain(v), "summary": found[v.run_id].text, "action": found[v.run_id].action} for v in runs]


def require_view(tether: Tether, run_id: str) -> RunView:
    view = tether.store.get_run_view(run_id)
    if view is None:
        raise NotFound(f"Workflow run not found: {run_id}")
    return view


def steps_of(
    tether: Tether, view: RunView, attempts: list[Any], progress: dict[str, Progress] | None = None
) -> list[dict[str, Any]]:
    """The run's nodes with the state of each one's latest attempt: the workflow's nodes in
    definition order when this console knows the same definition, else the nodes attempted. A
    running step carries its latest progress report (``progress``, by node id)."""
    latest: dict[str, Any] = {}
    counts: dict[str, int] = {}
    items: dict[str, set[str]] = {}
    for attempt in attempts:
        if is_item(attempt.node_id):
            # A fan-out's item (``each[7]``): counted under its node, not listed as a step.
            if attempt.status == "completed":
                items.setdefault(attempt.node_id.partition("[")[0], set()).add(attempt.node_id)
            continue
        latest[attempt.node_id] = attempt
        counts[attempt.node_id] = counts.get(attempt.node_id, 0) + 1
    nodes: list[tuple[str, str]] = []
    edges: dict[str, Any] = {}
    if view.workflow_name in tether.registry:
        definition = tether.registry.get(view.workflow_name)
        if definition.digest == view.definition_digest:
            snapshot = definition.snapshot()
            raw_nodes = snapshot["nodes"]
            assert isinstance(raw_nodes, dict)
            nodes = [
                (str(k), str(v.get("kind", "")) if isinstance(v, dict) else "") for k, v in raw_nodes.items()
            ]
            raw_edges = snapshot["edges"]
            edges = dict(raw_edges) if isinstance(raw_edges, dict) else {}
    known = {n for n, _ in nodes}
    for attempt in attempts:
        if attempt.node_id not in known and not is_item(attempt.node_id):
            known.add(attempt.node_id)
            nodes.append((attempt.node_id, ""))
    steps = []
    for node_id, kind in nodes:
        attempt = latest.get(node_id)
        report = (progress or {}).get(node_id)
        live = (
            report is not None
            and attempt is not None
            and attempt.status == "running"
            and report.attempt == attempt.attempt_number
        )
        steps.append(
            {
                "node_id": node_id,
                "kind": kind,
                "state": attempt.status if attempt is not None else "not_started",
                "attempts": counts.get(node_id, 0),
                "exit_name": attempt.exit_name if attempt is not None else None,
                "output": plain(attempt.output) if attempt is not None else None,
                "error_message": attempt.error_message if attempt is not None else None,
                "next": [v for k, v in edges.items() if k == node_id or k.startswith(node_id + ".")],
                "progress": progress_text(report) if live and report is not None else None,
                "fraction": report.fraction if live and report is not None else None,
                "items_done": len(items.get(node_id, ())) if node_id in items else None,
            }
        )
    return steps


def conversation_of(tether: Tether, run_id: str) -> list[dict[str, Any]]:
    """The run's agent conversations, message by message, in words (as ``tether show
    --conversation`` says them)."""
    found = []
    for message in tether.conversation(run_id):
        who, what, tokens = message_words(message)
        found.append(
            {
                "node_id": message.node_id,
                "conversation": message.conversation,
                "index": message.index,
                "who": who,
                "what": what,
                "tokens": tokens,
                "at": message.at.isoformat(),
            }
        )
    return found


def live_text_of(tether: Tether, run_id: str) -> list[dict[str, Any]]:
    """The text the run's agent steps' models are streaming in turns not recorded yet (a live
    view: the recorded turn replaces it in ``conversation``)."""
    return [
        {
            "node_id": live.node_id,
            "conversation": live.conversation,
            "index": live.index,
            "text": live.text,
            "at": live.at.isoformat(),
        }
        for live in tether.live_text(run_id).values()
    ]


def run_detail(tether: Tether, run_id: str) -> dict[str, Any]:
    """A run with its steps, attempts, result, and what waits for people."""
    view = require_view(tether, run_id)
    attempts = tether.store.attempts(run_id)
    result = tether.result(run_id)
    record = tether.store.get_run(run_id)
    status = statuses(tether, [view])[view.run_id]
    wait = tether.store.event_wait(run_id) if waits_for_an_event(tether, view) else None
    return {
        "run": {**plain(view), "summary": status.text, "action": status.action},
        "input": None if record is None else plain(record.input),
        "waiting_for_event": None if wait is None else plain(wait),
        "finished": view.status in QUEUE_TERMINAL,
        "result": plain(result),
        "steps": steps_of(tether, view, attempts, tether.progress(run_id)),
        "conversation": conversation_of(tether, run_id),
        "live_text": [] if view.status in QUEUE_TERMINAL else live_text_of(tether, run_id),
        "attempts": plain(attempts),
        "decisions": plain(tether.store.decisions(run_id=run_id)),
        "requests": plain(tether.store.requests(run_id=run_id)),
        "effects": plain(tether.store.effects(run_id=run_id)),
    }


def inbox(tether: Tether) -> dict[str, Any]:
    """Everything that waits for a person: open decisions, pending input requests, ambiguous
    effects. Runs waiting for an event wait for a system, not a person: they are not here but
    in the runs list (its ``WAITING_FOR_EVENT`` filter)."""
    return {
        "decisions": plain(tether.decisions(open_only=True)),
        "requests": plain(tether.store.requests(status="pending")),
        "effects": plain(tether.store.effects(status="ambiguous")),
    }


def schedules(tether: Tether) -> dict[str, Any]:
    """The schedules by name, each with its next tick, paused state and last run."""
    return {"schedules": plain(tether.schedules())}
