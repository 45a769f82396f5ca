"""The agent loop inside one step: the model takes turns, calling tools and seeing their results,
until it gives a final answer that matches the step's schema, within the step's budgets.

Every message is recorded as the step goes (``Store.agent_message_record``, one claim-checked
transaction each): the prompt, each model response, each tool result, the validation errors sent
back for an invalid answer. The loop is a function of the recorded conversation: whatever is
recorded is never asked of the model (or the tools) again. A step taken over after its runner
died goes on from the last recorded message of its conversation (see ``conversation_of``).

Budgets: ``max_turns`` model responses; ``max_tokens`` tokens, when the provider reports usage;
``max_invalid`` invalid final answers sent back for correction. Past one, ``BudgetExceeded``
fails the step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tether.engine.context import Context
from tether.engine.providers import Turn, Usage
from tether.engine.schema import errors as schema_errors
from tether.engine.tools import Tool
from tether.errors import BudgetExceeded
from tether.store import AgentMessage, Attempt, Store
from tether.values import Json

#: Applies an effect tool's call through the outbox: ``(tool, call id, checked arguments) -> result``
#: (``{"error": ...}`` for the model when it was not applied).
EffectApplier = Callable[[Tool, str, dict[str, Json]], Json]

#: Asks a person to approve a ``needs_approval`` tool's call: ``(tool, turn, call id, checked
#: arguments) -> None`` once it was approved, or the error the model gets when it was not
#: (``turn``: the index of the model's message that made the call). While the person has not
#: answered, it parks the step (and does not return).
Approver = Callable[[Tool, int, str, dict[str, Json]], "str | None"]


@dataclass(frozen=True)
class Budgets:
    """An agent step's limits."""

    max_turns: int
    max_invalid: int
    max_tokens: int | None


def conversation_of(attempts: Sequence[Attempt], attempt: Attempt) -> str:
    """The conversation ``attempt`` takes part in: the id of the attempt that began it. An
    attempt right after an ``interrupted`` attempt of the same node (its runner died or stopped)
    continues that attempt's conversation; any other attempt begins its own."""
    ordered = list(attempts)
    index = next((i for i, a in enumerate(ordered) if a.attempt_id == attempt.attempt_id), None)
    if index is None:
        return attempt.attempt_id
    began = attempt.attempt_id
    while (
        index > 0
        and ordered[index - 1].node_id == attempt.node_id
        and ordered[index - 1].status == "interrupted"
    ):
        index -= 1
        began = ordered[index].attempt_id
    return began


class Conversation:
    """The messages of one conversation, recorded as they are added."""

    def __init__(
        self, store: Store, run_id: str, claim_token: str, attempt: Attempt, conversation: str
    ) -> None:
        self.store, self.run_id, self.claim_token = store, run_id, claim_token
        self.attempt, self.conversation = attempt, conversation
        self.messages: list[dict[str, Json]] = [
            {"role": m.role, **m.body}
            for m in store.agent_messages(run_id, node_id=attempt.node_id, conversation=conversation)
        ]

    def add(self, role: str, body: dict[str, Json]) -> None:
        self.store.agent_message_record(
            run_id=self.run_id,
            claim_token=self.claim_token,
            attempt_id=self.attempt.attempt_id,
            node_id=self.attempt.node_id,
            conversation=self.conversation,
            index=len(self.messages) + 1,
            role=role,
            body=body,
        )
        self.messages.append({"role": role, **body})

    def count(self, role: str, flag: str | None = None) -> int:
        return sum(1 for m in self.messages if m["role"] == role and (flag is None or m.get(flag)))

    @property
    def tokens(self) -> int:
        return sum(_recorded_usage(m).total for m in self.messages)


def usage_by_node(messages: Sequence[AgentMessage]) -> dict[str, Usage]:
    """The tokens the recorded turns used, summed by node (in the order the nodes first spoke);
    turns whose provider reported no usage count nothing."""
    totals: dict[str, Usage] = {}
    for m in messages:
        used = _recorded_usage(m.body)
        before = totals.get(m.node_id, Usage())
        totals[m.node_id] = Usage(
            before.input_tokens + used.input_tokens, before.output_tokens + used.output_tokens
        )
    return totals


def _recorded_usage(body: Mapping[str, Json]) -> Usage:
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return Usage()
    return Usage(int(usage.get("inputTokens") or 0), int(usage.get("outputTokens") or 0))


def converse(
    conversation: Conversation,
    prompt: Callable[[], str],
    ask: Callable[[list[dict[str, Json]]], Turn],
    tools: Sequence[Tool],
    schema: dict[str, Any],
    budgets: Budgets,
    ctx: Context,
    invoke: Callable[[Callable[[], Any]], Any] | None = None,
    apply_effect: EffectApplier | None = None,
    approve: Approver | None = None,
) -> Json:
    """Run the conversation to a valid final answer and return it. ``prompt()`` is asked only
    for a conversation not begun yet; ``ask(messages)`` is one model turn; ``invoke`` calls a
    tool's function (see ``Tool.call``); ``apply_effect`` calls an effect tool through the
    outbox (without it, an effect tool is called like any); ``approve`` asks a person about a
    ``needs_approval`` tool's call before it runs (without it, such a call is refused). The
    calls of a model turn are answered in order, so the call waiting for approval is always the
    first of the last turn's calls without a recorded result. Raises
    ``BudgetExceeded`` past a budget; whatever the provider raises fails the step."""
    by_name = {t.name: t for t in tools}
    if not conversation.messages:
        conversation.add("user", {"content": prompt()})
    while True:
        ctx.raise_if_cancelled()
        last = conversation.messages[-1]
        turn_index, pending = _unanswered(conversation.messages)
        if pending:
            for call in pending:
                ctx.raise_if_cancelled()
                result = _tool_result(call, turn_index, by_name, invoke, apply_effect, approve)
                conversation.add("tool", result)
            continue
        if last["role"] == "assistant":
            answer = last.get("content")
            problems = schema_errors(answer, schema)
            if not problems:
                return answer
            if conversation.count("user", "invalid") >= budgets.max_invalid:
                raise BudgetExceeded(
                    "model output does not match the schema: " + "; ".join(problems[:5])
                    if budgets.max_invalid == 0
                    else f"the model's answer still does not match the schema after {budgets.max_invalid} "
                    "correction(s) (max_invalid): " + "; ".join(problems[:5])
                )
            conversation.add(
                "user",
                {
                    "content": "Your answer does not match the schema: "
                    + "; ".join(problems[:10])
                    + ". Answer again with one JSON value that matches it.",
                    "invalid": True,
                },
            )
            continue
        turns = conversation.count("assistant")
        if turns >= budgets.max_turns:
            raise BudgetExceeded(
                f"the model took {turns} turns without a final answer (max_turns={budgets.max_turns})"
            )
        turn = ask([dict(m) for m in conversation.messages])
        if not isinstance(turn, Turn):
            raise TypeError(f"the provider's turn() returned {type(turn).__name__}, not a Turn")
        body: dict[str, Json] = {"content": None if turn.calls else turn.answer}
        if turn.calls:
            body["toolCalls"] = [
                {"id": call.id or f"call-{turns + 1}-{n}", "name": call.name, "arguments": call.arguments}
                for n, call in enumerate(turn.calls, 1)
            ]
        if turn.usage is not None:
            body["usage"] = {"inputTokens": turn.usage.input_tokens, "outputTokens": turn.usage.output_tokens}
        conversation.add("assistant", body)
        if budgets.max_tokens is not None and conversation.tokens > budgets.max_tokens:
            raise BudgetExceeded(
                f"the model used {conversation.tokens} tokens (max_tokens={budgets.max_tokens})"
            )


def _unanswered(messages: list[dict[str, Json]]) -> tuple[int, list[dict[str, Json]]]:
    """The last model turn (its message's index, counted from 1) and its tool calls without a
    recorded result, in order. Results are recorded one by one, so a conversation taken up again
    may end with some of them: the others are still to be answered before the model is asked
    again. Only results after the turn count (a provider may use a call id again)."""
    at = next((i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == "assistant"), None)
    calls = messages[at].get("toolCalls") if at is not None else None
    if at is None or not isinstance(calls, list):
        return 0, []
    answered = {m.get("toolCallId") for m in messages[at + 1 :] if m["role"] == "tool"}
    return at + 1, [c for c in calls if isinstance(c, dict) and c.get("id") not in answered]


def _tool_result(
    call: dict[str, Json],
    turn: int,
    tools: dict[str, Tool],
    invoke: Callable[[Callable[[], Any]], Any] | None,
    apply_effect: EffectApplier | None,
    approve: Approver | None,
) -> dict[str, Json]:
    name, arguments = str(call.get("name")), call.get("arguments")
    found = tools.get(name)
    content: Json
    if found is None:
        known = ", ".join(sorted(tools)) or "none"
        content = {"error": f"there is no tool named {name!r}; the tools are: {known}"}
    elif found.needs_approval:
        # Invalid arguments go back to the model without asking anyone.
        refused = found.refusal(arguments)
        if refused is not None or not isinstance(arguments, dict):
            content = {"error": refused}
        elif approve is None:
            content = {"error": f"tool {name} needs a person's approval, and none can be asked here"}
        else:
            rejected = approve(found, turn, str(call.get("id")), arguments)
            if rejected is not None:
                content = {"error": rejected}
            elif found.effect and apply_effect is not None:
                content = apply_effect(found, str(call.get("id")), arguments)
            else:
                content = found.call(arguments, invoke)
    elif found.effect and apply_effect is not None:
        refused = found.refusal(arguments)
        content = (
            apply_effect(found, str(call.get("id")), arguments)
            if refused is None and isinstance(arguments, dict)
            else {"error": refused}
        )
    else:
        content = found.call(arguments, invoke)
    return {"toolCallId": call.get("id"), "name": name, "content": content}
