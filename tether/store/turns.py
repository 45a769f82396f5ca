"""An agent step's conversation, recorded message by message as ``agent.message`` journal entries.

Each message (the prompt, a model response, a tool's result, the validation errors sent back for
an invalid answer) is one entry, written in a transaction of its own that re-checks the run's
live claim and that the step's attempt is still running: a runner that lost its run, or a step
abandoned at its deadline, records nothing. The journal is the record because it already is the
run's durable, ordered, claim-fenced history: pruned and forked with the run, followed by
``tether watch`` and the console; a large message goes to a blob like any large entry.

A conversation is named by the attempt that began it (``conversation``): an attempt interrupted
by a takeover or a stopping runner is continued by the next attempt of the node, which reads the
conversation back instead of asking the model again; a failed or timed-out attempt ends its
conversation (a retry begins a new one).

While a turn runs, the text the model streams is journalled as ``agent.text`` entries: each holds
the text that came since the previous one (and where it starts in the turn's text), and the
runner writes one at most every ``TEXT_EVERY_S`` (``tether.engine.worker.livetext``), so a long
answer adds a few entries a second, not one per token. They are a live view for ``tether watch``
and the console (``live_text``); the ``agent.message`` of the turn, once recorded, is the truth
and supersedes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tether.errors import ClaimLost, InvalidInput
from tether.store.progress import ProgressOps
from tether.store.records import RunEvent
from tether.store.runs import Now
from tether.values import Json, canonical_json, require_text

MESSAGE_EVENT = "agent.message"
#: Text a model streams while its turn runs: a view, not a record (the recorded turn supersedes it).
TEXT_EVENT = "agent.text"
#: The longest piece of streamed text one entry carries.
TEXT_PIECE_LIMIT = 20_000
#: Who speaks in a conversation.
ROLES = ("user", "assistant", "tool")


@dataclass(frozen=True)
class AgentMessage:
    """One recorded message of an agent step's conversation."""

    run_id: str
    node_id: str
    #: The attempt that began the conversation (continued by the attempts after a takeover).
    conversation: str
    #: Its place in the conversation, from 1.
    index: int
    #: ``user`` (the prompt, validation errors), ``assistant`` (a model response) or ``tool``.
    role: str
    #: The message: ``content`` (text or JSON), and ``toolCalls``, ``toolCallId``, ``usage``.
    body: dict[str, Json]
    #: The attempt that recorded it.
    attempt_id: str
    at: datetime


class TurnOps(ProgressOps):
    """Recording and reading agent conversations."""

    def agent_message_record(
        self,
        *,
        run_id: str,
        claim_token: str,
        attempt_id: str,
        node_id: str,
        conversation: str,
        index: int,
        role: str,
        body: dict[str, Json],
        now: Now = None,
    ) -> None:
        """Journal message ``index`` of ``conversation`` under the live claim, while the attempt
        ``attempt_id`` is running. ``ClaimLost`` (nothing written) when the claim is gone or the
        attempt was settled (a step abandoned at its deadline writes nothing more)."""
        at = self._args(run_id, claim_token, now)
        for name, value in (("attempt_id", attempt_id), ("node_id", node_id), ("conversation", conversation)):
            require_text(name, value, limit=1000)
        if isinstance(index, bool) or not isinstance(index, int) or index < 1:
            raise InvalidInput(f"agent message index must be a whole number of at least 1, not {index!r}")
        if role not in ROLES:
            raise InvalidInput(f"agent message role must be one of {', '.join(ROLES)}, not {role!r}")
        if not isinstance(body, dict):
            raise InvalidInput("an agent message is a JSON object")
        canonical_json(body)
        payload: dict[str, Json] = {
            "nodeId": node_id,
            "attemptId": attempt_id,
            "conversation": conversation,
            "index": index,
            "role": role,
            "message": body,
        }
        self._journal_for_attempt(
            run_id, claim_token, attempt_id, at, MESSAGE_EVENT, payload, "agent message"
        )

    def agent_text_record(
        self,
        *,
        run_id: str,
        claim_token: str,
        attempt_id: str,
        node_id: str,
        conversation: str,
        index: int,
        offset: int,
        text: str,
        now: Now = None,
    ) -> None:
        """Journal a piece of the text a model streams in the turn that will be message
        ``index`` of ``conversation``: ``text`` starts at ``offset`` of the turn's text. Under
        the live claim, while the attempt is running (``ClaimLost``, nothing written, else)."""
        at = self._args(run_id, claim_token, now)
        for name, value in (("attempt_id", attempt_id), ("node_id", node_id), ("conversation", conversation)):
            require_text(name, value, limit=1000)
        for name, number, least in (("index", index, 1), ("offset", offset, 0)):
            if isinstance(number, bool) or not isinstance(number, int) or number < least:
                raise InvalidInput(f"agent text {name} must be a whole number, not {number!r}")
        if not isinstance(text, str) or len(text) > TEXT_PIECE_LIMIT:
            raise InvalidInput(f"agent text must be text of at most {TEXT_PIECE_LIMIT} characters")
        payload: dict[str, Json] = {
            "nodeId": node_id,
            "attemptId": attempt_id,
            "conversation": conversation,
            "index": index,
            "offset": offset,
            "text": text,
        }
        self._journal_for_attempt(run_id, claim_token, attempt_id, at, TEXT_EVENT, payload, "streamed text")

    def _journal_for_attempt(
        self,
        run_id: str,
        claim_token: str,
        attempt_id: str,
        at: int,
        event: str,
        payload: dict[str, Json],
        what: str,
    ) -> None:
        """Journal ``event`` on the run in one transaction, under the live claim and while the
        attempt is still running (``ClaimLost``, nothing written, else): ``what`` names the
        entry in the refusal."""
        with self.db.transaction():
            row = self._held(run_id, claim_token, at)
            attempt = self._require_attempt(run_id, attempt_id)
            if attempt["status"] not in ("pending", "running"):
                raise ClaimLost(
                    f"Node attempt {attempt_id} of workflow run {run_id} is {attempt['status']}; "
                    f"its late {what} was not recorded"
                )
            self._bump_emit(row, event, payload, at)

    def live_text(self, run_id: str) -> dict[str, LiveText]:
        """The text each node's model has streamed so far in a turn not recorded yet, by node id
        (``live_text_of``), while the attempt that streams it is running (a turn cut short by a
        failure or a dead worker shows no more)."""
        events = [
            e
            for kind in (MESSAGE_EVENT, TEXT_EVENT)
            for e in self.events_after(0, run_id=run_id, event_type=kind, limit=1_000_000)
        ]
        events.sort(key=lambda e: e.seq)
        found = live_text_of(events)
        if not found:
            return found
        running = {a.attempt_id for a in self.attempts(run_id) if a.status in ("pending", "running")}
        return {node: live for node, live in found.items() if live.attempt_id in running}

    def agent_messages(
        self, run_id: str, *, node_id: str | None = None, conversation: str | None = None
    ) -> list[AgentMessage]:
        """A run's recorded agent messages in the order they were recorded: one node's with
        ``node_id``, one conversation's with ``conversation``."""
        found = [
            agent_message(e)
            for e in self.events_after(0, run_id=run_id, event_type=MESSAGE_EVENT, limit=1_000_000)
        ]
        return [
            m
            for m in found
            if (node_id is None or m.node_id == node_id)
            and (conversation is None or m.conversation == conversation)
        ]


@dataclass(frozen=True)
class LiveText:
    """The text a model has streamed so far in a turn that is not recorded yet."""

    run_id: str
    node_id: str
    conversation: str
    #: The index the turn's message will have in its conversation.
    index: int
    text: str
    at: datetime
    #: The attempt that streams it.
    attempt_id: str = ""


def live_text_of(events: list[RunEvent]) -> dict[str, LiveText]:
    """Each node's streaming turn from a run's ``agent.text`` and ``agent.message`` entries (in
    journal order): its text so far, by node id. A node whose turn was since recorded (a message
    of its conversation at or past the turn's index) has none."""
    found: dict[str, LiveText] = {}
    for event in events:
        body = event.payload if isinstance(event.payload, dict) else {}
        node_id, conversation = str(body.get("nodeId", "")), str(body.get("conversation", ""))
        index = int(body.get("index") or 0)
        if event.type == MESSAGE_EVENT:
            live = found.get(node_id)
            if live is not None and (live.conversation != conversation or index >= live.index):
                del found[node_id]
            continue
        if event.type != TEXT_EVENT:
            continue
        piece = body.get("text")
        offset = int(body.get("offset") or 0)
        live = found.get(node_id)
        before = (
            live.text if live is not None and (live.conversation, live.index) == (conversation, index) else ""
        )
        # An entry lost on the way (its write failed) is carried again by the next one.
        text = before[:offset] + (piece if isinstance(piece, str) else "")
        found[node_id] = LiveText(
            event.run_id,
            node_id,
            conversation,
            index,
            text,
            event.recorded_at,
            str(body.get("attemptId", "")),
        )
    return found


def agent_message(event: RunEvent) -> AgentMessage:
    """The agent message an ``agent.message`` journal entry records."""
    body = event.payload if isinstance(event.payload, dict) else {}
    message = body.get("message")
    return AgentMessage(
        run_id=event.run_id,
        node_id=str(body.get("nodeId", "")),
        conversation=str(body.get("conversation", "")),
        index=int(body.get("index") or 0),
        role=str(body.get("role", "")),
        body=dict(message) if isinstance(message, dict) else {},
        attempt_id=str(body.get("attemptId", "")),
        at=event.recorded_at,
    )
