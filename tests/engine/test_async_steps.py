"""``async def`` node functions: compute, effect, notify and agent steps run on their runner's
event loop (one per runner, started by the first coroutine, stopped with the runner); a cancel
of the run cancels the coroutine's task, and so does a stop that abandons the step."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from tether.engine.context import Context
from tether.engine.graph import Exit, Workflow, agent, compute, effect, notify

from .conftest import Engine, wait_until

SUMMARY = {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tether-steps-")]


class AsyncProvider:
    """A model provider whose ``complete`` is a coroutine function."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def complete(self, prompt: str, schema: dict[str, Any]) -> Any:
        await asyncio.sleep(0)
        self.prompts.append(prompt)
        return {"summary": f"{len(prompt)} characters"}


async def double(ctx: Context) -> Any:
    await asyncio.sleep(0.01)
    return Exit("big" if ctx.input["n"] > 10 else "small", {"n": ctx.input["n"] * 2})


async def pay(ctx: Context, key: str) -> Any:
    await asyncio.sleep(0)
    return {"paid": ctx.outputs["double"]["n"], "key": key, "loop": asyncio.get_running_loop() is not None}


async def prompt(ctx: Context) -> str:
    return f"Summarise payment {ctx.outputs['pay']['paid']}"


async def message(ctx: Context) -> Any:
    return {"text": ctx.outputs["think"]["summary"]}


def test_async__compute_effect_agent_and_notify_functions_run_and_route(engine: Engine) -> None:
    model = AsyncProvider()
    wf = Workflow(
        "async-all",
        start="double",
        nodes=[
            compute("double", double, exits=["big", "small"]),
            effect("pay", pay),
            agent("think", model, prompt, schema=SUMMARY),
            notify("tell", message),
        ],
        edges={"double.big": "pay", "pay": "think", "think": "tell"},
    )
    # A coroutine function is a function like another in the definition: named by its code.
    assert wf.snapshot()["nodes"]["double"]["function"].startswith("double@")
    engine.register(wf)
    runner = engine.runner()
    run = engine.client.start("async-all", {"n": 21}, session_id="chat-1")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.outputs["double"] == {"n": 42}
    assert result.outputs["pay"] == {"paid": 42, "key": f"{run.run_id}:pay:1", "loop": True}
    assert result.outputs["think"] == {"summary": "20 characters"}
    assert model.prompts == ["Summarise payment 42"]
    [note] = [m for m in engine.client.session("chat-1").messages() if m.kind == "notification"]
    assert note.payload == {"text": "20 characters"}
    first = engine.attempts(run.run_id)[0]
    assert (first.node_id, first.exit_name) == ("double", "big")
    assert len(loop_threads()) == 1
    engine.stop(runner)
    assert loop_threads() == [], "the runner's event loop stops with it"


def test_async__a_failing_coroutine_is_retried_like_any_step(engine: Engine) -> None:
    async def flaky(ctx: Context) -> Any:
        if ctx.attempt == 1:
            raise ConnectionError("the first try fails")
        return {"tries": ctx.attempt}

    engine.register(
        Workflow("async-flaky", start="a", nodes=[compute("a", flaky, retries=1, backoff_s=0.05)])
    )
    engine.runner()
    run = engine.client.start("async-flaky")
    assert engine.wait(run.run_id).output == {"tries": 2}
    [failed, _] = engine.attempts(run.run_id)
    assert failed.status == "failed" and "ConnectionError: the first try fails" in (
        failed.error_message or ""
    )


def test_async__a_runner_with_only_plain_steps_starts_no_event_loop(engine: Engine) -> None:
    engine.register(Workflow("plain", start="a", nodes=[compute("a", lambda ctx: 1)]))
    engine.runner()
    assert engine.wait(engine.client.start("plain").run_id).output == 1
    assert loop_threads() == []


def test_async__a_cancel_during_an_async_step_cancels_its_coroutine(engine: Engine) -> None:
    inside = threading.Event()
    cancelled = threading.Event()
    after: list[str] = []

    async def wait_forever(ctx: Context) -> Any:
        inside.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {"slept": True}

    wf = Workflow(
        "async-cancel",
        start="wait",
        nodes=[compute("wait", wait_forever), compute("after", lambda ctx: after.append("ran"))],
        edges={"wait": "after"},
    )
    engine.register(wf)
    engine.runner(lease_ms=30_000, renew_ms=10_000)
    run_id = engine.client.start("async-cancel").run_id
    assert inside.wait(10)
    assert engine.client.cancel(run_id) == "requested"
    assert engine.wait(run_id).status == "cancelled"
    # Cancelled, not left to sleep out its minute.
    assert cancelled.wait(10)
    assert after == []
    assert [(a.node_id, a.status) for a in engine.attempts(run_id)] == [("wait", "cancelled")]


def test_async__a_stop_that_abandons_an_async_step_cancels_it_and_hands_the_run_back(engine: Engine) -> None:
    inside = threading.Event()
    cancelled = threading.Event()

    async def ignore_the_stop(ctx: Context) -> Any:
        inside.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return None

    engine.register(Workflow("async-stop", start="wait", nodes=[compute("wait", ignore_the_stop)]))
    runner = engine.runner(lease_ms=30_000, renew_ms=10_000)
    run_id = engine.client.start("async-stop").run_id
    assert inside.wait(10)
    assert runner.stop(timeout=1.0)
    assert cancelled.wait(10)
    assert loop_threads() == []
    wait_until(lambda: engine.statuses(run_id)[0] == "parked", what="the run to be handed back")
    assert [a.status for a in engine.attempts(run_id)] == ["interrupted"]
