"""Agent conversations inside a step: tools, corrections, budgets, and the record of each
message (scripted provider, both backends)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Literal

import pytest

from tether.aio import AsyncTether
from tether.engine.agentloop import conversation_of
from tether.engine.clock import FakeClock
from tether.engine.context import Context
from tether.engine.graph import Workflow, agent, compute
from tether.engine.providers import ScriptedProvider, ToolCall, Turn, Usage
from tether.engine.tools import Tool, parameters_schema, tool
from tether.errors import ClaimLost, InvalidInput, NotFound

from .conftest import WAIT_S, Engine, wait_until

TOTAL = {
    "type": "object",
    "properties": {"total": {"type": "number"}, "city": {"type": "string"}},
    "required": ["total", "city"],
}


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@tool(description="The city an airport code names.")
def city(code: Literal["LHR", "CDG"]) -> str:
    return {"LHR": "London", "CDG": "Paris"}[code]


def test_agent__two_tools_over_several_turns_then_a_final_answer(engine: Engine) -> None:
    model = ScriptedProvider(
        [
            Turn(calls=[ToolCall("add", {"a": 2, "b": 3}), ToolCall("city", {"code": "CDG"})]),
            Turn(calls=[ToolCall("add", {"a": 5, "b": 10})], usage=Usage(10, 5)),
            lambda messages: {"total": messages[-1]["content"], "city": messages[3]["content"]},
        ]
    )
    wf = Workflow(
        "agent-tools",
        start="plan",
        nodes=[agent("plan", model, "Add things up", schema=TOTAL, tools=[add, city])],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-tools")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"total": 15, "city": "Paris"}
    recorded = engine.client.conversation(run.run_id)
    assert [(m.index, m.role) for m in recorded] == [
        (1, "user"),
        (2, "assistant"),
        (3, "tool"),
        (4, "tool"),
        (5, "assistant"),
        (6, "tool"),
        (7, "assistant"),
    ]
    assert recorded[0].body == {"content": "Add things up"}
    assert [m.body["content"] for m in recorded if m.role == "tool"] == [5, "Paris", 15]
    assert recorded[4].body["usage"] == {"inputTokens": 10, "outputTokens": 5}
    assert recorded[-1].body["content"] == {"total": 15, "city": "Paris"}
    assert {m.conversation for m in recorded} == {engine.attempts(run.run_id)[0].attempt_id}
    # The model saw the tools' results: the third turn was asked with six messages.
    assert len(model.turns) == 3 and len(model.turns[2]) == 6
    assert engine.client.conversation(run.run_id, node_id="other") == []


def test_usage__sums_the_recorded_turns_by_node(engine: Engine) -> None:
    first = ScriptedProvider(
        [
            Turn(calls=[ToolCall("add", {"a": 1, "b": 2})], usage=Usage(10, 5)),
            Turn(answer=3, usage=Usage(20, 1)),
        ]
    )
    second = ScriptedProvider([Turn(answer=4)])
    number = {"type": "number"}
    wf = Workflow(
        "agent-usage",
        start="one",
        nodes=[
            agent("one", first, "Add", schema=number, tools=[add]),
            agent("two", second, "Again", schema=number, max_turns=1),
            compute("plain", lambda ctx: None),
        ],
        edges={"one": "two", "two": "plain"},
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-usage")
    assert engine.wait(run.run_id).status == "done"
    used = engine.client.usage(run.run_id)
    # A turn without reported usage counts nothing; a node without an agent is left out.
    assert used == {"one": Usage(30, 6), "two": Usage(0, 0)}
    assert sum(u.total for u in used.values()) == 36

    async def read() -> dict[str, Usage]:
        async with AsyncTether(engine.client) as client:
            return await client.usage(run.run_id)

    assert asyncio.run(read()) == used
    with pytest.raises(NotFound):
        engine.client.usage("run-nope")


def test_agent__a_tool_error_goes_back_to_the_model(engine: Engine) -> None:
    def lookup(key: str) -> str:
        raise KeyError(key)

    model = ScriptedProvider(
        [
            Turn(
                calls=[ToolCall("lookup", {"key": "x"}), ToolCall("add", {"a": "one"}), ToolCall("nope", {})]
            ),
            {"total": 0, "city": "none"},
        ]
    )
    wf = Workflow(
        "agent-tool-errors",
        start="plan",
        nodes=[agent("plan", model, "Try", schema=TOTAL, tools=[lookup, Tool(add)])],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-tool-errors")
    assert engine.wait(run.run_id).status == "done"
    results = [m.body["content"] for m in engine.client.conversation(run.run_id) if m.role == "tool"]
    assert results[0] == {"error": "KeyError: 'x'"}
    assert "invalid arguments for tool add" in str(results[1]) and "$.b" in str(results[1])
    assert "there is no tool named 'nope'" in str(results[2])


def test_agent__an_invalid_answer_is_sent_back_and_corrected(engine: Engine) -> None:
    model = ScriptedProvider([{"total": "ten"}, {"total": 10, "city": "Oslo"}])
    wf = Workflow(
        "agent-correct",
        start="plan",
        nodes=[agent("plan", model, "Sum", schema=TOTAL, max_invalid=1)],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-correct")
    result = engine.wait(run.run_id)
    assert result.output == {"total": 10, "city": "Oslo"}
    roles = [m.role for m in engine.client.conversation(run.run_id)]
    assert roles == ["user", "assistant", "user", "assistant"]
    correction = model.turns[1][-1]
    assert correction["role"] == "user" and correction["invalid"] is True
    assert "$.total: expected number, got str" in str(correction["content"])


def test_agent__invalid_answers_past_max_invalid_fail_the_step(engine: Engine) -> None:
    model = ScriptedProvider([{"total": "ten"}, {"total": "still ten"}])
    wf = Workflow(
        "agent-stubborn", start="plan", nodes=[agent("plan", model, "Sum", schema=TOTAL, max_invalid=1)]
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-stubborn")
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "still does not match the schema after 1 correction(s) (max_invalid)" in (
        result.error_message or ""
    )


def test_agent__the_turn_budget_fails_the_step(engine: Engine) -> None:
    looping = Turn(calls=[ToolCall("add", {"a": 1, "b": 1})])
    model = ScriptedProvider([looping, looping, looping, {"total": 2, "city": "x"}])
    wf = Workflow(
        "agent-budget",
        start="plan",
        nodes=[agent("plan", model, "Sum", schema=TOTAL, tools=[add], max_turns=2)],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-budget")
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "BudgetExceeded: the model took 2 turns without a final answer (max_turns=2)" in (
        result.error_message or ""
    )
    assert len(model.turns) == 2


def test_agent__the_token_budget_fails_the_step(engine: Engine) -> None:
    model = ScriptedProvider([Turn(calls=[ToolCall("add", {"a": 1, "b": 1})], usage=Usage(80, 40))])
    wf = Workflow(
        "agent-tokens",
        start="plan",
        nodes=[agent("plan", model, "Sum", schema=TOTAL, tools=[add], max_tokens=100)],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-tokens")
    result = engine.wait(run.run_id)
    assert "the model used 120 tokens (max_tokens=100)" in (result.error_message or "")


def test_agent__a_retry_begins_a_new_conversation(engine: Engine) -> None:
    model = ScriptedProvider([{"total": "bad"}, {"total": 1, "city": "Rome"}])
    wf = Workflow(
        "agent-retry-talk",
        start="plan",
        nodes=[agent("plan", model, "Sum", schema=TOTAL, max_turns=3, retries=1)],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-retry-talk")
    assert engine.wait(run.run_id).status == "done"
    first, second = engine.attempts(run.run_id)
    recorded = engine.client.conversation(run.run_id)
    assert [(m.conversation, m.index) for m in recorded] == [
        (first.attempt_id, 1),
        (first.attempt_id, 2),
        (second.attempt_id, 1),
        (second.attempt_id, 2),
    ]


def test_conversation_of__continues_across_interrupted_attempts(engine: Engine) -> None:
    model = ScriptedProvider([{"total": 1, "city": "Rome"}])
    wf = Workflow("agent-one", start="plan", nodes=[agent("plan", model, "Sum", schema=TOTAL, max_turns=1)])
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-one")
    engine.wait(run.run_id)
    (done,) = engine.attempts(run.run_id)
    from dataclasses import replace

    older = replace(done, attempt_id="a0", status="interrupted")
    oldest = replace(done, attempt_id="a-1", status="failed")
    assert conversation_of([oldest, older, done], done) == "a0"
    assert conversation_of([older, replace(done, node_id="x", attempt_id="b"), done], done) == done.attempt_id


def test_tool__parameters_from_type_hints() -> None:
    def search(query: str, limit: int = 10, tags: list[str] | None = None) -> list[str]:
        return []

    assert parameters_schema(search) == {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    assert city.name == "city" and city.description == "The city an airport code names."
    assert Tool(add).description == "Add two numbers."


def test_tool__refuses_what_cannot_be_described() -> None:
    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(InvalidInput, match="parameter x needs a type hint"):
        Tool(untyped)
    with pytest.raises(InvalidInput, match="two tools are named add"):
        agent("a", ScriptedProvider([]), "p", schema=TOTAL, tools=[add, Tool(add)])
    with pytest.raises(InvalidInput, match="max_turns must be a whole number of at least 1"):
        agent("a", ScriptedProvider([]), "p", schema=TOTAL, max_turns=0)

    class OneShot:
        def complete(self, prompt: str, schema: dict[str, object]) -> dict[str, object]:
            return {}

    with pytest.raises(InvalidInput, match="provider OneShot cannot call tools or take turns"):
        agent("a", OneShot(), "p", schema=TOTAL, tools=[add])


def test_agent__a_single_call_agent_keeps_its_definition() -> None:
    node = agent("a", ScriptedProvider([]), "p", schema=TOTAL)
    assert "conversation" not in node.spec


def test_agent__a_message_without_the_claim_is_refused_and_writes_nothing(engine: Engine) -> None:
    model = ScriptedProvider([{"total": 1, "city": "Rome"}])
    engine.register(
        Workflow("agent-idle", start="plan", nodes=[agent("plan", model, "Sum", schema=TOTAL, max_turns=1)])
    )
    run_id = engine.client.start("agent-idle").run_id
    with pytest.raises(ClaimLost):
        engine.store.agent_message_record(
            run_id=run_id,
            claim_token="not-a-claim",
            attempt_id="a-1",
            node_id="plan",
            conversation="a-1",
            index=1,
            role="user",
            body={"content": "hi"},
        )
    assert engine.client.conversation(run_id) == []
    with pytest.raises(NotFound):
        engine.client.conversation("run-unknown")


def test_agent__a_step_abandoned_at_its_deadline_records_nothing_late(engine: Engine) -> None:
    release, returned = threading.Event(), threading.Event()
    after = engine.latch()

    def slow(city: str) -> str:
        release.wait(WAIT_S)
        returned.set()
        return f"sunny in {city}"

    model = ScriptedProvider([Turn(calls=[ToolCall("slow", {"city": "Rome"})])])
    engine.register(
        Workflow(
            "agent-late",
            start="plan",
            nodes=[
                agent("plan", model, "Weather?", schema=TOTAL, tools=[slow], timeout_s=5),
                compute("after", lambda ctx: after.hold()),
            ],
            edges={"plan.timeout": "after"},
        )
    )
    clock = FakeClock()
    engine.runner(clock=clock, lease_ms=60_000, renew_ms=20_000)
    run = engine.client.start("agent-late")
    wait_until(lambda: len(engine.client.conversation(run.run_id)) == 2, what="the tool call")
    while not after.entered.is_set():
        clock.advance(0.5)
        time.sleep(0.02)
    # The run is held (its next step runs) while the abandoned tool returns: its result is
    # refused, as its attempt was settled timed out.
    release.set()
    assert returned.wait(WAIT_S)
    time.sleep(0.2)  # give a (wrong) late write the time it would take
    assert [m.role for m in engine.client.conversation(run.run_id)] == ["user", "assistant"]
    after.release.set()
    assert engine.wait(run.run_id).status == "done"
    assert [a.status for a in engine.attempts(run.run_id)] == ["timed_out", "completed"]


def test_agent__an_async_tool_runs_on_the_runners_event_loop(engine: Engine) -> None:
    async def double(n: int) -> int:
        await asyncio.sleep(0)
        return n * 2

    model = ScriptedProvider(
        [
            Turn(calls=[ToolCall("double", {"n": 21})]),
            lambda messages: {"total": messages[-1]["content"], "city": "async"},
        ]
    )
    wf = Workflow(
        "agent-async-tool",
        start="plan",
        nodes=[agent("plan", model, "Double", schema=TOTAL, tools=[double])],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-async-tool")
    assert engine.wait(run.run_id).output == {"total": 42, "city": "async"}


def test_agent__a_cancel_between_turns_ends_the_conversation(engine: Engine) -> None:
    latch = engine.latch()

    def wait_here() -> str:
        latch.hold()
        return "done"

    contexts: list[Context] = []

    def prompt(ctx: Context) -> str:
        contexts.append(ctx)
        return "Wait"

    model = ScriptedProvider([Turn(calls=[ToolCall("wait_here", {})]), {"total": 1, "city": "never"}])
    wf = Workflow(
        "agent-cancel",
        start="plan",
        nodes=[agent("plan", model, prompt, schema=TOTAL, tools=[wait_here])],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-cancel")
    assert latch.entered.wait(WAIT_S)
    engine.client.cancel(run.run_id)
    wait_until(lambda: contexts[0].cancelled, what="the step to see the cancel")
    latch.release.set()
    result = engine.wait(run.run_id)
    assert result.status == "cancelled"
    # The model was not asked again once the run was being cancelled.
    assert len(model.turns) == 1


# -- effect tools ------------------------------------------------------------------------------
def test_agent__an_effect_tool_is_applied_once_through_the_outbox(engine: Engine) -> None:
    keys: list[str] = []

    @tool(effect=True)
    def send(to: str, idempotency_key: str) -> dict[str, str]:
        """Send a message."""
        keys.append(idempotency_key)
        if to == "nobody":
            raise ValueError("no such address")
        return {"sent": to}

    assert send.parameters["properties"] == {"to": {"type": "string"}}
    model = ScriptedProvider(
        [
            Turn(calls=[ToolCall("send", {"to": "ops"}, "c1"), ToolCall("send", {"to": "nobody"}, "c2")]),
            Turn(calls=[ToolCall("send", {"to": 7}, "c3")]),
            {"total": 1, "city": "sent"},
        ]
    )
    wf = Workflow(
        "agent-send", start="plan", nodes=[agent("plan", model, "Send", schema=TOTAL, tools=[send])]
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-send")
    assert engine.wait(run.run_id).status == "done"
    (attempt,) = engine.attempts(run.run_id)
    prefix = f"{run.run_id}:plan:{attempt.attempt_id}"
    assert keys == [f"{prefix}:c1", f"{prefix}:c2"]
    effects = {e.idempotency_key: e for e in engine.store.effects(run_id=run.run_id)}
    assert effects[f"{prefix}:c1"].status == "applied" and effects[f"{prefix}:c1"].result == {"sent": "ops"}
    assert effects[f"{prefix}:c2"].status == "rejected"
    assert effects[f"{prefix}:c1"].effect_type == "tool.send"
    # Invalid arguments never reach the outbox.
    assert len(effects) == 2
    results = [m.body["content"] for m in engine.client.conversation(run.run_id) if m.role == "tool"]
    assert results[0] == {"sent": "ops"}
    assert results[1] == {"error": "ValueError: no such address"}
    assert "invalid arguments for tool send" in str(results[2])


def test_agent__an_effect_tool_caught_applying_by_a_crash_waits_for_an_operator(engine: Engine) -> None:
    keys: list[str] = []

    @tool(effect=True)
    def send(to: str, idempotency_key: str) -> dict[str, str]:
        keys.append(idempotency_key)
        return {"sent": to}

    # The model is asked once: for the turn after the tool result; the dead runner's turn is
    # recorded.
    model = ScriptedProvider(
        [lambda messages: {"total": len(messages), "city": messages[-1]["content"]["sent"]}]
    )
    wf = Workflow(
        "agent-crash", start="plan", nodes=[agent("plan", model, "Send", schema=TOTAL, tools=[send])]
    )
    engine.register(wf)
    run_id = engine.client.start("agent-crash").run_id

    # A runner that dies while the effect tool applies: its short lease then simply expires.
    store, token = engine.store, "dead-runner-token"
    assert store.claim(run_id=run_id, runner_id="host-dead", claim_token=token, lease_ms=300)
    assert store.mark_running(run_id=run_id, claim_token=token)
    store.set_run_status(run_id=run_id, claim_token=token, status="running")
    dead = store.attempt_start(run_id=run_id, claim_token=token, node_id="plan")
    said = [
        ("user", {"content": "Send"}),
        (
            "assistant",
            {"content": None, "toolCalls": [{"id": "c1", "name": "send", "arguments": {"to": "ops"}}]},
        ),
    ]
    for index, (role, body) in enumerate(said, 1):
        store.agent_message_record(
            run_id=run_id,
            claim_token=token,
            attempt_id=dead.attempt_id,
            node_id="plan",
            conversation=dead.attempt_id,
            index=index,
            role=role,
            body=body,  # type: ignore[arg-type]
        )
    key = f"{run_id}:plan:{dead.attempt_id}:c1"
    pending = store.effect_enqueue(
        run_id=run_id, claim_token=token, effect_type="tool.send", idempotency_key=key
    )
    store.effect_begin(run_id=run_id, claim_token=token, effect_id=pending.effect_id)
    wait_until(
        lambda: not store.verify_claim(run_id=run_id, claim_token=token), what="the dead lease to expire"
    )

    engine.runner()
    wait_until(
        lambda: engine.statuses(run_id) == ("parked", "waiting"), what="the run to wait for an operator"
    )
    assert store.effects(run_id=run_id)[0].status == "ambiguous"
    assert keys == [] and model.turns == []
    # The operator says it did not happen: it is applied again, with the same key, and the
    # conversation goes on from the dead runner's tool call.
    engine.client.resolve_effect(pending.effect_id, "retry")
    result = engine.wait(run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"total": 3, "city": "ops"}
    assert keys == [key]
    recorded = engine.client.conversation(run_id)
    assert [(m.index, m.role) for m in recorded] == [
        (1, "user"),
        (2, "assistant"),
        (3, "tool"),
        (4, "assistant"),
    ]
    assert {m.conversation for m in recorded} == {dead.attempt_id}
    assert [a.status for a in engine.attempts(run_id)] == ["interrupted", "completed"]


def test_async_client__reads_a_conversation(engine: Engine) -> None:
    model = ScriptedProvider([{"total": 1, "city": "Rome"}])
    engine.register(
        Workflow("agent-aio", start="plan", nodes=[agent("plan", model, "Sum", schema=TOTAL, max_turns=1)])
    )
    engine.runner()
    run_id = engine.client.start("agent-aio").run_id
    engine.wait(run_id)

    async def read() -> list[str]:
        async with AsyncTether(engine.client) as client:
            return [m.role for m in await client.conversation(run_id, node_id="plan")]

    assert asyncio.run(read()) == ["user", "assistant"]


def test_agent__an_effect_tool_applying_at_the_step_deadline_is_ambiguous_then_resolved(
    engine: Engine,
) -> None:
    release, returned = threading.Event(), threading.Event()
    calls: list[str] = []

    @tool(effect=True)
    def send(to: str) -> dict[str, str]:
        calls.append(to)
        release.wait(WAIT_S)
        returned.set()
        return {"sent": to}

    model = ScriptedProvider(
        [
            Turn(calls=[ToolCall("send", {"to": "ops"})]),
            lambda messages: {"total": len(messages), "city": str(messages[-1]["content"])},
        ]
    )
    engine.register(
        Workflow(
            "agent-late-effect",
            start="plan",
            nodes=[agent("plan", model, "Send", schema=TOTAL, tools=[send], timeout_s=5)],
        )
    )
    clock = FakeClock()
    engine.runner(clock=clock, lease_ms=60_000, renew_ms=20_000)
    run_id = engine.client.start("agent-late-effect").run_id
    wait_until(lambda: engine.store.effects(run_id=run_id, status="applying"), what="the effect to apply")
    while engine.statuses(run_id) != ("parked", "waiting"):
        clock.advance(0.5)
        time.sleep(0.02)
    view = engine.store.get_run_view(run_id)
    assert view is not None and view.error_code == "effectAmbiguous"
    (attempt,) = engine.attempts(run_id)
    assert attempt.status == "interrupted" and "its outcome is unknown" in (attempt.error_message or "")
    # The abandoned call returns late: its effect stays ambiguous, its result is not recorded.
    release.set()
    assert returned.wait(WAIT_S)
    time.sleep(0.2)  # give a (wrong) late write the time it would take
    (effect,) = engine.store.effects(run_id=run_id)
    assert (effect.status, effect.result) == ("ambiguous", None)
    assert [m.role for m in engine.client.conversation(run_id)] == ["user", "assistant"]

    # The operator says it happened: the conversation goes on with that outcome, and the tool is
    # not called again.
    engine.client.resolve_effect(effect.effect_id, "applied")
    result = engine.wait(run_id)
    assert result.status == "done", result.error_message
    assert calls == ["ops"]
    recorded = engine.client.conversation(run_id)
    assert [m.role for m in recorded] == ["user", "assistant", "tool", "assistant"]
    assert {m.conversation for m in recorded} == {attempt.attempt_id}
    assert [a.status for a in engine.attempts(run_id)] == ["interrupted", "completed"]
