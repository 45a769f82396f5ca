"""Fan-out and parallel nodes: many calls of one node at once within one held run, each recorded
on its own (``NODE[key]`` attempts), retried on its own, stopped by the run's cancel."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest

from tether.engine.context import Context
from tether.engine.graph import Workflow, compute, fan_out, parallel
from tether.errors import InvalidInput

from .conftest import Engine, wait_until


class Gauge:
    """Counts the calls inside a step at once, and the most there ever were."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.calls: Counter[Any] = Counter()

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


def test_fan_out__outputs_in_item_order_at_most_parallelism_at_once_each_item_once(engine: Engine) -> None:
    gauge = Gauge()
    both = threading.Barrier(4, timeout=10)

    def square(ctx: Context, item: int) -> int:
        with gauge:
            gauge.calls[item] += 1
            if item < 4:
                both.wait()  # the first four are inside together: the pool runs four at once
            return item * item

    engine.register(
        Workflow(
            "squares",
            start="list",
            nodes=[
                compute("list", lambda ctx: {"items": list(range(20))}),
                fan_out("square", square, items=lambda ctx: ctx.outputs["list"]["items"], parallelism=4),
            ],
            edges={"list": "square"},
        )
    )
    engine.runner()
    run = engine.client.start("squares")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output == [n * n for n in range(20)]
    assert gauge.most == 4
    assert gauge.calls == Counter(range(20))
    items = [a for a in engine.attempts(run.run_id) if a.node_id.startswith("square[")]
    assert sorted(a.node_id for a in items) == sorted(f"square[{n}]" for n in range(20))
    assert {a.status for a in items} == {"completed"}
    assert [a.node_id for a in engine.attempts(run.run_id) if "[" not in a.node_id] == ["list", "square"]


def test_fan_out__an_item_failing_is_retried_on_its_own(engine: Engine) -> None:
    calls: Counter[int] = Counter()

    def flaky(ctx: Context, item: int) -> dict[str, int]:
        calls[item] += 1
        if item == 2 and ctx.attempt == 1:
            raise ValueError("item 2 is not ready")
        return {"item": item, "attempt": ctx.attempt}

    engine.register(
        Workflow(
            "flaky-items",
            start="each",
            nodes=[fan_out("each", flaky, items=lambda ctx: [0, 1, 2, 3], retries=1, backoff_s=0.01)],
        )
    )
    engine.runner()
    run = engine.client.start("flaky-items")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output == [
        {"item": 0, "attempt": 1},
        {"item": 1, "attempt": 1},
        {"item": 2, "attempt": 2},
        {"item": 3, "attempt": 1},
    ]
    assert calls == Counter({0: 1, 1: 1, 2: 2, 3: 1})
    tries = engine.attempts(run.run_id, "each[2]")
    assert [(a.attempt_number, a.status) for a in tries] == [(1, "failed"), (2, "completed")]
    assert (tries[0].error_message or "").startswith("ValueError: item 2 is not ready")


def test_fan_out__an_item_failing_for_good_fails_the_run(engine: Engine) -> None:
    def broken(ctx: Context, item: int) -> int:
        if item == 1:
            raise RuntimeError("no such thing")
        return item

    engine.register(
        Workflow("broken-items", start="each", nodes=[fan_out("each", broken, items=lambda ctx: [0, 1, 2])])
    )
    engine.runner()
    run = engine.client.start("broken-items")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert result.error_code == "nodeFailed"
    assert "each[1] failed: RuntimeError: no such thing" in (result.error_message or "")


def test_fan_out__a_routed_error_exit_carries_the_failed_items_errors(engine: Engine) -> None:
    def broken(ctx: Context, item: int) -> int:
        if item == 1:
            raise RuntimeError("no such thing")
        return item

    engine.register(
        Workflow(
            "routed-items",
            start="each",
            nodes=[
                fan_out("each", broken, items=lambda ctx: [0, 1], parallelism=1),
                compute("report", lambda ctx: ctx.outputs["each"]),
            ],
            edges={"each.error": "report"},
        )
    )
    engine.runner()
    run = engine.client.start("routed-items")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"outputs": [0, None], "errors": {"1": "RuntimeError: no such thing"}}


def test_fan_out__items_not_a_list_fail_the_node_with_what_was_returned(engine: Engine) -> None:
    engine.register(
        Workflow(
            "not-a-list",
            start="each",
            nodes=[fan_out("each", lambda ctx, item: item, items=lambda ctx: 7)],  # type: ignore[arg-type,return-value]
        )
    )
    engine.runner()
    result = engine.wait(engine.client.start("not-a-list").run_id)
    assert result.status == "failed"
    assert "the items function of node each returned 7, not a list" in (result.error_message or "")


def test_fan_out__an_empty_list_completes_with_an_empty_list(engine: Engine) -> None:
    engine.register(
        Workflow("none", start="each", nodes=[fan_out("each", lambda ctx, item: item, items=lambda ctx: [])])
    )
    engine.runner()
    result = engine.wait(engine.client.start("none").run_id)
    assert (result.status, result.output) == ("done", [])


def test_fan_out__cancel_stops_every_item_and_ends_the_run_cancelled(engine: Engine) -> None:
    started: Counter[int] = Counter()
    seen: Counter[int] = Counter()
    lock = threading.Lock()

    def wait_for_cancel(ctx: Context, item: int) -> None:
        with lock:
            started[item] += 1
        wait_until(lambda: ctx.cancelled, what="the item to see the cancel")
        with lock:
            seen[item] += 1

    engine.register(
        Workflow(
            "cancelled-items",
            start="each",
            nodes=[fan_out("each", wait_for_cancel, items=lambda ctx: list(range(10)), parallelism=3)],
        )
    )
    engine.runner()
    run = engine.client.start("cancelled-items")
    wait_until(lambda: sum(started.values()) == 3, what="three items to start")
    engine.client.cancel(run.run_id)
    result = engine.wait(run.run_id)
    assert result.status == "cancelled"
    wait_until(lambda: sum(seen.values()) == 3, what="every running item to see the cancel")
    assert sum(started.values()) == 3, "no item starts once the run is cancelled"
    assert not [a for a in engine.attempts(run.run_id) if a.node_id.startswith("each[")]


def test_parallel__join_all_maps_branch_ids_to_outputs(engine: Engine) -> None:
    both = threading.Barrier(2, timeout=10)

    def left(ctx: Context) -> str:
        both.wait()
        return "L"

    def right(ctx: Context) -> str:
        both.wait()  # neither returns before the other started: they run at once
        return "R"

    engine.register(
        Workflow(
            "both",
            start="split",
            nodes=[parallel("split", [compute("left", left), compute("right", right)])],
        )
    )
    engine.runner()
    result = engine.wait(engine.client.start("both").run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"left": "L", "right": "R"}


def test_parallel__join_first_completes_with_the_first_branch_and_stops_the_rest(engine: Engine) -> None:
    told: list[bool] = []

    def fast(ctx: Context) -> str:
        return "fast"

    def slow(ctx: Context) -> str:
        wait_until(lambda: ctx.cancelled, what="the slow branch to be told to stop")
        told.append(True)
        return "slow"

    engine.register(
        Workflow(
            "race",
            start="race",
            nodes=[parallel("race", [compute("fast", fast), compute("slow", slow)], join=1)],
        )
    )
    engine.runner()
    run = engine.client.start("race")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"fast": "fast"}
    wait_until(lambda: told == [True], what="the slow branch to end")
    assert [a.node_id for a in engine.attempts(run.run_id) if "[" in a.node_id] == ["race[fast]"]


def test_parallel__a_branch_retries_under_its_own_policy(engine: Engine) -> None:
    def flaky(ctx: Context) -> int:
        if ctx.attempt < 3:
            raise ValueError("not yet")
        return ctx.attempt

    engine.register(
        Workflow(
            "retrying",
            start="p",
            nodes=[
                parallel("p", [compute("a", flaky, retries=2, backoff_s=0.01), compute("b", lambda ctx: 0)])
            ],
        )
    )
    engine.runner()
    result = engine.wait(engine.client.start("retrying").run_id)
    assert (result.status, result.output) == ("done", {"a": 3, "b": 0})


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: fan_out("f", lambda ctx, item: item, items=[1, 2]), "items must be a function"),  # type: ignore[arg-type]
        (lambda: fan_out("f", lambda ctx, item: item, items=lambda ctx: [], parallelism=0), "parallelism"),
        (lambda: fan_out("f", "nope", items=lambda ctx: []), "fn must be a function"),  # type: ignore[arg-type]
        (lambda: parallel("p", []), "non-empty list of compute or effect nodes"),
        (lambda: parallel("p", [fan_out("f", lambda c, i: i, items=lambda c: [])]), "compute or effect node"),
        (lambda: parallel("p", [compute("a", len), compute("a", len)]), "two branches named a"),
        (lambda: parallel("p", [compute("a", len)], join=2), "join must be"),
        (lambda: parallel("p", [compute("a", len, exits=["x"])]), "declares exits"),
    ],
)
def test_fan_out_and_parallel__refuse_bad_arguments_with_what_to_fix(build: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        build()


def test_fan_out__routes_by_ok_or_error() -> None:
    node = fan_out("f", lambda ctx, item: item, items=lambda ctx: [])
    wf = Workflow("w", start="f", nodes=[node, compute("x", len)], edges={"f.error": "x"})
    assert wf.nodes["f"].snapshot()["kind"] == "fan_out"
    with pytest.raises(InvalidInput, match="cannot produce"):
        Workflow("w", start="f", nodes=[node, compute("x", len)], edges={"f.done": "x"})


def test_fan_out__a_stopping_runner_lets_running_items_end_and_the_next_runs_only_the_rest(
    engine: Engine,
) -> None:
    calls: Counter[int] = Counter()
    latch = engine.latch()

    def held(ctx: Context, item: int) -> int:
        calls[item] += 1
        if item == 0:
            latch.hold()
        return item

    engine.register(
        Workflow(
            "stoppable",
            start="each",
            nodes=[fan_out("each", held, items=lambda ctx: [0, 1, 2], parallelism=1)],
        )
    )
    first = engine.runner()
    run = engine.client.start("stoppable")
    assert latch.entered.wait(10)
    first.stop()
    latch.release.set()
    engine.stop(first)
    assert engine.statuses(run.run_id) == ("parked", "running")
    assert [(a.node_id, a.status) for a in engine.attempts(run.run_id)] == [
        ("each", "interrupted"),
        ("each[0]", "completed"),
    ]
    engine.runner()
    result = engine.wait(run.run_id)
    assert (result.status, result.output) == ("done", [0, 1, 2])
    assert calls == Counter({0: 1, 1: 1, 2: 1})


def test_fan_out__a_fork_after_it_reuses_its_items_and_a_fork_at_it_runs_them_again(engine: Engine) -> None:
    calls: Counter[str] = Counter()

    def double(ctx: Context, item: int) -> int:
        calls[ctx.run_id] += 1
        return item * 2

    engine.register(
        Workflow(
            "forked",
            start="each",
            nodes=[
                fan_out("each", double, items=lambda ctx: [1, 2, 3]),
                compute("total", lambda ctx: sum(ctx.outputs["each"])),
            ],
            edges={"each": "total"},
        )
    )
    engine.runner()
    parent = engine.client.start("forked").run_id
    assert engine.wait(parent).output == 12
    after = engine.client.restart(parent, from_node="total").run_id
    assert engine.wait(after).output == 12
    assert calls[after] == 0, "the fork took the items' outputs over"
    again = engine.client.restart(after, from_node="each").run_id
    assert engine.wait(again).output == 12
    assert calls[again] == 3


def test_fan_out__an_async_function_runs_for_every_item(engine: Engine) -> None:
    async def triple(ctx: Context, item: int) -> int:
        await asyncio.sleep(0)
        return item * 3

    engine.register(
        Workflow(
            "async-items", start="each", nodes=[fan_out("each", triple, items=lambda ctx: list(range(8)))]
        )
    )
    engine.runner()
    result = engine.wait(engine.client.start("async-items").run_id)
    assert (result.status, result.output) == ("done", [n * 3 for n in range(8)])


def test_fan_out__cancel_cancels_every_async_item_running(engine: Engine) -> None:
    started: list[int] = []
    cancelled: list[int] = []

    async def wait_long(ctx: Context, item: int) -> None:
        started.append(item)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(item)
            raise

    engine.register(
        Workflow(
            "async-cancel",
            start="each",
            nodes=[fan_out("each", wait_long, items=lambda ctx: list(range(6)), parallelism=3)],
        )
    )
    engine.runner()
    run = engine.client.start("async-cancel")
    wait_until(lambda: len(started) == 3, what="three async items to start")
    engine.client.cancel(run.run_id)
    assert engine.wait(run.run_id).status == "cancelled"
    wait_until(lambda: sorted(cancelled) == sorted(started), what="every running coroutine to be cancelled")
    assert len(started) == 3


# -- deadlines inside a fan-out ------------------------------------------------------------------
def test_fan_out__an_item_past_its_deadline_is_abandoned_and_retried(engine: Engine) -> None:
    released = threading.Event()
    abandoned: list[bool] = []

    def slow_first(ctx: Context, item: int) -> int:
        if item == 1 and ctx.attempt == 1:
            # Hangs past the deadline; told to stop (ctx.cancelled) once abandoned.
            released.wait(10)
            abandoned.append(ctx.cancelled)
            return -1  # dropped: its try was recorded timed_out
        return item * 10

    flow = Workflow(
        "timed-fan",
        start="each",
        nodes=[
            fan_out("each", slow_first, items=lambda ctx: [0, 1, 2], retries=1, backoff_s=0.01, timeout_s=0.3)
        ],
    )
    engine.register(flow)
    engine.runner()
    run = engine.client.start("timed-fan")
    result = engine.wait(run.run_id)
    released.set()
    assert result.status == "done", result.error_message
    assert result.output == [0, 10, 20]
    tries = [(a.status, a.error_message) for a in engine.attempts(run.run_id, "each[1]")]
    assert tries == [("timed_out", "timed out after 0.3 s"), ("completed", None)]
    wait_until(lambda: abandoned, what="the abandoned try to return")
    assert abandoned == [True]
    # Its late return was never recorded.
    assert [a.status for a in engine.attempts(run.run_id, "each[1]")] == ["timed_out", "completed"]


def test_fan_out__the_runs_deadline_ends_the_run_timed_out(engine: Engine) -> None:
    def hang(ctx: Context, item: int) -> int:
        while not ctx.cancelled:
            threading.Event().wait(0.02)
        return item

    flow = Workflow(
        "deadline-fan",
        start="each",
        nodes=[fan_out("each", hang, items=lambda ctx: [0, 1])],
        timeout_s=0.5,
    )
    engine.register(flow)
    engine.runner()
    run = engine.client.start("deadline-fan")
    result = engine.wait(run.run_id)
    assert (result.status, result.run_state_status, result.error_code) == (
        "failed",
        "timed_out",
        "runTimedOut",
    )
