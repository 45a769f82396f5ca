"""Concurrency limits through the client and in-process runners: the key computed at start (and a
start without it refused, writing nothing), the limit in the definition's digest, restarts and
forks keeping the limit, and runners that run a key's runs one at a time."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.store.conftest import snapshot
from tether import Limit, Workflow, compute
from tether.engine.context import Context
from tether.errors import InvalidInput

from .conftest import Engine, wait_until


def one_step(name: str, limit: Limit | None, fn: Any = None) -> Workflow:
    return Workflow(name, start="a", nodes=[compute("a", fn or (lambda ctx: 1))], concurrency=limit)


def stored_limit(engine: Engine, run_id: str) -> tuple[Any, Any]:
    ((key, cap),) = engine.sql("SELECT limit_key, limit_max FROM run_queue WHERE run_id = ?", run_id)
    return key, cap


def test_start__stores_the_key_computed_from_the_input(engine: Engine) -> None:
    engine.register(
        one_step("field", Limit(max=1, key="customer_id")),
        one_step("path", Limit(max=2, key="$.order.customer")),
        one_step("fn", Limit(max=3, key=lambda data: data["region"].upper())),
        one_step("all", Limit(max=5)),
        one_step("none", None),
    )
    client = engine.client
    assert stored_limit(engine, client.start("field", {"customer_id": "acme"}).run_id) == (
        "field:customer_id=acme",
        1,
    )
    assert stored_limit(engine, client.start("path", {"order": {"customer": 7}}).run_id) == (
        "path:$.order.customer=7",
        2,
    )
    assert stored_limit(engine, client.start("fn", {"region": "eu"}).run_id) == ("fn:<lambda>=EU", 3)
    assert stored_limit(engine, client.start("all", None).run_id) == ("all", 5)
    assert stored_limit(engine, client.start("none", None).run_id) == (None, None)


@pytest.mark.parametrize(
    ("limit", "given", "message"),
    [
        (Limit(max=1, key="customer_id"), {"other": 1}, "the input has no field 'customer_id'"),
        (Limit(max=1, key="customer_id"), None, "the input has no field 'customer_id'"),
        (Limit(max=1, key="$.order.customer"), {"order": {}}, r"\$.order has no field 'customer'"),
        (Limit(max=1, key="customer_id"), {"customer_id": {"a": 1}}, "non-empty string or a whole number"),
        (Limit(max=1, key=lambda data: data["x"]), {}, "computing the key from the input failed: KeyError"),
    ],
)
def test_start__without_the_key_is_refused_and_writes_nothing(
    engine: Engine, limit: Limit, given: Any, message: str
) -> None:
    engine.register(one_step("keyed", limit))
    before = snapshot(engine.store)
    with pytest.raises(InvalidInput, match=message) as caught:
        engine.client.start("keyed", given)
    assert "Workflow keyed limits its runs per" in caught.value.message
    assert snapshot(engine.store) == before


def test_limit__refuses_a_bad_definition() -> None:
    with pytest.raises(InvalidInput, match="max must be a whole number"):
        Limit(max=0)
    with pytest.raises(InvalidInput, match="must be an input field name"):
        Limit(max=1, key="not a field")
    with pytest.raises(InvalidInput, match="must be an input field name"):
        Limit(max=1, key=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="concurrency must be a Limit"):
        Workflow("w", start="a", nodes=[compute("a", lambda ctx: 1)], concurrency=5)  # type: ignore[arg-type]


def region(data: Any) -> str:
    return str(data["region"])


def _other() -> Any:
    def region(data: Any) -> str:  # the same name, other code
        return str(data["zone"])

    return region


other_region = _other()


def test_digest__covers_the_limit_and_its_key_function() -> None:
    plain = one_step("w", None).digest
    capped = one_step("w", Limit(max=2)).digest
    keyed = one_step("w", Limit(max=2, key="customer_id")).digest
    assert len({plain, capped, keyed, one_step("w", Limit(max=3)).digest}) == 4
    by_function = one_step("w", Limit(max=2, key=region))
    recorded = by_function.snapshot()["concurrency"]
    assert isinstance(recorded, dict) and recorded["max"] == 2
    assert str(recorded["key"]["function"]).startswith("region@")  # type: ignore[index]

    assert one_step("w", Limit(max=2, key=other_region)).digest != by_function.digest
    # A workflow without a limit keeps the digest it had before limits existed.
    assert "concurrency" not in one_step("w", None).snapshot()


def test_restart__computes_the_key_from_the_new_input(engine: Engine) -> None:
    engine.register(one_step("keyed", Limit(max=1, key="customer_id")))
    first = engine.client.start("keyed", {"customer_id": "acme"}).run_id
    second = engine.client.start("keyed", {"customer_id": "acme"}).run_id
    runner = engine.runner()
    engine.wait(first)
    engine.wait(second)
    engine.stop(runner)
    again = engine.client.restart(first, input={"customer_id": "globex"})
    assert stored_limit(engine, again.run_id) == ("keyed:customer_id=globex", 1)
    before = snapshot(engine.store)
    with pytest.raises(InvalidInput, match="no field 'customer_id'"):
        engine.client.restart(second, input={"nope": 1})
    with pytest.raises(InvalidInput, match="no field 'customer_id'"):
        engine.client.restart(second, input={"nope": 1}, from_node="a")
    assert snapshot(engine.store) == before
    fork = engine.client.restart(second, from_node="a")
    assert stored_limit(engine, fork.run_id) == ("keyed:customer_id=acme", 1)


def test_runners__run_one_key_one_at_a_time_and_other_keys_alongside(engine: Engine) -> None:
    lock = threading.Lock()
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    both_keys_at_once = threading.Event()
    release = threading.Event()

    def work(ctx: Context) -> int:
        key = ctx.input["customer_id"]
        with lock:
            running[key] = running.get(key, 0) + 1
            most[key] = max(most.get(key, 0), running[key])
            if all(running.get(k, 0) for k in ("acme", "globex")):
                both_keys_at_once.set()
        release.wait(60)  # released by the test once it looked (a slow host may take seconds)
        with lock:
            running[key] -= 1
        return 1

    engine.register(one_step("keyed", Limit(max=1, key="customer_id"), work))
    runs = [
        engine.client.start("keyed", {"customer_id": k}).run_id for k in ("acme", "acme", "globex", "acme")
    ]
    engine.runner(concurrency=4)
    engine.runner(concurrency=4)
    wait_until(both_keys_at_once.is_set, what="runs of both keys to run at once")
    waits = engine.client.slot_waits(engine.store.get_run_view(r) for r in runs)  # type: ignore[misc]
    assert set(waits) == {runs[1], runs[3]}
    assert waits[runs[1]] == "waiting for a slot of customer_id=acme (1 of 1 in use)"
    release.set()
    for run_id in runs:
        assert engine.wait(run_id).status == "done"
    assert most == {"acme": 1, "globex": 1}
