"""Steps cannot take the runner down: whatever a step raises, ``BaseException`` included
(``sys.exit()``, a ``KeyboardInterrupt`` or ``GeneratorExit`` raised by the step's own code), is
that step's failure with its traceback; the runner's threads live on, it keeps claiming, and
``stop()`` finishes."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from tether.engine.graph import Workflow, compute, effect, notify

from .conftest import Engine


def _exits(calls: Counter[str]):  # type: ignore[no-untyped-def]
    def fn(ctx):  # type: ignore[no-untyped-def]
        calls[ctx.run_id] += 1
        sys.exit(3)

    return fn


def test_step__sys_exit_fails_the_step_and_the_runner_keeps_working(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    exiting = Workflow("exiting", start="a", nodes=[compute("a", _exits(calls), retries=1, backoff_s=0.01)])
    fine = Workflow("fine", start="a", nodes=[compute("a", lambda ctx: {"ok": True})])
    engine.register(exiting, fine)
    # One slot: were the run thread gone with the step, nothing after it would ever run.
    runner = engine.runner(concurrency=1)

    bad = engine.client.start("exiting")
    result = engine.wait(bad.run_id)
    assert result.status == "failed"
    assert result.error_code == "nodeFailed"
    assert "Node a failed after 2 attempt(s): SystemExit: 3" in (result.error_message or "")
    attempts = engine.attempts(bad.run_id)
    assert [a.status for a in attempts] == ["failed", "failed"]
    assert calls[bad.run_id] == 2  # retried as any failure is
    story = attempts[0].error_message or ""
    assert story.startswith("SystemExit: 3")
    assert "Traceback" in story and "sys.exit(3)" in story

    for _ in range(3):
        good = engine.client.start("fine")
        assert engine.wait(good.run_id).status == "done"
    assert runner.active_run_ids == []
    engine.stop(runner)  # returns: no thread is stuck


@pytest.mark.parametrize("raised", [KeyboardInterrupt, GeneratorExit])
def test_step__base_exceptions_from_step_code_are_step_failures(
    engine: Engine, raised: type[BaseException]
) -> None:
    tries: Counter[str] = Counter()

    def flaky(ctx):  # type: ignore[no-untyped-def]
        tries[ctx.run_id] += 1
        if ctx.attempt == 1:
            raise raised("from the step")
        return {"attempt": ctx.attempt}

    engine.register(Workflow("flaky", start="a", nodes=[compute("a", flaky, retries=1, backoff_s=0.01)]))
    runner = engine.runner(concurrency=1)
    run = engine.client.start("flaky")
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert result.output == {"attempt": 2}
    first = engine.attempts(run.run_id)[0]
    assert first.status == "failed"
    assert (first.error_message or "").startswith(f"{raised.__name__}: from the step")
    engine.stop(runner)


def test_effect__sys_exit_rejects_the_effect_and_fails_the_run(engine: Engine) -> None:
    def pay(ctx, key):  # type: ignore[no-untyped-def]
        sys.exit("payment service gone")

    engine.register(
        Workflow("paying", start="pay", nodes=[effect("pay", pay)]),
        Workflow("fine", start="a", nodes=[compute("a", lambda ctx: {"ok": True})]),
    )
    runner = engine.runner(concurrency=1)
    run = engine.client.start("paying")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert result.error_code == "effectRejected"
    assert "SystemExit: payment service gone" in (result.error_message or "")
    assert [e.status for e in engine.store.effects(run_id=run.run_id)] == ["rejected"]
    assert engine.wait(engine.client.start("fine").run_id).status == "done"
    engine.stop(runner)


def test_notify__sys_exit_in_the_message_function_fails_the_node(engine: Engine) -> None:
    def message(ctx):  # type: ignore[no-untyped-def]
        sys.exit(1)

    engine.register(Workflow("telling", start="tell", nodes=[notify("tell", message)]))
    runner = engine.runner(concurrency=1)
    run = engine.client.start("telling", session_id="s-telling")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert "SystemExit: 1" in (result.error_message or "")
    engine.stop(runner)
