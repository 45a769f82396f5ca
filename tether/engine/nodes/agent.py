"""``agent``: ask the model provider for output matching the node's schema: in one call, or in a
conversation with tools whose every message is recorded as it comes (``tether.engine.agentloop``)."""

from __future__ import annotations

from tether.engine.agentloop import Budgets, Conversation, conversation_of, converse
from tether.engine.context import Context
from tether.engine.failures import summary
from tether.engine.graph import Node, Workflow
from tether.engine.nodes.base import StepHost
from tether.engine.providers import Turn
from tether.engine.schema import errors as schema_errors
from tether.engine.worker.deadlines import RunTimedOut, StepTimedOut
from tether.engine.worker.state import ActiveRun, Parked
from tether.errors import ClaimLost
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

        return converse(
            conversation,
            prompt,
            turn,
            node.tools,
            schema,
            budgets,
            ctx,
            lambda call: host.call_step(active, call),
        )

    retries = int(node.spec["retries"])
    try:
        output = host.call_with_deadline(active, node, ctx, talk if talks else ask)
        canonical_json(output)
        problems = schema_errors(output, schema)
        if problems:
            raise ValueError("model output does not match the schema: " + "; ".join(problems[:5]))
    except ClaimLost:
        raise
    except StepTimedOut as late:
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
