"""Effects through the outbox: applied once with an idempotency key, rejected, ambiguous when a
cancel or a crash catches them mid-apply, and settled by an operator."""

from __future__ import annotations

import threading
import time

import pytest

from tether.engine.graph import Workflow, compute, effect
from tether.engine.runner import RunnerConfig
from tether.errors import Conflict, InvalidInput

from .conftest import Engine, wait_until


def after(ctx):  # type: ignore[no-untyped-def]
    return {"after": ctx.outputs.get("publish")}


def test_effect__applied_once_with_its_idempotency_key(engine: Engine) -> None:
    calls: list[tuple[str, str]] = []

    def publish(ctx, key):  # type: ignore[no-untyped-def]
        calls.append((ctx.node_id, key))
        return {"published": key}

    wf = Workflow(
        "pub",
        start="publish",
        nodes=[effect("publish", publish, effect_type="release.publish"), compute("after", after)],
        edges={"publish": "after"},
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("pub")
    result = engine.wait(run.run_id)
    key = f"{run.run_id}:publish:1"
    assert result.status == "done"
    assert result.output == {"after": {"published": key}}
    assert calls == [("publish", key)]
    (stored,) = engine.store.effects(run_id=run.run_id)
    assert (stored.status, stored.idempotency_key, stored.effect_type) == ("applied", key, "release.publish")
    assert stored.result == {"published": key}
    assert stored.attempt_count == 1
    types = engine.event_types(run.run_id)
    assert types.index("effect.enqueued") < types.index("effect.applying") < types.index("effect.applied")


def test_effect__raising_rejects_the_effect_and_fails_the_run(engine: Engine) -> None:
    def publish(ctx, key):  # type: ignore[no-untyped-def]
        raise PermissionError("remote refused")

    wf = Workflow(
        "pub-fail",
        start="publish",
        nodes=[effect("publish", publish), compute("after", after)],
        edges={"publish": "after"},
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("pub-fail")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert result.error_code == "effectRejected"
    assert "PermissionError: remote refused" in (result.error_message or "")
    (stored,) = engine.store.effects(run_id=run.run_id)
    assert stored.status == "rejected"
    assert "remote refused" in (stored.error_message or "")
    assert [(a.node_id, a.status) for a in engine.attempts(run.run_id)] == [("publish", "failed")]


def test_effect__cancel_mid_apply_leaves_it_ambiguous_and_never_applied(engine: Engine) -> None:
    latch = engine.latch()
    finished = threading.Event()

    def publish(ctx, key):  # type: ignore[no-untyped-def]
        latch.hold()
        finished.set()
        return {"late": True}

    wf = Workflow(
        "pub-cancel",
        start="publish",
        nodes=[effect("publish", publish), compute("after", after)],
        edges={"publish": "after"},
    )
    engine.register(wf)
    runner = engine.runner()
    run = engine.client.start("pub-cancel")
    assert latch.entered.wait(10)
    assert engine.store.effects(run_id=run.run_id)[0].status == "applying"

    assert engine.client.cancel(run.run_id) == "requested"
    result = engine.wait(run.run_id)
    assert (result.status, result.run_state_status) == ("cancelled", "cancelled")
    (stored,) = engine.store.effects(run_id=run.run_id)
    assert stored.status == "ambiguous"

    # The effect function's late result never marks it applied.
    latch.release.set()
    assert finished.wait(10)
    wait_until(lambda: not runner.active_run_ids, what="runner to let go of the run")
    (stored,) = engine.store.effects(run_id=run.run_id)
    assert stored.status == "ambiguous"
    assert stored.result is None
    assert [a.node_id for a in engine.attempts(run.run_id)] == ["publish"]
    assert engine.attempts(run.run_id)[0].status == "cancelled"
    assert "effect.applied" not in engine.event_types(run.run_id)


def _crash_mid_effect(engine: Engine, run_id: str, node_id: str, effect_type: str) -> str:
    """Play a runner that dies while applying an effect: its short lease then simply expires."""
    store, token = engine.store, "dead-runner-token"
    assert store.claim(run_id=run_id, runner_id="host-dead", claim_token=token, lease_ms=300)
    assert store.mark_running(run_id=run_id, claim_token=token)
    store.set_run_status(run_id=run_id, claim_token=token, status="running")
    store.attempt_start(run_id=run_id, claim_token=token, node_id=node_id)
    pending = store.effect_enqueue(
        run_id=run_id,
        claim_token=token,
        effect_type=effect_type,
        idempotency_key=f"{run_id}:{node_id}:1",
        payload={"nodeId": node_id},
    )
    store.effect_begin(run_id=run_id, claim_token=token, effect_id=pending.effect_id)
    wait_until(
        lambda: not store.verify_claim(run_id=run_id, claim_token=token), what="the dead lease to expire"
    )
    return pending.effect_id


def test_effect__ambiguous_after_takeover_parks_until_resolved_applied(engine: Engine) -> None:
    calls: list[str] = []

    def publish(ctx, key):  # type: ignore[no-untyped-def]
        calls.append(key)
        return {"published": True}

    wf = Workflow(
        "pub-crash",
        start="publish",
        nodes=[effect("publish", publish), compute("after", after)],
        edges={"publish": "after"},
    )
    engine.register(wf)
    run = engine.client.start("pub-crash")
    effect_id = _crash_mid_effect(engine, run.run_id, "publish", "workflow.publish")

    engine.runner()
    wait_until(
        lambda: engine.store.get_run_view(run.run_id).error_code == "effectAmbiguous",  # type: ignore[union-attr]
        what="the run to park for an ambiguous effect",
    )
    view = engine.store.get_run_view(run.run_id)
    assert view is not None
    assert (view.status, view.run_state_status) == ("parked", "waiting")
    assert engine.store.effects(run_id=run.run_id)[0].status == "ambiguous"
    assert "node.interrupted" in engine.event_types(run.run_id)
    # An operator must decide first: resume alone is refused.
    with pytest.raises(Conflict, match="is ambiguous: resolve it first"):
        engine.client.resume(run.run_id)
    time.sleep(0.1)  # the runner keeps its hands off the parked run meanwhile
    assert engine.statuses(run.run_id) == ("parked", "waiting")

    resolved = engine.store.effect_resolve(effect_id=effect_id, outcome="applied")
    assert resolved.status == "applied"
    engine.client.resume(run.run_id)
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert calls == []
    assert [a.status for a in engine.attempts(run.run_id, "publish")] == ["interrupted", "completed"]
    assert [a.node_id for a in engine.attempts(run.run_id) if a.status == "completed"] == ["publish", "after"]


def test_effect__ambiguous_resolved_retry_applies_again_with_the_same_key(engine: Engine) -> None:
    calls: list[str] = []

    def publish(ctx, key):  # type: ignore[no-untyped-def]
        calls.append(key)
        return {"published": key}

    wf = Workflow("pub-retry", start="publish", nodes=[effect("publish", publish)])
    engine.register(wf)
    run = engine.client.start("pub-retry")
    effect_id = _crash_mid_effect(engine, run.run_id, "publish", "workflow.publish")
    engine.runner()
    wait_until(
        lambda: engine.store.effects(run_id=run.run_id, status="ambiguous"), what="the effect to be ambiguous"
    )
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to park")
    # Resolving continues the run: no separate resume.
    engine.client.resolve_effect(effect_id, "retry")
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert calls == [f"{run.run_id}:publish:1"]
    (stored,) = engine.store.effects(run_id=run.run_id)
    assert (stored.status, stored.attempt_count) == ("applied", 2)


def test_effect__ambiguous_resolved_rejected_fails_the_run(engine: Engine) -> None:
    calls: list[str] = []
    wf = Workflow(
        "pub-reject", start="publish", nodes=[effect("publish", lambda ctx, key: calls.append(key))]
    )
    engine.register(wf)
    run = engine.client.start("pub-reject")
    effect_id = _crash_mid_effect(engine, run.run_id, "publish", "workflow.publish")
    engine.runner()
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to park")
    engine.client.resolve_effect(effect_id, "rejected")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert result.error_code == "effectRejected"
    assert calls == []


def test_runner_config__refuses_a_margin_that_no_lease_could_satisfy() -> None:
    # A guard as long as the lease would mean no effect could ever be applied.
    with pytest.raises(InvalidInput, match="effect_margin_ms"):
        RunnerConfig(lease_ms=500, effect_margin_ms=1000)
    with pytest.raises(InvalidInput, match="renew_ms"):
        RunnerConfig(lease_ms=1000, renew_ms=900)
    with pytest.raises(InvalidInput, match="lease_ms"):
        RunnerConfig(lease_ms=0)
    assert RunnerConfig(lease_ms=3000, effect_margin_ms=1000).effect_guard_ms == 1000
