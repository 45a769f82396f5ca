"""Compute nodes (exits, retries with durable backoff) and shell nodes (routing, timeout, output)."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime

import pytest

from tether.engine.clock import FakeClock
from tether.engine.graph import Exit, Workflow, compute, include, shell
from tether.errors import InvalidInput

from .conftest import Engine, wait_until

PY = sys.executable


def passthrough(ctx):  # type: ignore[no-untyped-def]
    return {"node": ctx.node_id}


# -- compute ---------------------------------------------------------------------------------
def test_compute__exit_routes_to_the_matching_edge(engine: Engine) -> None:
    def classify(ctx):  # type: ignore[no-untyped-def]
        return Exit("big" if ctx.input["n"] > 10 else "small", {"n": ctx.input["n"]})

    def big(ctx):  # type: ignore[no-untyped-def]
        return {"size": "big", "seen": ctx.outputs["classify"]}

    wf = Workflow(
        "classify",
        start="classify",
        nodes=[
            compute("classify", classify, exits=["big", "small"]),
            compute("big", big),
            compute("small", passthrough),
        ],
        edges={"classify.big": "big", "classify.small": "small"},
    )
    engine.register(wf)
    engine.runner()
    high = engine.client.start("classify", {"n": 42})
    low = engine.client.start("classify", {"n": 1})

    result = engine.wait(high.run_id)
    assert result.status == "done"
    assert result.run_state_status == "completed"
    assert result.output == {"size": "big", "seen": {"n": 42}}
    attempts = engine.attempts(high.run_id)
    assert [(a.node_id, a.exit_name) for a in attempts] == [("classify", "big"), ("big", "ok")]

    assert engine.wait(low.run_id).output == {"node": "small"}
    assert [a.node_id for a in engine.attempts(low.run_id)] == ["classify", "small"]


def test_compute__unrouted_exit_completes_the_run(engine: Engine) -> None:
    wf = Workflow(
        "stop-early",
        start="a",
        nodes=[
            compute("a", lambda ctx: Exit("stop", "early"), exits=["go", "stop"]),
            compute("b", passthrough),
        ],
        edges={"a.go": "b"},
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("stop-early")
    result = engine.wait(run.run_id)
    assert (result.status, result.output) == ("done", "early")
    assert [a.node_id for a in engine.attempts(run.run_id)] == ["a"]


def test_compute__retry_backs_off_durably_then_succeeds(engine: Engine) -> None:
    calls: list[int] = []

    def flaky(ctx):  # type: ignore[no-untyped-def]
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("upstream timed out")
        return {"attempt": ctx.attempt}

    wf = Workflow("flaky", start="fetch", nodes=[compute("fetch", flaky, retries=2, backoff_s=0.4)])
    engine.register(wf)
    engine.runner()
    run = engine.client.start("flaky")

    failed = wait_until(
        lambda: [a for a in engine.attempts(run.run_id) if a.status == "failed"], what="first failure"
    )
    # The failure and the park with a future available_at are one transaction.
    queue, state = engine.statuses(run.run_id)
    assert queue == "parked"
    assert state == "running"
    (available_at,) = engine.sql("SELECT available_at FROM run_queue WHERE run_id = ?", run.run_id)[0]
    assert failed[0].finished_at is not None
    assert available_at >= failed[0].finished_at.timestamp() * 1000 + 390

    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert result.output == {"attempt": 2}
    attempts = engine.attempts(run.run_id)
    assert [(a.attempt_number, a.status) for a in attempts] == [(1, "failed"), (2, "completed")]
    assert "ConnectionError: upstream timed out" in (attempts[0].error_message or "")
    gap = (attempts[1].started_at - attempts[0].finished_at).total_seconds()  # type: ignore[operator]
    assert gap >= 0.39
    assert calls == [1, 2]


def test_compute__always_failing_ends_failed_after_retries_plus_one(engine: Engine) -> None:
    calls: list[int] = []

    def broken(ctx):  # type: ignore[no-untyped-def]
        calls.append(ctx.attempt)
        raise ValueError(f"broken on try {ctx.attempt}")

    wf = Workflow(
        "broken",
        start="work",
        nodes=[compute("work", broken, retries=2, backoff_s=0.02), compute("never", passthrough)],
        edges={"work": "never"},
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("broken")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert result.run_state_status == "failed"
    assert result.error_code == "nodeFailed"
    assert "Node work failed after 3 attempt(s)" in (result.error_message or "")
    assert "broken on try 3" in (result.error_message or "")
    attempts = engine.attempts(run.run_id)
    assert [(a.node_id, a.status) for a in attempts] == [("work", "failed")] * 3
    assert calls == [1, 2, 3]


def test_compute__non_json_output_fails_the_attempt(engine: Engine) -> None:
    wf = Workflow("nonjson", start="a", nodes=[compute("a", lambda ctx: {"when": datetime.now(UTC)})])
    engine.register(wf)
    engine.runner()
    run = engine.client.start("nonjson")
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "Unsupported JSON value type: datetime" in (result.error_message or "")


def test_compute__context_carries_input_and_earlier_outputs(engine: Engine) -> None:
    seen: list[dict[str, object]] = []

    def record(ctx):  # type: ignore[no-untyped-def]
        seen.append({"run": ctx.run_id, "input": ctx.input, "outputs": dict(ctx.outputs)})
        return {"sum": ctx.input["x"] + ctx.outputs["first"]["value"]}

    wf = Workflow(
        "ctx",
        start="first",
        nodes=[compute("first", lambda ctx: {"value": 10}), compute("second", record)],
        edges={"first": "second"},
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("ctx", {"x": 5})
    assert engine.wait(run.run_id).output == {"sum": 15}
    assert seen == [{"run": run.run_id, "input": {"x": 5}, "outputs": {"first": {"value": 10}}}]


def test_include__nested_sub_graphs_run_end_to_end(engine: Engine) -> None:
    inner = Workflow(
        "inner", start="x", nodes=[compute("x", passthrough), compute("y", passthrough)], edges={"x": "y"}
    )
    middle = Workflow(
        "middle", start="in", nodes=[include("in", inner), compute("m", passthrough)], edges={"in": "m"}
    )
    outer = Workflow(
        "outer", start="mid", nodes=[include("mid", middle), compute("z", passthrough)], edges={"mid": "z"}
    )
    engine.register(outer)
    engine.runner()
    run = engine.client.start("outer")
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert [a.node_id for a in engine.attempts(run.run_id)] == ["mid/in/x", "mid/in/y", "mid/m", "z"]
    assert result.output == {"node": "z"}


# -- shell -----------------------------------------------------------------------------------
def _shell_flow(name: str, command: list[str], **kwargs) -> Workflow:  # type: ignore[no-untyped-def]
    return Workflow(
        name,
        start="cmd",
        nodes=[shell("cmd", command, **kwargs), compute("good", passthrough), compute("bad", passthrough)],
        edges={"cmd.ok": "good", "cmd.error": "bad"},
    )


def test_shell__status_zero_routes_ok(engine: Engine) -> None:
    engine.register(_shell_flow("sh-ok", [PY, "-c", "print('hello')"]))
    engine.runner()
    run = engine.client.start("sh-ok")
    assert engine.wait(run.run_id).status == "done"
    cmd, after = engine.attempts(run.run_id)
    assert (cmd.exit_name, after.node_id) == ("ok", "good")
    assert cmd.output == {"exitCode": 0, "stdout": "hello\n", "stderr": "", "truncated": False}


def test_shell__nonzero_status_routes_error_when_an_error_edge_exists(engine: Engine) -> None:
    engine.register(_shell_flow("sh-err", [PY, "-c", "import sys; sys.stderr.write('oops'); sys.exit(3)"]))
    engine.runner()
    run = engine.client.start("sh-err")
    assert engine.wait(run.run_id).status == "done"
    cmd, after = engine.attempts(run.run_id)
    assert (cmd.status, cmd.exit_name, after.node_id) == ("completed", "error", "bad")
    assert cmd.output["exitCode"] == 3
    assert cmd.output["stderr"] == "oops"


def test_shell__nonzero_status_without_error_edge_fails_the_run(engine: Engine) -> None:
    wf = Workflow(
        "sh-fail",
        start="cmd",
        nodes=[shell("cmd", [PY, "-c", "import sys; print('bye', file=sys.stderr); sys.exit(4)"])],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("sh-fail")
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "exit status 4: bye" in (result.error_message or "")


def test_shell__error_edge_of_a_same_named_top_level_node_does_not_route_an_included_command(
    engine: Engine,
) -> None:
    inner = Workflow("inner-sh", start="cmd", nodes=[shell("cmd", [PY, "-c", "raise SystemExit(2)"])])
    outer = Workflow(
        "outer-sh",
        start="cmd",
        nodes=[shell("cmd", [PY, "-c", "pass"]), include("inc", inner), compute("after", passthrough)],
        edges={"cmd.ok": "inc", "cmd.error": "after", "inc": "after"},
    )
    engine.register(outer)
    engine.runner()
    run = engine.client.start("outer-sh")
    result = engine.wait(run.run_id)
    # inc/cmd has no error route of its own: its failure fails the run.
    assert result.error_code == "nodeFailed"
    assert [(a.node_id, a.status) for a in engine.attempts(run.run_id)] == [
        ("cmd", "completed"),
        ("inc/cmd", "failed"),
    ]


def test_shell__timeout_records_the_attempt_timed_out_and_fails_the_run(engine: Engine) -> None:
    wf = Workflow(
        "sh-slow", start="cmd", nodes=[shell("cmd", [PY, "-c", "import time; time.sleep(30)"], timeout_s=0.3)]
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("sh-slow")
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "timed out after 0.3 s" in (result.error_message or "")
    (attempt,) = engine.attempts(run.run_id)
    assert attempt.status == "timed_out"
    assert (attempt.finished_at - attempt.started_at).total_seconds() < 10  # type: ignore[operator]


def test_shell__the_deadline_is_judged_by_the_runners_clock(engine: Engine) -> None:
    """On a fake clock a command runs past its timeout in real time until the clock is moved."""
    wf = Workflow(
        "sh-clock", start="cmd", nodes=[shell("cmd", [PY, "-c", "import time; time.sleep(30)"], timeout_s=5)]
    )
    engine.register(wf)
    clock = FakeClock()
    # The lease renewal cadence is on the fake clock too: a lease this long needs none here.
    engine.runner(clock=clock, lease_ms=60_000, renew_ms=20_000)
    run = engine.client.start("sh-clock")
    wait_until(lambda: engine.attempts(run.run_id), what="the command to start")
    # The deadline is taken once the command started: no earlier than now on the fake clock.
    began = clock.monotonic()
    while engine.attempts(run.run_id)[0].status == "running":
        assert clock.monotonic() - began < 60, "the command was never stopped"
        clock.advance(0.5)
        time.sleep(0.05)  # several polls of the command (real time)
    # It ran for a fraction of a second of real time, and ended once the clock passed 5 s.
    assert clock.monotonic() - began >= 5.0
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "timed out after 5 s" in (result.error_message or "")


def test_shell__output_is_bounded_and_flagged_truncated(engine: Engine) -> None:
    wf = Workflow("sh-big", start="cmd", nodes=[shell("cmd", [PY, "-c", "print('x' * 100)"], max_output=10)])
    engine.register(wf)
    engine.runner()
    run = engine.client.start("sh-big")
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert result.output["stdout"] == "x" * 10
    assert result.output["truncated"] is True


def test_shell__env_from_and_cwd_are_honoured(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    workdir = engine.tmp_path / "work"
    workdir.mkdir()
    script = (
        "import os, json; print(json.dumps([os.getcwd(), os.environ['TETHER_PROBE'], 'PATH' in os.environ]))"
    )
    wf = Workflow(
        "sh-env",
        start="cmd",
        nodes=[shell("cmd", [PY, "-c", script], cwd=str(workdir), env_from=["TETHER_PROBE"])],
    )
    engine.register(wf)
    # The worker's environment, as the step runs: here the runner's process is the test's.
    monkeypatch.setenv("TETHER_PROBE", "42")
    engine.runner()
    run = engine.client.start("sh-env")
    result = engine.wait(run.run_id)
    cwd, probe, has_path = json.loads(result.output["stdout"])
    assert cwd == str(workdir.resolve())
    assert probe == "42"
    assert has_path is True


def test_shell__a_variable_the_worker_lacks_fails_the_run_at_once_naming_it(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TETHER_PROBE_MISSING", raising=False)
    wf = Workflow(
        "sh-lacks",
        start="cmd",
        nodes=[shell("cmd", [PY, "-c", "print(1)"], env_from=["TETHER_PROBE_MISSING"], retries=3)],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("sh-lacks")
    result = engine.wait(run.run_id)
    assert (result.status, result.error_code) == ("failed", "nodeFailed")
    assert "the worker's environment lacks TETHER_PROBE_MISSING (named in env_from)" in (
        result.error_message or ""
    )
    # A configuration error: no retry (retries=3 is for the command's own failures).
    assert [a.status for a in engine.attempts(run.run_id)] == ["failed"]


def test_shell__env_from_names_are_in_the_definition_and_values_nowhere_in_the_store(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cret-value-4f1d2c"
    monkeypatch.setenv("TETHER_PROBE_TOKEN", secret)
    script = "import os; assert os.environ['TETHER_PROBE_TOKEN'].startswith('s3cret'); print('ok')"
    wf = Workflow(
        "sh-secret", start="cmd", nodes=[shell("cmd", [PY, "-c", script], env_from=["TETHER_PROBE_TOKEN"])]
    )
    assert wf.snapshot()["nodes"]["cmd"]["envFrom"] == ["TETHER_PROBE_TOKEN"]
    assert secret not in json.dumps(wf.snapshot())
    engine.register(wf)
    engine.runner()
    run = engine.client.start("sh-secret")
    assert engine.wait(run.run_id).output["stdout"].strip() == "ok"
    # Every blob the store holds (definitions, outputs, events' bodies), on either backend: the
    # variable's name is there, its value nowhere.
    stored = b"\n".join(bytes(row[0]) for row in engine.sql("SELECT content FROM blobs"))
    assert b"TETHER_PROBE_TOKEN" in stored
    assert secret.encode() not in stored


def test_shell__missing_program_fails_the_node(engine: Engine) -> None:
    wf = Workflow("sh-missing", start="cmd", nodes=[shell("cmd", [str(engine.tmp_path / "no-such-program")])])
    engine.register(wf)
    engine.runner()
    run = engine.client.start("sh-missing")
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "cannot start" in (result.error_message or "")


def test_shell__error_of_an_included_terminal_command_routes_by_the_including_node(engine: Engine) -> None:
    inner = Workflow("inner-err", start="cmd", nodes=[shell("cmd", [PY, "-c", "raise SystemExit(5)"])])
    outer = Workflow(
        "outer-err",
        start="inc",
        nodes=[include("inc", inner), compute("recover", passthrough), compute("fine", passthrough)],
        edges={"inc.error": "recover", "inc.ok": "fine"},
    )
    engine.register(outer)
    engine.runner()
    run = engine.client.start("outer-err")
    result = engine.wait(run.run_id)
    assert (result.status, result.output) == ("done", {"node": "recover"})
    assert [(a.node_id, a.exit_name) for a in engine.attempts(run.run_id)] == [
        ("inc/cmd", "error"),
        ("recover", "ok"),
    ]


# -- the step bound ----------------------------------------------------------------------------
def test_step_bound__a_cycle_without_end_fails_the_run_at_max_steps(engine: Engine) -> None:
    def again(ctx):  # type: ignore[no-untyped-def]
        return Exit("again", {"round": ctx.outputs.get("ping", {}).get("round", 0) + 1})  # type: ignore[union-attr]

    looping = Workflow(
        "looping",
        start="ping",
        nodes=[compute("ping", again, exits=["again"]), compute("pong", lambda ctx: None)],
        edges={"ping.again": "pong", "pong": "ping"},
        max_steps=7,
    )
    engine.register(looping)
    engine.runner()
    run = engine.client.start("looping")
    result = engine.wait(run.run_id)
    assert (result.status, result.error_code) == ("failed", "stepLimit")
    assert "stopped after 7 steps" in (result.error_message or "")
    assert "max_steps=7" in (result.error_message or "")
    completed = [a for a in engine.attempts(run.run_id) if a.status == "completed"]
    assert len(completed) == 7
    # A node begun ahead with the last step is settled with the run, never run.
    assert {a.status for a in engine.attempts(run.run_id)[7:]} <= {"failed"}


def test_step_bound__is_part_of_the_definition_only_when_not_the_default() -> None:
    def build(**kwargs):  # type: ignore[no-untyped-def]
        return Workflow("bounded", start="a", nodes=[compute("a", lambda ctx: None)], **kwargs)

    assert "maxSteps" not in build().snapshot()
    assert build(max_steps=1000).digest == build().digest
    assert build(max_steps=5).snapshot()["maxSteps"] == 5
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidInput, match="max_steps must be a whole number"):
            build(max_steps=bad)
