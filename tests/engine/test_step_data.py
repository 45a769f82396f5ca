"""Data from earlier steps reaching a step that is not Python code: a ``shell`` command's
arguments and standard input, a decision's question and an input's prompt may be functions of
the step's context. A function that fails is that step's failure, with its traceback."""

from __future__ import annotations

import sys

import pytest

from tether.engine.graph import Workflow, compute, decision, input, shell
from tether.errors import InvalidInput

from .conftest import Engine, wait_until

PY = sys.executable
ECHO_ARGS_AND_STDIN = "import sys; print(sys.argv[1:], sys.stdin.read())"


def _count(ctx):  # type: ignore[no-untyped-def]
    return {"n": 3, "name": "report.csv"}


def test_shell__arguments_and_stdin_come_from_earlier_outputs(engine: Engine) -> None:
    flow = Workflow(
        "sh-data",
        start="count",
        nodes=[
            compute("count", _count),
            shell(
                "cmd",
                lambda ctx: [PY, "-c", ECHO_ARGS_AND_STDIN, ctx.outputs["count"]["name"]],
                stdin=lambda ctx: {"n": ctx.outputs["count"]["n"]},
            ),
        ],
        edges={"count": "cmd"},
    )
    engine.register(flow)
    engine.runner()
    run = engine.client.start("sh-data")
    assert engine.wait(run.run_id).status == "done"
    command = engine.attempts(run.run_id, "cmd")[0]
    assert command.output["stdout"] == "['report.csv'] {\"n\": 3}\n"  # type: ignore[index]


def test_shell__text_stdin_is_sent_as_it_is(engine: Engine) -> None:
    flow = Workflow(
        "sh-text", start="cmd", nodes=[shell("cmd", [PY, "-c", ECHO_ARGS_AND_STDIN], stdin="héllo")]
    )
    engine.register(flow)
    engine.runner()
    run = engine.client.start("sh-text")
    assert engine.wait(run.run_id).status == "done"
    assert engine.attempts(run.run_id)[0].output["stdout"] == "[] héllo\n"  # type: ignore[index]


def test_shell__a_command_function_returning_no_list_fails_the_step_with_its_story(engine: Engine) -> None:
    flow = Workflow(
        "sh-bad", start="cmd", nodes=[shell("cmd", lambda ctx: "echo hi", retries=1, backoff_s=0.01)]
    )
    engine.register(flow)
    engine.runner()
    run = engine.client.start("sh-bad")
    result = engine.wait(run.run_id)
    assert result.status == "failed" and result.error_code == "nodeFailed"
    assert "the command function of node cmd returned 'echo hi', not a list of strings" in (
        result.error_message or ""
    )
    attempts = engine.attempts(run.run_id)
    assert [a.status for a in attempts] == ["failed", "failed"]  # retried under the node's policy
    assert "Traceback (most recent call last)" in (attempts[0].error_message or "")


def test_shell__a_raising_stdin_function_fails_the_step(engine: Engine) -> None:
    flow = Workflow(
        "sh-raise", start="cmd", nodes=[shell("cmd", [PY, "-c", "pass"], stdin=lambda ctx: 1 / 0)]
    )
    engine.register(flow)
    engine.runner()
    run = engine.client.start("sh-raise")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert "ZeroDivisionError" in (result.error_message or "")


def test_decision__the_question_is_built_from_earlier_outputs(engine: Engine) -> None:
    flow = Workflow(
        "ask-about",
        start="count",
        nodes=[
            compute("count", _count),
            decision(
                "approve",
                lambda ctx: f"Send {ctx.outputs['count']['name']} to {ctx.input['to']}?",
                options=["yes", "no"],
            ),
        ],
        edges={"count": "approve"},
    )
    engine.register(flow)
    engine.runner()
    run = engine.client.start("ask-about", {"to": "finance"})
    [open_decision] = wait_until(lambda: engine.client.decisions(run.run_id), what="the decision")
    assert open_decision.request["question"] == "Send report.csv to finance?"  # type: ignore[index]
    engine.client.answer(open_decision.decision_id, "yes")
    assert engine.wait(run.run_id).status == "done"


def test_decision__a_question_function_returning_no_text_fails_the_run(engine: Engine) -> None:
    flow = Workflow(
        "ask-empty", start="approve", nodes=[decision("approve", lambda ctx: "", options=["yes"])]
    )
    engine.register(flow)
    engine.runner()
    run = engine.client.start("ask-empty")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert "the question function of node approve returned ''" in (result.error_message or "")
    assert engine.client.decisions(run.run_id) == []


def test_input__the_prompt_is_built_from_earlier_outputs(engine: Engine) -> None:
    flow = Workflow(
        "prompted",
        start="count",
        nodes=[
            compute("count", _count),
            input(
                "ask",
                lambda ctx: f"How many rows of {ctx.outputs['count']['name']}?",
                schema={"type": "integer"},
            ),
        ],
        edges={"count": "ask"},
    )
    engine.register(flow)
    engine.runner()
    session = engine.client.session("desk")
    run = session.start("prompted")
    [request] = wait_until(session.pending_inputs, what="the input request")
    assert request.payload["prompt"] == "How many rows of report.csv?"  # type: ignore[index]
    with pytest.raises(InvalidInput, match="expected integer"):
        session.submit(request.request_id, "many")
    session.submit(request.request_id, 12)
    result = engine.wait(run.run_id)
    assert result.status == "done" and result.output == {"value": 12, "provenance": "human"}


def test_functions_are_part_of_the_definition() -> None:
    def first(ctx):  # type: ignore[no-untyped-def]
        return ["true"]

    def second(ctx):  # type: ignore[no-untyped-def]
        return ["false"]

    one = Workflow("f", start="cmd", nodes=[shell("cmd", first)])
    other = Workflow("f", start="cmd", nodes=[shell("cmd", second)])
    plain = Workflow("f", start="cmd", nodes=[shell("cmd", ["true"])])
    assert len({one.digest, other.digest, plain.digest}) == 3
    assert one.snapshot()["nodes"]["cmd"]["hooks"]["command"].startswith(  # type: ignore[index, call-overload]
        "test_functions_are_part_of_the_definition.<locals>.first@"
    )
    assert "hooks" not in plain.snapshot()["nodes"]["cmd"]  # type: ignore[operator]


@pytest.mark.parametrize(
    "build",
    [
        lambda: shell("cmd", "echo hi"),
        lambda: shell("cmd", ["echo"], stdin=b"bytes"),  # type: ignore[arg-type]
        lambda: decision("d", "", options=["a"]),
        lambda: input("i", 42),  # type: ignore[arg-type]
    ],
)
def test_builders_refuse_what_is_neither_a_value_nor_a_function(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidInput):
        build()
