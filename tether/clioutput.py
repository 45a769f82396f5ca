"""How the ``tether`` command line prints: Rich tables for people, a stable JSON shape for programs.

Colour only on a terminal and never with ``NO_COLOR``; piped output is plain text, wide enough
that ids are never cut. Each run gets one human status (``run_status``) saying what it waits for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import unquote, urlsplit, urlunsplit

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tether.describe import duration, message_words, progress_text, summary
from tether.engine.providers import Usage
from tether.store import (
    AgentMessage,
    Attempt,
    ChildRun,
    Decision,
    EventWait,
    InteractiveRequest,
    Progress,
    RunView,
    agent_message,
)

if TYPE_CHECKING:
    from tether.client import Tether

#: Colour of each kind of human status (a terminal only).
STYLES = {
    "completed": "green",
    "failed": "bold red",
    "cancelled": "yellow",
    "person": "bold cyan",
    "operator": "bold magenta",
    "later": "blue",
    "active": "white",
}


def console(stream: TextIO | None = None) -> Console:
    """A Rich console on ``stream`` (stdout): colour on a terminal unless ``NO_COLOR`` is set."""
    stream = sys.stdout if stream is None else stream
    terminal = stream.isatty()
    colour = terminal and not os.environ.get("NO_COLOR")
    width = None if terminal else int(os.environ.get("COLUMNS", "0") or 0) or 200
    return Console(
        file=stream,
        force_terminal=colour,
        no_color=not colour,
        color_system="auto" if colour else None,
        highlight=False,
        width=width,
        soft_wrap=not terminal,
    )


# -- JSON ------------------------------------------------------------------------------------
def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: v for k, v in dataclasses.asdict(value).items() if k != "claim_token"}
    raise TypeError(type(value).__name__)


def to_json(value: Any, *, indent: int | None = 2) -> str:
    return json.dumps(value, default=_json_default, indent=indent, sort_keys=True)


# -- store URLs ------------------------------------------------------------------------------
def display_url(url: str) -> str:
    """The store URL as it may be printed: a password masked, a SQLite path made absolute."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite" and parts.path not in ("", "/"):
        path = os.path.abspath(unquote(parts.path[1:]))
        return f"sqlite:///{path}" + (f"?{parts.query}" if parts.query else "")
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def mask_urls(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` URL in it masked."""
    import re

    return re.sub(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s]+@", r"\1***@", text)


# -- human status ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Status:
    text: str
    kind: str  #: a key of STYLES
    action: str | None = None  #: the command that acts on it, if a person should


def run_status(
    view: RunView,
    *,
    decisions: Sequence[Decision] = (),
    requests: Sequence[InteractiveRequest] = (),
    note: str | None = None,
    slot: str | None = None,
    attempts: Sequence[Attempt] = (),
    due: datetime | None = None,
    now: datetime | None = None,
    event: EventWait | None = None,
    children: Sequence[ChildRun] = (),
) -> Status:
    """One human status for a run: what it did, or what it waits for and who acts next.
    ``due`` is when a parked run may be taken next (``Tether.due_at``): it gives a retry its
    countdown. ``note``: why no worker takes the run (``Tether.waiting_notes``); ``slot``: the
    concurrency limit it waits for a slot of (``Tether.slot_waits``); ``event``: the
    ``wait_for_event`` node's wait (``Store.event_wait``), with its deadline if it has one."""
    run = view.run_id
    if view.status == "done":
        return Status("completed", "completed")
    if view.status == "cancelled":
        return Status("cancelled", "cancelled")
    if view.run_state_status == "timed_out":
        return Status("timed out", "failed", f"tether show {run}")
    if view.status == "failed":
        why = f": {view.error_code}" if view.error_code and view.error_code != "nodeFailed" else ""
        return Status(f"failed{why}", "failed", f"tether show {run}")
    if view.paused:
        return Status("paused", "person", f"tether resume {run}")
    if view.error_code == "effectAmbiguous":
        return Status("effect needs resolution", "operator", f"tether effects --run-id {run}")
    if view.error_code == "workflowSourceChanged":
        return Status("workflow changed", "operator", f"tether resume {run} --accept-changes")
    if view.error_code in ("poisonRun", "runnerNoProgress"):
        return Status("parked: no progress (poison limit)", "operator", f"tether resume {run}")
    if view.error_code:
        return Status(f"parked: {view.error_code}", "operator", f"tether resume {run}")
    if note and view.status == "queued" and view.run_state_status == "waiting":
        # Its decision was answered (or its event came) on a definition no live worker has: a
        # worker with that definition, or moving the run onto the one loaded now, goes on.
        return Status(note, "operator", f"tether resume {run} --accept-changes")
    if view.run_state_status == "waiting" and view.status != "queued":
        for decision in decisions:
            if decision.outcome is None:
                return Status(
                    f"waiting for decision {decision.decision_id}",
                    "person",
                    f"tether answer {decision.decision_id} ANSWER",
                )
        for request in requests:
            if request.status == "pending":
                return Status(
                    f"waiting for input {request.request_id}",
                    "person",
                    f"tether submit {request.request_id} JSON --session {request.target_session_id}",
                )
        if event is not None:
            # A system (or a person through ``tether event send``) sends it: shown as waiting
            # for something else, not as a task for a person, so it is not in the inbox.
            until = ""
            if event.deadline_at is not None:
                at = event.deadline_at
                until = f" (times out at {at:%Y-%m-%d %H:%M:%S} UTC, {ago(at, now)})"
            return Status(
                f"waiting for event {event.name}{until}",
                "later",
                f"tether event send {run} {event.name} --payload JSON",
            )
        for kid in children:
            if kid.waits and kid.status not in ("done", "failed", "cancelled"):
                return Status(f"waiting for child run {kid.run_id}", "later", f"tether show {kid.run_id}")
        waited = [kid for kid in children if kid.waits]
        if waited and not decisions and not requests:
            # Its child finished while its session had another active run: nothing requeued it.
            return Status(f"child run {waited[-1].run_id} finished", "operator", f"tether resume {run}")
        return Status("waiting for a person", "person")
    later = _later(attempts, due, now) if view.status == "parked" else None
    if note:
        return Status(note + (f" ({later.text})" if later else ""), "operator", "tether worker")
    if slot:
        return Status(slot + (f" ({later.text})" if later else ""), "later")
    if later is not None:
        return later
    if view.status == "queued":
        return Status("queued", "later")
    if view.status in ("starting", "running"):
        return Status("running", "active")
    if view.status == "parked":
        return Status("waiting for a worker", "later")
    return Status(view.status, "active")


def statuses(tether: Tether, views: Sequence[RunView]) -> dict[str, Status]:
    """The human status of each run (``run_status``), reading only what the waiting ones need."""
    notes = tether.waiting_notes(views)
    slots = tether.slot_waits(views)
    due = tether.due_at(v.run_id for v in views if v.status == "parked")
    found: dict[str, Status] = {}
    for view in views:
        waiting = view.run_state_status == "waiting" and view.status == "parked"
        later = view.status == "parked" and not waiting and not view.error_code and not view.paused
        found[view.run_id] = run_status(
            view,
            decisions=tether.decisions(view.run_id) if waiting else (),
            requests=tether.store.requests(run_id=view.run_id, status="pending") if waiting else (),
            note=notes.get(view.run_id),
            slot=slots.get(view.run_id),
            attempts=tether.store.attempts(view.run_id) if later else (),
            due=due.get(view.run_id),
            event=tether.store.event_wait(view.run_id) if waiting else None,
            children=tether.children(view.run_id) if waiting else (),
        )
    return found


def waits_for_an_event(tether: Tether, view: RunView) -> bool:
    """Whether the run is parked at a ``wait_for_event`` node waiting for its event."""
    return (
        view.run_state_status == "waiting"
        and view.status == "parked"
        and not view.paused
        and not view.error_code
        and tether.store.event_wait(view.run_id) is not None
    )


def _later(attempts: Sequence[Attempt], due: datetime | None, now: datetime | None) -> Status | None:
    """What a parked run with nothing to answer waits for: a retry's backoff (with its countdown
    when ``due`` is known) or a durable sleep (None when its attempts do not say, as for a run a
    stopping worker handed back)."""
    if attempts:
        last = attempts[-1]
        if last.status in ("failed", "timed_out"):
            when = ""
            if due is not None:
                left = (due - (now or datetime.now(UTC))).total_seconds()
                when = f" in {duration(left * 1000)}" if left >= 1 else " now"
            return Status(
                f"retrying {last.node_id}{when} (attempt {last.attempt_number} {last.status})", "later"
            )
        wake = mapping(last.output).get("wakeAt")
        if isinstance(wake, str):
            try:
                at = datetime.fromisoformat(wake)
            except ValueError:
                at = None
            if at is not None:
                return Status(f"sleeping until {at:%Y-%m-%d %H:%M:%S} UTC ({ago(at)})", "later")
    return None


def styled(status: Status) -> Text:
    return Text(status.text, style=STYLES.get(status.kind, ""))


def ago(moment: datetime | None, now: datetime | None = None) -> str:
    if moment is None:
        return ""
    seconds = int(((now or datetime.now(UTC)) - moment).total_seconds())
    if seconds == 0:
        return "just now"
    if seconds < 0:
        return f"in {duration(-seconds * 1000)}"
    return f"{duration(seconds * 1000)} ago"


def table(*columns: str) -> Table:
    grid = Table(show_header=True, header_style="bold", box=None, pad_edge=False, expand=False)
    for column in columns:
        grid.add_column(column, overflow="fold")
    return grid


def print_rows(out: Console, columns: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> None:
    grid = table(*columns)
    count = 0
    for row in rows:
        grid.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in row))
        count += 1
    if count:
        out.print(grid)
    else:
        out.print(empty)


def conversation_lines(messages: Sequence[AgentMessage], limit: int = 400) -> list[Text]:
    """An agent conversation as lines: a heading per node and conversation, then each message
    with its role (tool calls and results by tool name, corrections marked, tokens used)."""
    lines: list[Text] = []
    heading: tuple[str, str] | None = None
    styles = {"model": "green", "fix": "yellow"}
    for m in messages:
        if heading != (m.node_id, m.conversation):
            heading = (m.node_id, m.conversation)
            lines.append(
                Text(f"\nconversation of {m.node_id} (begun by attempt {m.conversation})", style="bold")
            )
        who, what, tokens = message_words(m, limit)
        style = "cyan" if what.startswith("calls ") else styles.get(who, "")
        line = Text(f"{m.index:>3} {who:<6} {what}", style=style)
        if tokens:
            line.append(f"  ({tokens})", style="dim")
        lines.append(line)
    return lines


def usage_lines(used: Mapping[str, Usage]) -> list[Text]:
    """The tokens the agent steps used: one line per node, then the run's total when there are
    several (nothing when no provider reported usage)."""
    if not any(u.total for u in used.values()):
        return []
    lines = [Text("\ntokens used", style="bold")]
    for node_id, u in used.items():
        lines.append(Text(f"  {node_id}  {u.input_tokens} in, {u.output_tokens} out ({u.total})"))
    if len(used) > 1:
        ins = sum(u.input_tokens for u in used.values())
        outs = sum(u.output_tokens for u in used.values())
        lines.append(Text(f"  total  {ins} in, {outs} out ({ins + outs})", style="bold"))
    return lines


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# -- live view -------------------------------------------------------------------------------
class LiveView:
    """Prints a run's journal as it grows: each step's start and end with its elapsed time,
    retries, errors in full, then one outcome line."""

    def __init__(self, out: Console, *, quiet: bool = False, workflow: Any = None) -> None:
        self.out = out
        self.quiet = quiet
        #: The run's workflow when this process loaded it: retries and sleeps then show their delay.
        self.workflow = workflow
        self.last: tuple[str, str, int] | None = None
        self.started: dict[str, datetime] = {}
        self.first: datetime | None = None
        #: Each step's first progress report of its attempt (for the time left).
        self.reported: dict[str, Progress] = {}
        #: Each agent step's streaming turn: its conversation, index and the text shown so far.
        self.streaming: dict[str, tuple[str, int, str]] = {}

    def _stamp(self, at: datetime) -> str:
        if self.first is None:
            self.first = at
        return f"[{(at - self.first).total_seconds():7.2f}s]"

    def event(self, event: Any) -> None:
        if self.quiet:
            return
        payload = mapping(event.payload)
        node = str(payload.get("nodeId", ""))
        stamp = self._stamp(event.recorded_at)
        kind = event.type
        line: Text | None = None
        if kind == "run.queued":
            line = Text(f"{stamp} queued", style="dim")
        elif kind == "node.started":
            self.started[node] = event.recorded_at
            attempt = int(payload.get("attempt") or 1)
            self.last = (node, "started", attempt)
            retry = f" (retry, attempt {attempt})" if attempt > 1 else ""
            line = Text(f"{stamp} ▶ {node}{retry}", style="yellow" if retry else "")
        elif kind in ("node.completed", "node.failed", "node.timed_out"):
            if self.last is not None and self.last[0] == node:
                self.last = (node, kind.split(".")[1], self.last[2])
            began = self.started.pop(node, None)
            took = (
                "" if began is None else " in " + duration((event.recorded_at - began).total_seconds() * 1000)
            )
            if kind == "node.completed":
                exit_name = payload.get("exit")
                via = f" → {exit_name}" if exit_name and exit_name != "ok" else ""
                line = Text(f"{stamp} ✓ {node}{via}{took}", style="green")
            else:
                line = Text(f"{stamp} ✗ {node} {kind.split('.')[1]}{took}", style="bold red")
                error = payload.get("error")
                if error:
                    line.append(
                        "\n" + "\n".join("           " + x for x in str(error).splitlines()), style="red"
                    )
        elif kind == "node.progress":
            line = Text(
                f"{stamp} ⋯ {node} {progress_text(self._progress(event, node, payload))}", style="cyan"
            )
        elif kind == "agent.text":
            grown = self._grown_text(node, payload)
            if grown:
                line = Text(f"{stamp} ✎ {node} ", style="dim") + Text(grown)
        elif kind == "agent.message":
            self.streaming.pop(node, None)
            said = conversation_lines([agent_message(event)])[-1]
            line = Text(f"{stamp} ⋯ {node} ", style="cyan") + Text(said.plain.strip(), style="cyan")
        elif kind == "run.queue_running":
            line = Text(f"{stamp} running", style="dim")
        elif kind == "run.queue_parked":
            line = Text(f"{stamp} {self._why_parked()}", style="blue")
        elif kind == "decision.requested":
            line = Text(
                f"{stamp} ? {node} waits for decision {payload.get('decisionId', '')}", style="bold cyan"
            )
        elif kind == "input.requested":
            line = Text(f"{stamp} ? waits for input {payload.get('requestId', '')}", style="bold cyan")
        elif kind == "effect.ambiguous" or kind == "run.effect_ambiguous":
            line = Text(f"{stamp} ! {node or 'an effect'} needs resolution", style="bold magenta")
        elif kind == "run.source_changed":
            line = Text(f"{stamp} ! workflow changed since the run was reserved", style="bold magenta")
        elif kind == "run.cancel_requested":
            line = Text(f"{stamp} cancel requested", style="yellow")
        if line is not None:
            self.out.print(line)
            self.out.file.flush()  # a live view: each line as it happens, also into a pipe

    def _grown_text(self, node: str, payload: Mapping[str, Any]) -> str:
        """The text a streaming turn added since it was last shown (an entry carries the text
        from its ``offset``; one may repeat text an earlier entry had)."""
        turn = (str(payload.get("conversation", "")), int(payload.get("index") or 0))
        conversation, index, shown = self.streaming.get(node, ("", 0, ""))
        if (conversation, index) != turn:
            shown = ""
        piece = payload.get("text")
        text = shown[: int(payload.get("offset") or 0)] + (piece if isinstance(piece, str) else "")
        self.streaming[node] = (*turn, text if len(text) > len(shown) else shown)
        return text[len(shown) :] if text.startswith(shown) else text

    def _progress(self, event: Any, node: str, payload: Mapping[str, Any]) -> Progress:
        """The report as a ``Progress``, measured from the step attempt's first report."""
        attempt, done, total = (
            int(payload.get("attempt") or 0),
            float(payload.get("done") or 0),
            payload.get("total"),
        )
        first = self.reported.get(node)
        if first is None or first.attempt != attempt:
            first = None
        report = Progress(
            event.run_id,
            node,
            attempt,
            done,
            float(total) if isinstance(total, int | float) else None,
            message if isinstance(message := payload.get("message"), str) else None,
            event.recorded_at,
            done if first is None else first.first_done,
            event.recorded_at if first is None else first.first_at,
        )
        if first is None:
            self.reported[node] = report
        return report

    def _why_parked(self) -> str:
        """What a parked run waits for, with the delay when the workflow tells it."""
        nodes = getattr(self.workflow, "nodes", {})
        if self.last is None or self.last[0] not in nodes:
            return "parked"
        node_id, state, attempt = self.last
        spec = nodes[node_id].spec
        if state in ("failed", "timed_out") and "backoffS" in spec:
            delay = float(spec["backoffS"]) * 2 ** (attempt - 1)
            return f"retrying {node_id} in {duration(delay * 1000)} (attempt {attempt + 1})"
        if state == "completed" and nodes[node_id].kind == "sleep":
            return f"sleeping for {duration(float(spec['seconds']) * 1000)}"
        return "parked"

    def outcome(self, view: RunView, result: Any) -> None:
        status = run_status(view)
        took = ""
        if view.started_at and view.finished_at:
            took = " in " + duration((view.finished_at - view.started_at).total_seconds() * 1000)
        if result.status == "done":
            self.out.print(Text(f"completed{took}: {summary(result.output, 400)}", style="bold green"))
            return
        self.out.print(Text(f"{status.text}{took}", style=STYLES[status.kind]))
        if view.error_code:
            self.out.print(Text(f"error {view.error_code}: {view.error_message}", style="red"))
        if status.action:
            self.out.print(f"next: {status.action}", markup=False)
