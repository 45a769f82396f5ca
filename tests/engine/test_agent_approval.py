"""Tools that need a person's approval: each call becomes a decision, the step waits for it
holding no worker, and goes on from its recorded conversation once it is answered (scripted
provider, both backends)."""

from __future__ import annotations

from tether.engine.graph import Workflow, agent
from tether.engine.providers import ScriptedProvider, ToolCall, Turn
from tether.engine.tools import tool

from .conftest import Engine, wait_until

REPORT = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}


def transfer_flow(name: str, model: ScriptedProvider, sent: list[str], effect: bool = False) -> Workflow:
    @tool(needs_approval=True, effect=effect)
    def transfer(to: str, amount: int) -> dict[str, object]:
        """Move money to an account."""
        sent.append(to)
        return {"moved": amount, "to": to}

    return Workflow(
        name, start="pay", nodes=[agent("pay", model, "Pay the bill", schema=REPORT, tools=[transfer])]
    )


def test_approval__approved_call_runs_once_and_the_model_sees_its_result(engine: Engine) -> None:
    sent: list[str] = []
    model = ScriptedProvider(
        [
            Turn(calls=[ToolCall("transfer", {"to": "acme", "amount": 40}, "c1")]),
            lambda messages: {"note": f"paid {messages[-1]['content']['moved']}"},
        ]
    )
    engine.register(transfer_flow("approve-pay", model, sent, effect=True))
    engine.runner()
    run = engine.client.start("approve-pay")
    [asked] = wait_until(lambda: engine.client.decisions(run.run_id), what="the approval decision")
    assert isinstance(asked.request, dict)
    assert asked.request["options"] == ["approve", "reject"]
    assert "transfer" in asked.request["question"] and '"amount":40' in asked.request["question"]
    assert asked.request["toolCall"]["arguments"] == {"amount": 40, "to": "acme"}
    engine.wait_status(run.run_id, "parked", "waiting")
    assert sent == [] and len(model.turns) == 1, "nothing runs before the answer"
    engine.client.answer(asked.decision_id, "approve")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"note": "paid 40"}
    assert sent == ["acme"]
    assert len(model.turns) == 2, "the recorded turn was not asked again"
    (attempt,) = engine.attempts(run.run_id)
    assert attempt.status == "completed"
    (effect,) = engine.store.effects(run_id=run.run_id)
    assert effect.status == "applied" and effect.effect_type == "tool.transfer"
    tools = [m.body for m in engine.client.conversation(run.run_id) if m.role == "tool"]
    assert tools == [{"toolCallId": "c1", "name": "transfer", "content": {"moved": 40, "to": "acme"}}]


def test_approval__a_rejected_call_goes_back_to_the_model(engine: Engine) -> None:
    sent: list[str] = []
    model = ScriptedProvider(
        [
            Turn(calls=[ToolCall("transfer", {"to": "acme", "amount": 9000}, "c1")]),
            lambda messages: {"note": str(messages[-1]["content"]["error"])},
        ]
    )
    engine.register(transfer_flow("reject-pay", model, sent))
    engine.runner()
    run = engine.client.start("reject-pay")
    [asked] = wait_until(lambda: engine.client.decisions(run.run_id), what="the approval decision")
    engine.client.answer(asked.decision_id, "reject", actor_id="maria")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"note": "the call was rejected by maria: no reason given"}
    assert sent == []
    assert engine.store.effects(run_id=run.run_id) == []


def test_approval__invalid_arguments_go_back_without_asking(engine: Engine) -> None:
    sent: list[str] = []
    model = ScriptedProvider(
        [
            Turn(calls=[ToolCall("transfer", {"to": "acme"}, "c1")]),
            lambda messages: {"note": str(messages[-1]["content"]["error"])},
        ]
    )
    engine.register(transfer_flow("invalid-pay", model, sent))
    engine.runner()
    run = engine.client.start("invalid-pay")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert "invalid arguments for tool transfer" in str(result.output)
    assert engine.client.decisions(run.run_id) == [] and sent == []


def test_approval__two_calls_are_asked_one_after_the_other(engine: Engine) -> None:
    sent: list[str] = []
    model = ScriptedProvider(
        [
            Turn(
                calls=[
                    ToolCall("transfer", {"to": "a", "amount": 1}, "c1"),
                    ToolCall("transfer", {"to": "b", "amount": 2}, "c2"),
                ]
            ),
            lambda messages: {"note": f"{messages[-2]['content']} {messages[-1]['content']}"},
        ]
    )
    engine.register(transfer_flow("two-pay", model, sent))
    engine.runner()
    run = engine.client.start("two-pay")
    [first] = wait_until(lambda: engine.client.decisions(run.run_id), what="the first approval")
    assert first.request["toolCall"]["id"] == "c1"  # type: ignore[index,call-overload]
    engine.client.answer(first.decision_id, "reject")
    second = wait_until(
        lambda: [d for d in engine.client.decisions(run.run_id) if d.outcome is None],
        what="the second approval",
    )[0]
    assert second.request["toolCall"]["id"] == "c2"  # type: ignore[index,call-overload]
    engine.client.answer(second.decision_id, "approve")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert sent == ["b"]
    assert len(model.turns) == 2


def test_approval__a_runner_stopped_while_waiting_hands_over_to_the_next(engine: Engine) -> None:
    sent: list[str] = []
    model = ScriptedProvider(
        [
            Turn(calls=[ToolCall("transfer", {"to": "acme", "amount": 5}, "c1")]),
            {"note": "done"},
        ]
    )
    engine.register(transfer_flow("restart-pay", model, sent))
    first = engine.runner()
    run = engine.client.start("restart-pay")
    [asked] = wait_until(lambda: engine.client.decisions(run.run_id), what="the approval decision")
    engine.wait_status(run.run_id, "parked", "waiting")
    engine.stop(first)
    engine.client.answer(asked.decision_id, "approve")
    engine.runner()
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert sent == ["acme"] and len(model.turns) == 2
    (only,) = engine.store.decisions(run_id=run.run_id)
    assert only.outcome == "accepted" and only.response == "approve"


def test_approval__a_call_id_used_again_in_a_later_turn_is_asked_again(engine: Engine) -> None:
    sent: list[str] = []
    model = ScriptedProvider(
        [
            Turn(calls=[ToolCall("transfer", {"to": "a", "amount": 1}, "c1")]),
            Turn(calls=[ToolCall("transfer", {"to": "b", "amount": 2}, "c1")]),
            {"note": "both"},
        ]
    )
    engine.register(transfer_flow("reused-pay", model, sent))
    engine.runner()
    run = engine.client.start("reused-pay")
    [first] = wait_until(lambda: engine.client.decisions(run.run_id), what="the first approval")
    engine.client.answer(first.decision_id, "approve")
    [second] = wait_until(
        lambda: [d for d in engine.client.decisions(run.run_id) if d.decision_id != first.decision_id],
        what="the second approval",
    )
    assert isinstance(first.request, dict) and isinstance(second.request, dict)
    assert first.request["toolCall"]["turn"] == 2  # type: ignore[call-overload,index]
    assert second.request["toolCall"]["turn"] == 4  # type: ignore[call-overload,index]
    assert sent == ["a"], "the second call waits for its own answer"
    engine.client.answer(second.decision_id, "approve")
    assert engine.wait(run.run_id).status == "done"
    assert sent == ["a", "b"]
