"""Step and run deadlines: a step past its ``timeout_s`` is abandoned (its attempt recorded
``timed_out``, its late result never recorded), then retried or routed on its ``timeout`` exit;
an agent step has a deadline by default; a run past its ``Workflow(timeout_s=)`` ends
``timed_out`` wherever it stands; an answer after a decision's deadline is refused."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest

from tether.engine.clock import FakeClock
from tether.engine.context import Context
from tether.engine.graph import (
    AGENT_TIMEOUT_S,
    Workflow,
    agent,
    compute,
    decision,
    effect,
    input,
    shell,
    step_timeout_s,
)
from tether.errors import DeadlinePassed, InvalidInput

from .conftest import WAIT_S, Engine, wait_until

#: A fake clock waits for nobody: the runner's lease needs no renewal during these tests.
QUIET = {"lease_ms": 60_000, "renew_ms": 20_000}


class Hanging:
    """A step whose first call hangs until released, then returns late; later calls return at
    once. Records what the first call saw of its cancellation signal."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()
        self.returned = threading.Event()
        self.saw_cancelled: bool | None = None

    def __call__(self, ctx: Context) -> Any:
        self.calls += 1
        if ctx.attempt == 1:
            self.release.wait(WAIT_S)
            self.saw_cancelled = ctx.cancelled
            self.returned.set()
            return {"late": True}
        return {"attempt": ctx.attempt}


def _advance_until(clock: FakeClock, done: Any, what: str, step: float = 0.5, most: float = 120) -> None:
    """Move the fake clock in steps until ``done()`` holds."""
    moved = 0.0
    while not done():
        assert moved < most, f"{what} never happened"
        clock.advance(step)
        moved += step
        time.sleep(0.02)


def test_compute_timeout__abandons_the_step_retries_it_and_never_records_the_late_result(
    engine: Engine,
) -> None:
    hanging = Hanging()
    engine.register(
        Workflow(
            "slow", start="fetch", nodes=[compute("fetch", hanging, timeout_s=5, retries=1, backoff_s=0.05)]
        )
    )
    clock = FakeClock()
    engine.runner(clock=clock, **QUIET)
    run = engine.client.start("slow")
    wait_until(lambda: engine.attempts(run.run_id), what="the step to begin")
    began = clock.monotonic()
    _advance_until(clock, lambda: engine.attempts(run.run_id)[0].status != "running", "the timeout")
    assert clock.monotonic() - began >= 5
    # The retry waits out its backoff on the store's clock; the idle runner looks again once its
    # own clock moved.
    _advance_until(clock, lambda: engine.client.result(run.run_id).finished, "the retry", step=0.1)
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert result.output == {"attempt": 2}
    first, second = engine.attempts(run.run_id)
    assert (first.status, first.output) == ("timed_out", None)
    assert "timed out after 5 s" in (first.error_message or "")
    assert (second.status, second.output) == ("completed", {"attempt": 2})

    # The abandoned call returns now: it saw its cancellation signal, and nothing it returned
    # is recorded.
    seen = engine.store.last_event_seq()
    hanging.release.set()
    assert hanging.returned.wait(WAIT_S)
    assert hanging.saw_cancelled is True
    time.sleep(0.2)  # give a (wrong) late write the time it would take
    assert engine.store.last_event_seq() == seen
    assert [a.output for a in engine.attempts(run.run_id)] == [None, {"attempt": 2}]


def test_compute_timeout__without_retries_left_fails_the_run(engine: Engine) -> None:
    hanging = Hanging()
    engine.register(Workflow("slow-fail", start="fetch", nodes=[compute("fetch", hanging, timeout_s=2)]))
    clock = FakeClock()
    engine.runner(clock=clock, **QUIET)
    run = engine.client.start("slow-fail")
    wait_until(lambda: engine.attempts(run.run_id), what="the step to begin")
    _advance_until(clock, lambda: engine.client.result(run.run_id).finished, "the run to fail")
    result = engine.wait(run.run_id)
    assert (result.status, result.run_state_status, result.error_code) == ("failed", "failed", "nodeFailed")
    assert "Node fetch failed after 1 attempt(s): timed out after 2 s" in (result.error_message or "")
    assert [a.status for a in engine.attempts(run.run_id)] == ["timed_out"]
    hanging.release.set()


def test_compute_timeout__routes_on_the_timeout_exit_with_the_error_in_the_context(engine: Engine) -> None:
    hanging = Hanging()
    engine.register(
        Workflow(
            "slow-routed",
            start="fetch",
            nodes=[
                compute("fetch", hanging, timeout_s=3, retries=2),
                compute("fallback", lambda ctx: {"after": ctx.outputs["fetch"]}),
                compute("use", lambda ctx: {"used": ctx.outputs["fetch"]}),
            ],
            edges={"fetch.timeout": "fallback", "fetch.ok": "use"},
        )
    )
    clock = FakeClock()
    engine.runner(clock=clock, **QUIET)
    run = engine.client.start("slow-routed")
    wait_until(lambda: engine.attempts(run.run_id), what="the step to begin")
    _advance_until(clock, lambda: engine.client.result(run.run_id).finished, "the run to finish")
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert result.output == {"after": {"error": "timed out after 3 s"}}
    # Routed at once: its retries are for failures, not for a timeout the graph handles.
    assert [(a.node_id, a.status, a.exit_name) for a in engine.attempts(run.run_id)] == [
        ("fetch", "timed_out", "timeout"),
        ("fallback", "completed", "ok"),
    ]
    hanging.release.set()
    assert hanging.returned.wait(WAIT_S)
    assert engine.attempts(run.run_id, "fetch")[0].output is None


def test_timeout_exit__only_a_node_with_a_deadline_has_one() -> None:
    with pytest.raises(InvalidInput, match="exit node fetch cannot produce: 'timeout'"):
        Workflow(
            "no-deadline",
            start="fetch",
            nodes=[compute("fetch", lambda ctx: 1), compute("fallback", lambda ctx: 2)],
            edges={"fetch.timeout": "fallback"},
        )
    with pytest.raises(InvalidInput, match="timeout_s must be a positive number of seconds"):
        compute("fetch", lambda ctx: 1, timeout_s=0)
    with pytest.raises(InvalidInput, match="timeout_s must be a positive number of seconds"):
        Workflow("bad", start="a", nodes=[compute("a", lambda ctx: 1)], timeout_s=-1)


def test_deadlines__a_workflow_without_them_keeps_its_definition_digest() -> None:
    """Only a declared deadline enters the definition: a workflow built before deadlines existed
    (its agent nodes at the default) keeps the digest its runs were reserved with."""
    provider = Provider()
    plain = agent("ask", provider, "hi", schema={"type": "object"})
    assert "timeoutS" not in plain.spec
    assert step_timeout_s(plain) == AGENT_TIMEOUT_S == 600
    assert step_timeout_s(agent("ask", provider, "hi", schema={"type": "object"}, timeout_s=None)) is None
    assert step_timeout_s(compute("a", lambda ctx: 1)) is None
    wf = Workflow("w", start="a", nodes=[compute("a", lambda ctx: 1)])
    assert "timeoutS" not in wf.snapshot()
    timed = Workflow("w", start="a", nodes=[compute("a", lambda ctx: 1)], timeout_s=60)
    assert timed.snapshot()["timeoutS"] == 60
    assert timed.digest != wf.digest


class Provider:
    """A model provider whose calls hang until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def complete(self, prompt: str, schema: Any) -> Any:
        self.release.wait(WAIT_S)
        return {"late": True}


def test_agent__a_model_call_is_abandoned_after_the_default_600_s(engine: Engine) -> None:
    provider = Provider()
    engine.register(
        Workflow("ask-model", start="ask", nodes=[agent("ask", provider, "hello", schema={"type": "object"})])
    )
    clock = FakeClock()
    engine.runner(clock=clock, **QUIET)
    run = engine.client.start("ask-model")
    wait_until(lambda: engine.attempts(run.run_id), what="the model call to begin")
    clock.advance(599)
    time.sleep(0.2)
    assert engine.attempts(run.run_id)[0].status == "running"
    _advance_until(clock, lambda: engine.client.result(run.run_id).finished, "the agent timeout", step=1)
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "timed out after 600 s" in (result.error_message or "")
    assert [a.status for a in engine.attempts(run.run_id)] == ["timed_out"]
    provider.release.set()


def test_run_timeout__abandons_the_running_step_and_ends_the_run_timed_out(engine: Engine) -> None:
    hanging = Hanging()
    engine.register(
        Workflow(
            "bounded",
            start="fetch",
            nodes=[compute("fetch", hanging, retries=3), compute("after", lambda ctx: 1)],
            edges={"fetch": "after"},
            timeout_s=30,
        )
    )
    clock = FakeClock()
    engine.runner(clock=clock, **QUIET)
    run = engine.client.start("bounded")
    wait_until(lambda: engine.attempts(run.run_id), what="the step to begin")
    _advance_until(clock, lambda: engine.client.result(run.run_id).finished, "the run timeout", step=2)
    result = engine.wait(run.run_id)
    assert (result.status, result.run_state_status, result.error_code) == (
        "failed",
        "timed_out",
        "runTimedOut",
    )
    assert "passed its deadline (30 s)" in (result.error_message or "")
    assert [(a.node_id, a.status) for a in engine.attempts(run.run_id)] == [("fetch", "timed_out")]
    hanging.release.set()
    assert hanging.returned.wait(WAIT_S)
    assert hanging.saw_cancelled is True


def _approval(name: str, **kwargs: Any) -> Workflow:
    return Workflow(
        name,
        start="approve",
        nodes=[
            decision("approve", "Ship?", options=["ship", "hold"], **kwargs.pop("decision", {})),
            compute("ship", lambda ctx: "shipped"),
            compute("hold", lambda ctx: "held"),
        ],
        edges={"approve.ship": "ship", "approve.hold": "hold"},
        **kwargs,
    )


def test_run_timeout__a_run_waiting_for_a_decision_times_out_and_its_decision_closes(engine: Engine) -> None:
    engine.register(_approval("bounded-approval", timeout_s=0.5))
    engine.runner()
    run = engine.client.start("bounded-approval")
    result = engine.wait(run.run_id)
    assert (result.status, result.run_state_status, result.error_code) == (
        "failed",
        "timed_out",
        "runTimedOut",
    )
    (closed,) = engine.client.decisions(run.run_id, open_only=False)
    assert (closed.outcome, closed.provenance) == ("cancelled", "expired_no_default")
    assert [a.status for a in engine.attempts(run.run_id)] == ["timed_out"]
    before = engine.store.last_event_seq()
    with pytest.raises(
        DeadlinePassed, match=f"Decision {closed.decision_id} closed at .*Workflow run timed out"
    ):
        engine.client.answer(closed.decision_id, "ship")
    assert engine.store.last_event_seq() == before


def test_decision_deadline__a_late_answer_is_refused_then_the_default_applies(engine: Engine) -> None:
    """The runner sweeps expired decisions on its own clock (a fake one, not moved): the store
    refuses the late answer by its clock, and the default applies once the runner sweeps."""
    engine.register(_approval("late-answer", decision={"deadline_s": 0.2, "default": "hold"}))
    clock = FakeClock()
    engine.runner(clock=clock, **QUIET)
    run = engine.client.start("late-answer")
    opened = wait_until(lambda: engine.client.decisions(run.run_id), what="the decision")[0]
    assert opened.deadline_at is not None
    wait_until(lambda: engine.store.now() > opened.deadline_at, what="the deadline to pass")
    before = engine.store.last_event_seq()
    with pytest.raises(DeadlinePassed) as refused:
        engine.client.answer(opened.decision_id, "ship")
    assert str(refused.value).startswith(f"Decision {opened.decision_id} closed at ")
    assert str(refused.value).endswith('its deadline passed; the default "hold" applies')
    assert engine.store.last_event_seq() == before
    assert engine.client.decisions(run.run_id)[0].outcome is None
    clock.advance(5)  # the runner's next sweep applies the default
    result = engine.wait(run.run_id)
    assert (result.status, result.output) == ("done", "held")
    (resolved,) = engine.client.decisions(run.run_id, open_only=False)
    assert resolved.provenance == "timeout_policy"
    with pytest.raises(DeadlinePassed, match='its deadline passed and the default "hold" applied'):
        engine.client.answer(opened.decision_id, "ship")


def test_effect_timeout__leaves_the_effect_ambiguous_for_an_operator(engine: Engine) -> None:
    """An effect past its deadline may have happened (or may yet): never retried by itself, it
    waits for an operator, who can say it was applied; its late result is not recorded."""
    release, returned = threading.Event(), threading.Event()

    def publish(ctx: Context, key: str) -> Any:
        release.wait(WAIT_S)
        returned.set()
        return {"late": key}

    engine.register(
        Workflow(
            "slow-publish",
            start="publish",
            nodes=[effect("publish", publish, timeout_s=4), compute("after", lambda ctx: "after")],
            edges={"publish": "after"},
        )
    )
    clock = FakeClock()
    engine.runner(clock=clock, **QUIET)
    run = engine.client.start("slow-publish")
    wait_until(lambda: engine.store.effects(run_id=run.run_id, status="applying"), what="the effect to apply")
    _advance_until(
        clock,
        lambda: engine.store.get_run_view(run.run_id).error_code == "effectAmbiguous",  # type: ignore[union-attr]
        "the effect timeout",
    )
    (stored,) = engine.store.effects(run_id=run.run_id)
    assert stored.status == "ambiguous"
    (attempt,) = engine.attempts(run.run_id)
    assert attempt.status == "timed_out"
    assert "timed out after 4 s; its outcome is unknown" in (attempt.error_message or "")
    release.set()
    assert returned.wait(WAIT_S)
    assert engine.store.effects(run_id=run.run_id)[0].status == "ambiguous"  # the late result: dropped

    engine.client.resolve_effect(stored.effect_id, "applied")
    _advance_until(clock, lambda: engine.client.result(run.run_id).finished, "the run to go on", step=0.1)
    result = engine.wait(run.run_id)
    assert (result.status, result.output) == ("done", "after")
    assert [(a.node_id, a.status) for a in engine.attempts(run.run_id)] == [
        ("publish", "timed_out"),
        ("publish", "completed"),
        ("after", "completed"),
    ]


def test_shell_timeout__routes_on_the_timeout_exit(engine: Engine) -> None:
    engine.register(
        Workflow(
            "slow-command",
            start="cmd",
            nodes=[
                shell("cmd", [sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=2),
                compute("fallback", lambda ctx: ctx.outputs["cmd"]),
            ],
            edges={"cmd.timeout": "fallback"},
        )
    )
    clock = FakeClock()
    engine.runner(clock=clock, **QUIET)
    run = engine.client.start("slow-command")
    wait_until(lambda: engine.attempts(run.run_id), what="the command to start")
    _advance_until(clock, lambda: engine.client.result(run.run_id).finished, "the command timeout")
    result = engine.wait(run.run_id)
    assert (result.status, result.output) == ("done", {"error": "timed out after 2 s"})
    assert [(a.node_id, a.status, a.exit_name) for a in engine.attempts(run.run_id)] == [
        ("cmd", "timed_out", "timeout"),
        ("fallback", "completed", "ok"),
    ]


def test_input_deadline__a_late_submission_is_refused_then_the_default_applies(engine: Engine) -> None:
    """The store counts the request's active time by its own clock: once the deadline passed, a
    submission is refused even though no runner swept it yet (the runner's clock is not moved)."""
    engine.register(
        Workflow(
            "late-input",
            start="ask",
            nodes=[
                input("ask", "Name?", timeout_s=0.2, default={"name": "anon"}),
                compute("greet", lambda ctx: ctx.outputs["ask"]),
            ],
            edges={"ask": "greet"},
        )
    )
    clock = FakeClock()
    engine.runner(clock=clock, **QUIET)
    session = engine.client.session("session-late")
    run = session.start("late-input")
    (request,) = wait_until(session.pending_inputs, what="the input request")
    wait_until(
        lambda: (engine.store.now() - request.created_at).total_seconds() > 0.25, what="the deadline to pass"
    )
    before = engine.store.last_event_seq()
    with pytest.raises(DeadlinePassed) as refused:
        session.submit(request.request_id, {"name": "late"})
    assert str(refused.value) == (
        f"Input request {request.request_id} closed: its deadline of 0.2 s of active time passed; "
        'the default {"name":"anon"} applies'
    )
    assert engine.store.last_event_seq() == before
    assert engine.store.submissions(request.request_id) == []
    _advance_until(clock, lambda: engine.client.result(run.run_id).finished, "the timeout policy")
    result = engine.wait(run.run_id)
    assert (result.status, result.output) == (
        "done",
        {"value": {"name": "anon"}, "provenance": "timeout_policy"},
    )
