"""``agent``: ask the model provider for output matching the node's schema: in one call, or in a
conversation with tools whose every message is recorded as it comes (``tether.engine.agentloop``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tether.engine.agentloop import (
    Approver,
    Budgets,
    Conversation,
    EffectApplier,
    conversation_of,
    converse,
)
from tether.engine.context import Context
from tether.engine.failures import summary
from tether.engine.graph import Node, Workflow
from tether.engine.nodes.base import StepHost, fail_step
from tether.engine.providers import Turn, streams_text
from tether.engine.schema import errors as schema_errors
from tether.engine.tools import Tool
from tether.engine.worker.deadlines import RunTimedOut, StepTimedOut
from tether.engine.worker.livetext import LiveTextReporter
from tether.engine.worker.state import ActiveRun, Parked
from tether.errors import CancelRequested, ClaimLost, LeaseUnproven
from tether.store import Attempt
from tether.values import Json, canonical_json


def run(
    host: StepHost,
    active: ActiveRun,
    wf: Workflow,
    node: Node,
    ctx: Context,
    failures: int,
    waiting: Attempt | None,
) -> None:
    if waiting is None:
        attempt = host.begin_node(active, ctx.node_id)
    else:
        # Parked for a tool call's approval: the same attempt goes on with its conversation.
        attempt = waiting
        host.resume_running(active)
    schema = node.spec["schema"]
    assert isinstance(schema, dict)
    fn = node.fn
    talks = isinstance(node.spec.get("conversation"), dict)

    def prompt() -> str:
        # Inside the step: a broken prompt function fails the attempt, not the runner.
        return str(host.call_step(active, fn, ctx)) if fn is not None else str(node.spec["prompt"])

    def ask() -> Json:
        answer: Json = host.call_step(active, node.provider.complete, prompt(), schema)
        return answer

    def talk() -> Json:
        limits = node.spec["conversation"]
        assert isinstance(limits, dict)
        budgets = Budgets(
            max_turns=int(limits["maxTurns"]),
            max_invalid=int(limits["maxInvalid"]),
            max_tokens=None if limits.get("maxTokens") is None else int(limits["maxTokens"]),
        )
        described = [t.describe() for t in node.tools]
        conversation = Conversation(
            host.store,
            active.run_id,
            active.token,
            attempt,
            conversation_of(host.store.attempts(active.run_id), attempt),
        )

        streams = streams_text(node.provider)

        def turn(messages: list[dict[str, Json]]) -> Turn:
            ask_turn = node.provider.turn
            if streams:
                # The text the model streams goes to the journal as it comes, rate-limited.
                reporter = LiveTextReporter(
                    host.store,
                    active,
                    attempt_id=attempt.attempt_id,
                    node_id=ctx.node_id,
                    conversation=conversation.conversation,
                    index=len(messages) + 1,
                    clock=host.clock,
                )
                ask_turn = functools.partial(ask_turn, on_text=reporter)
            answer: Turn = host.call_step(active, ask_turn, messages, described, schema)
            return answer

        def invoke(call: Callable[[], Any]) -> Any:
            return host.call_step(active, call)

        return converse(
            conversation,
            prompt,
            turn,
            node.tools,
            schema,
            budgets,
            ctx,
            invoke,
            outbox(host, active, ctx, conversation.conversation, invoke),
            approvals(host, active, ctx, conversation.conversation, attempt),
        )

    retries = int(node.spec["retries"])
    try:
        output = host.call_with_deadline(active, node, ctx, talk if talks else ask)
        canonical_json(output)
        problems = schema_errors(output, schema)
        if problems:
            raise ValueError("model output does not match the schema: " + "; ".join(problems[:5]))
    except (ClaimLost, CancelRequested, LeaseUnproven, Parked):
        # The runner's to handle: let go, cancel, hand back, wait for an approval (the
        # conversation goes on).
        raise
    except StepTimedOut as late:
        ambiguous(host, active, attempt, str(late))
        host.time_out_node(active, node, attempt, str(late), failures, retries, 1.0)
        return
    except RunTimedOut:
        host.time_out_run(active)
        return
    # BaseException too: a step's sys.exit(), KeyboardInterrupt or GeneratorExit is that step's
    # failure, never the end of the runner's thread (run threads get no signals: these come
    # from the step's own code).
    except BaseException as error:
        fail_step(host, active, node, attempt, error, failures, retries, 1.0)
        return
    host.complete_node(active, attempt, output)


def outbox(
    host: StepHost,
    active: ActiveRun,
    ctx: Context,
    conversation: str,
    invoke: Callable[[Callable[[], Any]], Any],
) -> EffectApplier:
    """How the step applies its effect tools' calls: through the effects outbox, as an
    ``effect`` step does. Each call is an effect keyed by the run, the node, the conversation and
    the call: recorded ``pending``, then ``applying`` while the function runs, then ``applied``
    with its result (or ``rejected``: its error goes back to the model). A call asked again (the
    step was taken over before its result was recorded) finds its effect: an applied one's
    result is reused, never applied twice; a rejected one's error goes back to the model."""
    store, run_id, token, node_id = host.store, active.run_id, active.token, ctx.node_id

    def apply(tool: Tool, call_id: str, arguments: dict[str, Json]) -> Json:
        key = f"{run_id}:{node_id}:{conversation}:{call_id}"
        effect = store.effect_enqueue(
            run_id=run_id,
            claim_token=token,
            effect_type=f"tool.{tool.name}",
            idempotency_key=key,
            payload={"nodeId": node_id, "tool": tool.name, "arguments": arguments},
        )
        if effect.status == "applied":
            return effect.result
        if effect.status != "pending":
            return {"error": f"the call was {effect.status}: {effect.error_message or 'no detail'}"}
        if not active.provably_live(host.config.effect_guard_ms, host.clock.monotonic()):
            raise LeaseUnproven(f"the lease on {run_id} cannot be proven live; effect {key} was not applied")
        # A step abandoned at its deadline (or cancelled) begins no effect.
        ctx.raise_if_cancelled()
        store.effect_begin(run_id=run_id, claim_token=token, effect_id=effect.effect_id)
        try:
            result = tool.run(arguments, invoke, key)
        except Exception as error:
            store.effect_finish(
                run_id=run_id,
                claim_token=token,
                effect_id=effect.effect_id,
                applied=False,
                error_message=summary(error),
            )
            return {"error": summary(error)}
        store.effect_finish(
            run_id=run_id, claim_token=token, effect_id=effect.effect_id, applied=True, result=result
        )
        return result

    return apply


def approvals(
    host: StepHost, active: ActiveRun, ctx: Context, conversation: str, attempt: Attempt
) -> Approver:
    """How the step asks a person about a ``needs_approval`` tool's call: a decision (options
    ``approve`` and ``reject``) whose request names the conversation, the model's turn and the
    call, so that the step, taken up again, finds the decision of the call it is at. The first
    time, the decision is opened and the run parks waiting for it (one transaction); once it is
    answered, the run is resumed and the step goes on from its recorded conversation to this
    call again, which now finds the answer: ``None`` when approved, the model's error when
    rejected."""
    store, run_id, token, node_id = host.store, active.run_id, active.token, ctx.node_id

    def wait(tool: Tool, turn: int, call_id: str, arguments: dict[str, Json]) -> str | None:
        call: dict[str, Json] = {"conversation": conversation, "turn": turn, "id": call_id}
        asked = [
            d for d in store.decisions(run_id=run_id) if d.node_id == node_id and _about(d.request, call)
        ]
        if asked and asked[-1].outcome is not None:
            answered = asked[-1]
            if answered.outcome == "accepted" and answered.response == "approve":
                return None
            who = answered.actor_id or answered.provenance or "nobody"
            return f"the call was rejected by {who}: {answered.reason or 'no reason given'}"
        with store.transaction():
            if asked:  # still open: the run was taken up before the answer; wait again
                decision = asked[-1]
            else:
                request: dict[str, Json] = {
                    "question": f"Approve the call of tool {tool.name} with arguments "
                    f"{canonical_json(arguments)}?",
                    "options": ["approve", "reject"],
                    "schema": None,
                    "default": None,
                    "nodeId": node_id,
                    "toolCall": {**call, "tool": tool.name, "arguments": arguments},
                }
                decision = store.decision_open(
                    run_id=run_id, claim_token=token, node_id=node_id, request=request
                )
                store.message_send(
                    run_id=run_id,
                    claim_token=token,
                    kind="decision",
                    payload={**request, "decisionId": decision.decision_id, "attemptId": attempt.attempt_id},
                )
            if store.run_status(run_id) != "waiting":
                store.set_run_status(
                    run_id=run_id,
                    claim_token=token,
                    status="waiting",
                    detail=f"waiting for decision {decision.decision_id} (approval of tool {tool.name})",
                )
            host.ensure(store.park(run_id=run_id, claim_token=token))
        raise Parked(f"waiting for the approval of a call of tool {tool.name}")

    return wait


def _about(request: Json, call: dict[str, Json]) -> bool:
    """Whether a decision's ``request`` asks about the tool call ``call`` names."""
    asked = request.get("toolCall") if isinstance(request, dict) else None
    return isinstance(asked, dict) and all(asked.get(key) == value for key, value in call.items())


def ambiguous(host: StepHost, active: ActiveRun, attempt: Attempt, error: str) -> None:
    """A step abandoned at its deadline while an effect tool's call was applying: that effect's
    outcome is unknown, as after a crash mid-apply, and is handled the same way. The attempt is
    ``interrupted`` (so the attempt after the operator's decision continues its conversation and
    finds the call's effect settled, never calling the tool again by itself), the effect becomes
    ``ambiguous`` and the run waits for an operator (raises ``Parked``). Without such a call,
    returns."""
    store, run_id, token = host.store, active.run_id, active.token
    applying = store.effects(run_id=run_id, status="applying")
    if not applying:
        return
    with store.transaction():
        store.attempt_finish(
            run_id=run_id,
            claim_token=token,
            attempt_id=attempt.attempt_id,
            status="interrupted",
            error_message=f"{error} while a tool's effect was applying; its outcome is unknown",
        )
        for effect in applying:
            store.effect_mark_ambiguous(run_id=run_id, claim_token=token, effect_id=effect.effect_id)
        host.ensure(store.park_for_ambiguous_effect(run_id=run_id, claim_token=token))
    raise Parked("agent step timed out while an effect tool was applying: ambiguous")
