"""Routing on failure: after its last try, a failed step of any kind that can fail leaves by its
``error`` exit when the graph routes it, and the recovery step finds the error (with its
traceback) in ``ctx.outputs[node]["error"]``; unrouted, the run fails as before."""

from __future__ import annotations

from collections import Counter

import pytest

from tether.engine.graph import Workflow, agent, compute, effect, node_exits, shell, sleep
from tether.engine.providers import ScriptedProvider
from tether.errors import InvalidInput

from .conftest import Engine


def _recover(ctx):  # type: ignore[no-untyped-def]
    failed = next(iter(n for n in ctx.outputs if n != "recover"))
    return {"recovered_from": failed, "error": ctx.outputs[failed]["error"]}


def test_error_route__a_compute_step_failing_after_its_retries_goes_to_recovery(engine: Engine) -> None:
    calls: Counter[str] = Counter()

    def flaky(ctx):  # type: ignore[no-untyped-def]
        calls[ctx.run_id] += 1
        raise ConnectionError(f"try {ctx.attempt} failed")

    flow = Workflow(
        "recovering",
        start="call",
        nodes=[compute("call", flaky, retries=1, backoff_s=0.01), compute("recover", _recover)],
        edges={"call.error": "recover"},
    )
    engine.register(flow)
    engine.runner()
    run = engine.client.start("recovering")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert calls[run.run_id] == 2  # retried first, routed after the last try
    assert result.output["recovered_from"] == "call"  # type: ignore[index]
    error = result.output["error"]  # type: ignore[index]
    assert error.startswith("ConnectionError: try 2 failed") and "Traceback (most recent call last)" in error
    attempts = engine.attempts(run.run_id)
    assert [(a.node_id, a.status, a.exit_name) for a in attempts] == [
        ("call", "failed", None),
        ("call", "failed", "error"),
        ("recover", "completed", "ok"),
    ]


def test_error_route__unrouted_the_run_fails_as_before(engine: Engine) -> None:
    def broken(ctx):  # type: ignore[no-untyped-def]
        raise ValueError("no")

    engine.register(Workflow("unrouted", start="call", nodes=[compute("call", broken)]))
    engine.runner()
    result = engine.wait(engine.client.start("unrouted").run_id)
    assert (result.status, result.error_code) == ("failed", "nodeFailed")


def test_error_route__a_rejected_effect_a_shell_that_cannot_start_and_a_bad_model_answer(
    engine: Engine,
) -> None:
    def reject(ctx, key):  # type: ignore[no-untyped-def]
        raise PermissionError("the payment was declined")

    model = ScriptedProvider([{"wrong": True}])
    flow = Workflow(
        "all-kinds",
        start="pay",
        nodes=[
            effect("pay", reject),
            compute("after_pay", lambda ctx: {"pay": ctx.outputs["pay"]["error"].splitlines()[0]}),
            shell("run", [str(engine.tmp_path / "no-such-program")]),
            compute("after_run", lambda ctx: {"run": ctx.outputs["run"]["error"]}),
            agent("ask", model, "question", schema={"type": "object", "required": ["answer"]}),
            compute("after_ask", lambda ctx: {"ask": ctx.outputs["ask"]["error"].splitlines()[0]}),
        ],
        edges={
            "pay.error": "after_pay",
            "after_pay": "run",
            "run.error": "after_run",
            "after_run": "ask",
            "ask.error": "after_ask",
        },
    )
    engine.register(flow)
    engine.runner()
    run = engine.client.start("all-kinds")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    outputs = result.outputs
    assert outputs["after_pay"] == {"pay": "PermissionError: the payment was declined"}
    (paid,) = engine.store.effects(run_id=run.run_id)
    assert paid.status == "rejected"
    assert "cannot start" in outputs["after_run"]["run"]  # type: ignore[index]
    assert "does not match the schema" in outputs["after_ask"]["ask"]  # type: ignore[index]


def test_error_exit__offered_by_every_kind_that_can_fail_and_no_other() -> None:
    assert "error" in node_exits(compute("a", lambda ctx: None))
    assert "error" in node_exits(effect("b", lambda ctx, key: None))
    assert "error" not in node_exits(sleep("c", 1))
    with pytest.raises(InvalidInput, match="cannot produce: 'error'"):
        Workflow(
            "napping",
            start="nap",
            nodes=[sleep("nap", 1), compute("after", lambda ctx: None)],
            edges={"nap.error": "after"},
        )
