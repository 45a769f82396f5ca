"""``effect``: apply an external effect at most once, keyed by run, node and visit."""

from __future__ import annotations

from tether.engine.context import Context
from tether.engine.failures import story, summary
from tether.engine.graph import Node, Workflow
from tether.engine.nodes.base import StepHost
from tether.engine.worker.deadlines import RunTimedOut, StepTimedOut, routes
from tether.engine.worker.state import ActiveRun, Parked
from tether.errors import LeaseUnproven
from tether.store import Attempt
from tether.values import canonical_json


def run(
    host: StepHost,
    active: ActiveRun,
    wf: Workflow,
    node: Node,
    ctx: Context,
    failures: int,
    waiting: Attempt | None,
) -> None:
    store, run_id, token = host.store, active.run_id, active.token
    visit = sum(1 for a in store.attempts(run_id) if a.node_id == ctx.node_id and a.status == "completed") + 1
    key = f"{run_id}:{ctx.node_id}:{visit}"
    attempt = host.begin_node(active, ctx.node_id)
    effect = store.effect_enqueue(
        run_id=run_id,
        claim_token=token,
        effect_type=str(node.spec["effectType"]),
        idempotency_key=key,
        payload={"nodeId": ctx.node_id},
    )
    if effect.status == "applied":
        host.complete_node(active, attempt, effect.result)
        return
    if effect.status != "pending":
        with store.transaction():
            store.attempt_finish(
                run_id=run_id,
                claim_token=token,
                attempt_id=attempt.attempt_id,
                status="failed",
                error_message=f"effect {effect.status}",
            )
            host.ensure(
                store.fail(
                    run_id=run_id,
                    claim_token=token,
                    error_code="effectRejected",
                    error_message=(
                        f"Effect {key} was {effect.status}: {effect.error_message or 'no detail'}"
                    ),
                )
            )
        raise Parked("effect not applied")
    if not active.provably_live(host.config.effect_guard_ms, host.clock.monotonic()):
        raise LeaseUnproven(f"the lease on {run_id} cannot be proven live; effect {key} was not applied")
    store.effect_begin(run_id=run_id, claim_token=token, effect_id=effect.effect_id)
    fn = node.fn
    assert fn is not None
    try:
        result = host.call_with_deadline(active, node, ctx, lambda: host.call_step(active, fn, ctx, key))
        canonical_json(result)
    except StepTimedOut as late:
        # It may have happened, or may yet: its outcome is unknown, as after a crash mid-apply.
        with store.transaction():
            store.attempt_finish(
                run_id=run_id,
                claim_token=token,
                attempt_id=attempt.attempt_id,
                status="timed_out",
                error_message=f"effect {key} {late}; its outcome is unknown",
            )
            store.effect_mark_ambiguous(run_id=run_id, claim_token=token, effect_id=effect.effect_id)
            host.ensure(store.park_for_ambiguous_effect(run_id=run_id, claim_token=token))
        raise Parked("effect timed out: ambiguous") from None
    except RunTimedOut:
        host.time_out_run(active)  # the effect caught applying becomes ambiguous with the run
        return
    # BaseException too: a step's sys.exit(), KeyboardInterrupt or GeneratorExit is that step's
    # failure, never the end of the runner's thread (run threads get no signals: these come
    # from the step's own code).
    except BaseException as error:
        message = summary(error)
        # A rejected effect is not retried (it may have done part of its work): the graph may
        # route it to a recovery step on its ``error`` exit, else the run fails.
        routed = routes(wf, ctx.node_id, "error")
        with store.transaction():
            store.effect_finish(
                run_id=run_id,
                claim_token=token,
                effect_id=effect.effect_id,
                applied=False,
                error_message=message,
            )
            store.attempt_finish(
                run_id=run_id,
                claim_token=token,
                attempt_id=attempt.attempt_id,
                status="failed",
                exit_name="error" if routed else None,
                error_message=story(error),
            )
            if routed:
                return
            host.ensure(
                store.fail(
                    run_id=run_id,
                    claim_token=token,
                    error_code="effectRejected",
                    error_message=f"Effect {key} was rejected: {message}",
                )
            )
        raise Parked("effect rejected") from None
    with store.transaction():
        store.effect_finish(
            run_id=run_id, claim_token=token, effect_id=effect.effect_id, applied=True, result=result
        )
        host.complete_node(active, attempt, result)
