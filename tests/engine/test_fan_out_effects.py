"""Effects inside a fan-out's items and a parallel node's branches: each item's effect goes
through the outbox with its own idempotency key, applied at most once; a crash, a deadline or a
cancel that catches one applying leaves it ambiguous for a person, never applied twice."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from tether.engine.context import Context
from tether.engine.graph import Workflow, compute, effect, fan_out, parallel
from tether.errors import InvalidInput
from tether.store import SettledTry

from .conftest import Engine, wait_until


def _sends(calls: Counter[Any], lock: threading.Lock) -> Any:
    def send(ctx: Context, item: int, key: str) -> dict[str, Any]:
        with lock:
            calls[key] += 1
        return {"sent": item, "key": key}

    return send


def test_fan_out_effect__each_item_applied_once_with_its_own_key(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    send = _sends(calls, threading.Lock())
    engine.register(
        Workflow(
            "mail",
            start="each",
            nodes=[
                fan_out("each", send, items=lambda ctx: [10, 11, 12], effect=True, effect_type="mail.send")
            ],
        )
    )
    engine.runner()
    run = engine.client.start("mail")
    result = engine.wait(run.run_id)
    keys = [f"{run.run_id}:each[{n}]:1" for n in range(3)]
    assert result.status == "done", result.error_message
    assert result.output == [{"sent": 10 + n, "key": key} for n, key in enumerate(keys)]
    assert calls == Counter(keys)
    effects = sorted(engine.store.effects(run_id=run.run_id), key=lambda e: e.idempotency_key)
    assert [(e.idempotency_key, e.status, e.effect_type, e.attempt_count) for e in effects] == [
        (key, "applied", "mail.send", 1) for key in keys
    ]
    assert [e.result for e in effects] == result.output
    completed = Counter(a.node_id for a in engine.attempts(run.run_id) if a.status == "completed")
    assert completed == Counter(["each", "each[0]", "each[1]", "each[2]"])


def test_fan_out_effect__an_item_raising_is_rejected_not_retried_and_fails_the_run(engine: Engine) -> None:
    calls: Counter[int] = Counter()

    def send(ctx: Context, item: int, key: str) -> int:
        calls[item] += 1
        if item == 1:
            raise PermissionError("the mail server refused")
        return item

    engine.register(
        Workflow(
            "mail-refused",
            start="each",
            nodes=[fan_out("each", send, items=lambda ctx: [0, 1, 2], parallelism=1, effect=True)],
        )
    )
    engine.runner()
    run = engine.client.start("mail-refused")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert "each[1] failed" in (result.error_message or "")
    assert calls == Counter({0: 1, 1: 1}), "item 1 is not retried and no item starts after it"
    statuses = {e.idempotency_key: e.status for e in engine.store.effects(run_id=run.run_id)}
    assert statuses == {f"{run.run_id}:each[0]:1": "applied", f"{run.run_id}:each[1]:1": "rejected"}
    rejected = engine.store.effects(run_id=run.run_id, status="rejected")[0]
    assert "the mail server refused" in (rejected.error_message or "")
    assert [a.status for a in engine.attempts(run.run_id, "each[1]")] == ["failed"]


def _crash_mid_fan_out(engine: Engine, run_id: str, done: int, applying: int) -> str:
    """Play a runner that dies in the middle of an effect fan-out: items below ``done`` applied
    and recorded, item ``applying`` begun; its short lease then expires. The applying effect."""
    store, token = engine.store, "dead-runner-token"
    assert store.claim(run_id=run_id, runner_id="host-dead", claim_token=token, lease_ms=300)
    assert store.mark_running(run_id=run_id, claim_token=token)
    store.set_run_status(run_id=run_id, claim_token=token, status="running")
    store.attempt_start(run_id=run_id, claim_token=token, node_id="each")

    def begin(item: int) -> str:
        pending = store.effect_enqueue(
            run_id=run_id,
            claim_token=token,
            effect_type="workflow.each",
            idempotency_key=f"{run_id}:each[{item}]:1",
            payload={"nodeId": f"each[{item}]"},
        )
        store.effect_begin(run_id=run_id, claim_token=token, effect_id=pending.effect_id)
        return pending.effect_id

    for item in range(done):
        effect_id = begin(item)
        with store.transaction():
            store.effect_finish(
                run_id=run_id, claim_token=token, effect_id=effect_id, applied=True, result={"early": item}
            )
            store.attempt_record(
                run_id=run_id,
                claim_token=token,
                tries=[SettledTry(f"each[{item}]", "completed", 1, {"early": item}, None)],
            )
    caught = begin(applying)
    wait_until(
        lambda: not store.verify_claim(run_id=run_id, claim_token=token), what="the dead lease to expire"
    )
    return caught


def _fan_flow(engine: Engine, name: str, calls: Counter[str]) -> None:
    engine.register(
        Workflow(
            name,
            start="each",
            nodes=[
                fan_out("each", _sends(calls, threading.Lock()), items=lambda ctx: [0, 1, 2, 3], effect=True)
            ],
        )
    )


def test_fan_out_effect__a_crash_mid_apply_leaves_that_item_ambiguous_until_a_person_says_applied(
    engine: Engine,
) -> None:
    calls: Counter[str] = Counter()
    _fan_flow(engine, "mail-crash", calls)
    run = engine.client.start("mail-crash")
    caught = _crash_mid_fan_out(engine, run.run_id, done=2, applying=2)
    engine.runner()
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to park")
    assert engine.store.get_run_view(run.run_id).error_code == "effectAmbiguous"  # type: ignore[union-attr]
    assert [e.effect_id for e in engine.store.effects(run_id=run.run_id, status="ambiguous")] == [caught]
    assert not calls, "nothing runs while an item's effect is ambiguous"

    engine.client.resolve_effect(caught, "applied")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    keys = [f"{run.run_id}:each[{n}]:1" for n in range(4)]
    assert result.output == [{"early": 0}, {"early": 1}, None, {"sent": 3, "key": keys[3]}]
    assert calls == Counter([keys[3]]), "only the item never begun is applied"
    assert Counter(e.status for e in engine.store.effects(run_id=run.run_id)) == Counter({"applied": 4})


def test_fan_out_effect__an_ambiguous_item_resolved_retry_is_applied_again_with_its_key(
    engine: Engine,
) -> None:
    calls: Counter[str] = Counter()
    _fan_flow(engine, "mail-retry", calls)
    run = engine.client.start("mail-retry")
    caught = _crash_mid_fan_out(engine, run.run_id, done=1, applying=3)
    engine.runner()
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to park")
    engine.client.resolve_effect(caught, "retry")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    keys = [f"{run.run_id}:each[{n}]:1" for n in range(4)]
    assert calls == Counter(keys[1:])
    assert [e.attempt_count for e in engine.store.effects(run_id=run.run_id) if e.effect_id == caught] == [2]


def test_fan_out_effect__an_ambiguous_item_resolved_rejected_fails_the_node(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    _fan_flow(engine, "mail-reject", calls)
    run = engine.client.start("mail-reject")
    caught = _crash_mid_fan_out(engine, run.run_id, done=0, applying=0)
    engine.runner()
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to park")
    engine.client.resolve_effect(caught, "rejected")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert "each[0] failed" in (result.error_message or "")
    assert f"effect {run.run_id}:each[0]:1 was rejected" in (result.error_message or "")
    assert f"{run.run_id}:each[0]:1" not in calls, "a rejected effect is not applied again"


def test_fan_out_effect__an_item_past_its_deadline_is_ambiguous_once_the_others_ended(engine: Engine) -> None:
    released = threading.Event()
    calls: Counter[int] = Counter()
    lock = threading.Lock()

    def send(ctx: Context, item: int, key: str) -> int:
        with lock:
            calls[item] += 1
        if item == 1:
            released.wait(10)  # hangs past its deadline
        return item

    engine.register(
        Workflow(
            "mail-late",
            start="each",
            nodes=[
                fan_out(
                    "each", send, items=lambda ctx: [0, 1, 2, 3], parallelism=2, timeout_s=0.3, effect=True
                )
            ],
        )
    )
    engine.runner()
    run = engine.client.start("mail-late")
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to park")
    released.set()
    late = f"{run.run_id}:each[1]:1"
    statuses = {e.idempotency_key: e.status for e in engine.store.effects(run_id=run.run_id)}
    assert statuses[late] == "ambiguous"
    assert all(status == "applied" for key, status in statuses.items() if key != late)
    (node,) = engine.attempts(run.run_id, "each")
    assert node.status == "interrupted"
    assert "its outcome is unknown" in (node.error_message or "")
    assert not engine.attempts(run.run_id, "each[1]"), "no try recorded: the effect holds its story"

    (ambiguous,) = engine.store.effects(run_id=run.run_id, status="ambiguous")
    engine.client.resolve_effect(ambiguous.effect_id, "applied")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output[1] is None  # type: ignore[index]
    assert all(count == 1 for count in calls.values()), "no item applied twice"
    assert set(calls) == {0, 1, 2, 3}


def test_fan_out_effect__a_cancel_stops_items_beginning_their_effect(engine: Engine) -> None:
    latch = engine.latch()
    started: Counter[int] = Counter()

    def send(ctx: Context, item: int, key: str) -> int:
        started[item] += 1
        latch.hold()
        return item

    engine.register(
        Workflow(
            "mail-cancel",
            start="each",
            nodes=[fan_out("each", send, items=lambda ctx: [0, 1, 2], parallelism=1, effect=True)],
        )
    )
    engine.runner()
    run = engine.client.start("mail-cancel")
    assert latch.entered.wait(10)
    engine.client.cancel(run.run_id)
    result = engine.wait(run.run_id)
    latch.release.set()
    assert result.status == "cancelled"
    (stored,) = engine.store.effects(run_id=run.run_id)
    assert (stored.idempotency_key, stored.status) == (f"{run.run_id}:each[0]:1", "ambiguous")
    assert started == Counter({0: 1})
    assert not engine.attempts(run.run_id, "each[0]")


def test_parallel__effect_branches_apply_once_beside_compute_branches(engine: Engine) -> None:
    calls: list[str] = []

    def charge(ctx: Context, key: str) -> dict[str, str]:
        calls.append(key)
        return {"charged": key}

    engine.register(
        Workflow(
            "checkout",
            start="both",
            nodes=[
                parallel(
                    "both",
                    [
                        effect("charge", charge, effect_type="card.charge"),
                        compute("receipt", lambda ctx: "r"),
                    ],
                )
            ],
        )
    )
    engine.runner()
    run = engine.client.start("checkout")
    result = engine.wait(run.run_id)
    key = f"{run.run_id}:both[charge]:1"
    assert result.status == "done", result.error_message
    assert result.output == {"charge": {"charged": key}, "receipt": "r"}
    assert calls == [key]
    (stored,) = engine.store.effects(run_id=run.run_id)
    assert (stored.idempotency_key, stored.status, stored.effect_type) == (key, "applied", "card.charge")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: fan_out("f", lambda c, i, k: i, items=lambda c: [], effect=True, retries=1),
            "never retried",
        ),
        (lambda: fan_out("f", lambda c, i: i, items=lambda c: [], effect_type="x"), "effect=True"),
        (lambda: fan_out("f", lambda c, i: i, items=lambda c: [], effect="yes"), "True or False"),  # type: ignore[arg-type]
        (
            lambda: parallel("p", [effect("a", lambda c, k: k), compute("b", len)], join=1),
            "joins them all",
        ),
    ],
)
def test_fan_out_effect__refuses_bad_arguments_with_what_to_fix(build: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        build()


def test_fan_out_effect__the_effect_form_is_part_of_the_definition() -> None:
    plain = fan_out("f", lambda c, i: i, items=lambda c: [])
    assert "effectType" not in plain.spec, "a fan-out without effects keeps its digest"
    assert fan_out("f", lambda c, i, k: i, items=lambda c: [], effect=True).spec["effectType"] == "workflow.f"


def test_fan_out_effect__a_stopping_runner_lets_applying_items_settle_and_the_next_applies_the_rest(
    engine: Engine,
) -> None:
    calls: Counter[int] = Counter()
    latch = engine.latch()

    def send(ctx: Context, item: int, key: str) -> int:
        calls[item] += 1
        if item == 0:
            latch.hold()
        return item

    engine.register(
        Workflow(
            "mail-stop",
            start="each",
            nodes=[fan_out("each", send, items=lambda ctx: [0, 1, 2], parallelism=1, effect=True)],
        )
    )
    first = engine.runner()
    run = engine.client.start("mail-stop")
    assert latch.entered.wait(10)
    first.stop()
    latch.release.set()
    engine.stop(first)
    assert engine.statuses(run.run_id) == ("parked", "running")
    assert [(e.idempotency_key, e.status) for e in engine.store.effects(run_id=run.run_id)] == [
        (f"{run.run_id}:each[0]:1", "applied")
    ], "the item applying when the runner stopped settled; no other began"
    engine.runner()
    result = engine.wait(run.run_id)
    assert (result.status, result.output) == ("done", [0, 1, 2])
    assert calls == Counter({0: 1, 1: 1, 2: 1})


def test_fan_out_effect__a_rejected_item_routed_to_error_carries_its_error(engine: Engine) -> None:
    def send(ctx: Context, item: int, key: str) -> int:
        if item == 1:
            raise ValueError("no such address")
        return item

    engine.register(
        Workflow(
            "mail-routed",
            start="each",
            nodes=[
                fan_out("each", send, items=lambda ctx: [0, 1], parallelism=1, effect=True),
                compute("fallback", lambda ctx: ctx.outputs["each"]["errors"]),
            ],
            edges={"each.error": "fallback"},
        )
    )
    engine.runner()
    run = engine.client.start("mail-routed")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"1": "ValueError: no such address"}
    statuses = sorted(e.status for e in engine.store.effects(run_id=run.run_id))
    assert statuses == ["applied", "rejected"]
