"""``agent``: ask the model provider for output matching the node's schema: in one call, or in a
conversation with tools whose every message is recorded as it comes (``tether.engine.agentloop``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tether.engine.agentloop import Budgets, Conversation, EffectApplier, conversation_of, converse
from tether.engine.context import Context
from tether.engine.failures import summary
from tether.engine.graph import Node, Workflow
from tether.engine.nodes.base import StepHost
from tether.engine.providers import Turn
from tether.engine.schema import errors as schema_errors
from tether.engine.tools import Tool
from tether.engine.worker.deadlines import RunTimedOut, StepTimedOut
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
    attempt = host.begin_node(active, ctx.node_id)
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

        def turn(messages: list[dict[str, Json]]) -> Turn:
            answer: Turn = host.call_step(active, node.provider.turn, messages, described, schema)
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
        )

    retries = int(node.spec["retries"])
    try:
        output = host.call_with_deadline(active, node, ctx, talk if talks else ask)
        canonical_json(output)
        problems = schema_errors(output, schema)
        if problems:
            raise ValueError("model output does not match the schema: " + "; ".join(problems[:5]))
    except (ClaimLost, CancelRequested, LeaseUnproven):
        raise  # the runner's to handle: let go, cancel, hand back (the conversation goes on)
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
        if active.cancelled.is_set():
            raise Parked("step ended by its run's cancel") from None
        host.fail_node(
            active,
            node,
            attempt,
            summary(error),
            failures,
            retries,
            1.0,
            raised=error,
        )
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
