"""The asyncio client: awaited calls that never block the loop or use its default executor, waits
woken by change notices without a thread each, and a journal iterator that can be stopped."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.engine.conftest import Engine
from tether import Workflow, compute, decision, notify, wait_for_event
from tether.aio import AsyncTether
from tether.client import WaitTimeout
from tether.errors import Conflict, InvalidInput, NotFound

quick = Workflow("quick", start="a", nodes=[compute("a", lambda ctx: {"n": ctx.input["n"]})])
ask = Workflow(
    "ask",
    start="q",
    nodes=[decision("q", "Go?", options=["yes", "no"]), compute("after", lambda ctx: "went")],
    edges={"q.yes": "after"},
)


def run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def test_async__forty_waits_neither_block_the_loop_nor_take_a_thread_each(engine: Engine) -> None:
    engine.register(quick)

    async def main() -> tuple[list[str], float, int]:
        async with AsyncTether(engine.client, threads=2) as client:
            # The loop's default executor is one thread, held until the waits are over: a client
            # that needed it (asyncio.to_thread) could not even start the runs.
            loop = asyncio.get_running_loop()
            loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
            gate = threading.Event()
            blocker = loop.run_in_executor(None, gate.wait, 60)
            runs = [await client.start("quick", {"n": n}, run_id=f"a-{n}") for n in range(40)]
            waits = [asyncio.create_task(client.wait(r.run_id, timeout_s=30)) for r in runs]
            await asyncio.sleep(0.2)
            threads_waiting = threading.active_count()
            assert not any(w.done() for w in waits)
            # The loop stays responsive while forty waits are pending and a runner works.
            engine.runner()
            worst = 0.0
            while not all(w.done() for w in waits):
                before = loop.time()
                await asyncio.sleep(0.01)
                worst = max(worst, loop.time() - before)
            results = [await w for w in waits]
            assert not blocker.done()
            gate.set()
            await blocker
            return [r.status for r in results], worst, threads_waiting

    statuses, worst_gap, threads = run(main())
    assert statuses == ["done"] * 40
    assert worst_gap < 1.0
    # The pool (2) and one notice thread, not a thread per wait.
    assert threads < 20


def test_async__wait_times_out_with_the_runs_status(engine: Engine) -> None:
    engine.register(quick)

    async def main() -> None:
        async with AsyncTether(engine.client) as client:
            await client.start("quick", {"n": 1}, run_id="slow-1")
            with pytest.raises(WaitTimeout, match="slow-1 is still queued"):
                await client.wait("slow-1", timeout_s=0.2)
            with pytest.raises(InvalidInput, match="timeout_s"):
                await client.wait("slow-1", timeout_s=-1)

    run(main())


def test_async__answer_continues_the_run_and_errors_keep_their_type(engine: Engine) -> None:
    engine.register(ask)
    engine.runner()

    async def main() -> str:
        async with AsyncTether(engine.client) as client:
            await client.start("ask", run_id="ask-1")
            found: list[object] = []
            while not found:
                found = await client.decisions("ask-1")
                await asyncio.sleep(0.02)
            with pytest.raises(InvalidInput, match="one of yes, no"):
                await client.answer(found[0].decision_id, "maybe")  # type: ignore[attr-defined]
            await client.answer(found[0].decision_id, "yes")  # type: ignore[attr-defined]
            with pytest.raises(NotFound):
                await client.result("no-such-run")
            result = await client.wait("ask-1", timeout_s=30)
            return str(result.status)

    assert run(main()) == "done"


def test_async__following_the_journal_yields_new_events_and_stops_when_left(engine: Engine) -> None:
    engine.register(quick)

    async def main() -> list[str]:
        async with AsyncTether(engine.client) as client:
            await client.start("quick", {"n": 1}, run_id="f-1")
            seen: list[str] = []

            last = [0]

            async def follow() -> None:
                async with contextlib.aclosing(client.events(last[0], run_id="f-1", follow=True)) as events:
                    async for event in events:
                        seen.append(event.type)
                        last[0] = event.seq
                        if event.type == "run.queue_done":
                            break

            follower = asyncio.create_task(follow())
            await asyncio.sleep(0.1)
            engine.runner()
            await asyncio.wait_for(follower, 30)
            # A follower with nothing new to read is stopped by cancelling its task.
            count = len(seen)
            idle = asyncio.create_task(follow())
            await asyncio.sleep(0.2)
            assert len(seen) == count and not idle.done()
            idle.cancel()
            with pytest.raises(asyncio.CancelledError):
                await idle
            return seen

    seen = run(main())
    assert seen[0] == "run.queued"
    assert seen[-1] == "run.queue_done"


def test_async__a_closed_client_refuses_calls(engine: Engine) -> None:
    async def main() -> None:
        client = AsyncTether(engine.client)
        await client.aclose()
        with pytest.raises(Exception, match="closed"):
            await client.result("x")

    run(main())


def test_async__runs_lists_and_start_tells_adopted(engine: Engine) -> None:
    engine.register(Workflow("listed", start="a", nodes=[compute("a", lambda ctx: 1)]))

    async def app() -> tuple[bool, bool, list[str], list[str]]:
        client = AsyncTether(engine.client)
        first = await client.start("listed", run_id="run-listed")
        again = await client.start("listed", run_id="run-listed")
        queued = [r.run_id for r in await client.runs(status="queued", workflow="listed")]
        other = [r.run_id for r in await client.runs(workflow="other")]
        await client.close()
        return first.adopted, again.adopted, queued, other

    assert run(app()) == (False, True, ["run-listed"], [])


signed = Workflow(
    "signed",
    start="wait",
    nodes=[
        wait_for_event(
            "wait",
            "approved",
            schema={"type": "object", "properties": {"by": {"type": "string"}}, "required": ["by"]},
        ),
        compute("ship", lambda ctx: {"by": ctx.outputs["wait"]["payload"]["by"]}),
    ],
    edges={"wait": "ship"},
)


def test_async__schedules_are_added_listed_paused_resumed_and_removed_as_the_sync_client_does(
    engine: Engine,
) -> None:
    typed = Workflow(
        "typed",
        start="a",
        nodes=[compute("a", lambda ctx: ctx.input)],
        input_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    )
    engine.register(quick, typed, Workflow("chatty", start="say", nodes=[notify("say", "hello")]))

    async def main() -> None:
        async with AsyncTether(engine.client) as client:
            with pytest.raises(InvalidInput, match="Input of workflow typed does not match its input schema"):
                await client.add_schedule("typed", "0 9 * * *", input={"n": "x"})
            with pytest.raises(InvalidInput, match="Invalid cron expression"):
                await client.add_schedule("quick", "0 9 * * 8")
            with pytest.raises(InvalidInput, match="a scheduled run has none"):
                await client.add_schedule("chatty", "0 9 * * *")
            with pytest.raises(NotFound, match="Unknown workflow 'absent'"):
                await client.add_schedule("absent", "0 9 * * *")
            with pytest.raises(InvalidInput, match="workflow must be a non-empty workflow name"):
                await client.schedules(workflow="")
            assert await client.schedules() == []
            added = await client.add_schedule(
                "quick", "30 6 * * *", tz="Europe/Paris", input={"n": 3}, name="morning", catch_up="one"
            )
            assert (added.name, added.workflow_name, added.origin) == ("morning", "quick", "added")
            assert (added.cron, added.timezone, added.input, added.catch_up) == (
                "30 6 * * *",
                "Europe/Paris",
                {"n": 3},
                "one",
            )
            with pytest.raises(Conflict, match="A schedule named morning exists already"):
                await client.add_schedule("quick", "0 10 * * *", name="morning")
            assert await client.schedules() == [added]
            assert await client.schedules(workflow="quick") == [added]
            assert await client.schedules(workflow="chatty") == []
            assert await client.schedule("morning") == added
            with pytest.raises(NotFound, match="Schedule not found: evening"):
                await client.schedule("evening")
            assert await client.pause_schedule("morning") is True
            assert await client.pause_schedule("morning") is False
            assert (await client.schedule("morning")).paused
            assert engine.client.schedule("morning").paused  # the same store as the sync client's
            assert await client.resume_schedule("morning") is True
            assert await client.resume_schedule("morning") is False
            assert not (await client.schedule("morning")).paused
            await client.remove_schedule("morning")
            assert await client.schedules() == []
            with pytest.raises(NotFound):
                await client.remove_schedule("morning")
            assert await client.declare_schedules() == []

    run(main())


def test_async__send_event_continues_a_waiting_run_and_refusals_write_nothing(engine: Engine) -> None:
    engine.register(signed)
    engine.runner()

    async def main() -> object:
        async with AsyncTether(engine.client) as client:
            await client.start("signed", run_id="signed-1")
            while engine.store.event_wait("signed-1") is None:
                await asyncio.sleep(0.02)
            with pytest.raises(InvalidInput, match="waits for no event named 'shipped'"):
                await client.send_event("signed-1", "shipped")
            with pytest.raises(InvalidInput, match="Event approved does not match its schema"):
                await client.send_event("signed-1", "approved", {"by": 7})
            with pytest.raises(InvalidInput, match="name must be the non-empty name"):
                await client.send_event("signed-1", "")
            with pytest.raises(NotFound):
                await client.send_event("no-such-run", "approved", {"by": "ann"})
            assert engine.store.inbox("signed-1") == []
            sent = await client.send_event("signed-1", "approved", {"by": "ann"}, actor_id="ann")
            assert (sent.run_id, sent.name, sent.payload, sent.sent_by) == (
                "signed-1",
                "approved",
                {"by": "ann"},
                "ann",
            )
            result = await client.wait("signed-1", timeout_s=30)
            assert result.status == "done", result.error_message
            with pytest.raises(Conflict, match="takes no more events"):
                await client.send_event("signed-1", "approved", {"by": "bob"})
            return result.output

    assert run(main()) == {"by": "ann"}
