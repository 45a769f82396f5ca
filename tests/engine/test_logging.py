"""The worker says what it does: at INFO one line per claim, per step start, finish and failure
(with its duration), hand-off and takeover, each with the run's structured fields; the JSON
formatter writes them for machines."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from tether.engine.graph import Workflow, compute
from tether.logs import JsonFormatter

from .conftest import WAIT_S, Engine


def test_runner__info_lines_tell_a_runs_story_with_fields(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    def flaky(ctx):  # type: ignore[no-untyped-def]
        if ctx.attempt == 1:
            raise ConnectionError("upstream down")
        return {"ok": True}

    engine.register(
        Workflow(
            "told",
            start="fetch",
            nodes=[compute("fetch", flaky, retries=1, backoff_s=0.01), compute("save", lambda ctx: 1)],
            edges={"fetch": "save"},
        )
    )
    with caplog.at_level(logging.INFO, logger="tether"):
        runner = engine.runner(concurrency=1)
        run = engine.client.start("told")
        assert engine.wait(run.run_id).status == "done"
        engine.stop(runner)
    mine = [
        r for r in caplog.records if getattr(r, "run_id", None) == run.run_id and r.name == "tether.runner"
    ]
    # The client tells of the run too (tether.client), without the runner's fields.
    assert [r.getMessage() for r in caplog.records if r.name == "tether.client"] == [
        f"run {run.run_id} reserved (workflow told)"
    ]
    assert all(r.name == "tether.runner" and r.levelno == logging.INFO for r in mine)
    assert all(r.workflow == "told" and r.runner_id == runner.runner_id for r in mine)
    messages = [r.getMessage() for r in mine]
    assert any(m == f"run {run.run_id} (told) claimed by {runner.label}" for m in messages)
    steps = [
        (getattr(r, "node", None), getattr(r, "attempt", None), r.getMessage().split()[-1]) for r in mine
    ]
    assert ("fetch", 1, "started") in steps and ("fetch", 2, "started") in steps
    assert ("save", 1, "started") in steps
    [failed] = [r for r in mine if "failed after" in r.getMessage()]
    assert (failed.node, failed.attempt) == ("fetch", 1)
    assert failed.duration_s >= 0
    assert "will retry" in failed.getMessage() and "ConnectionError: upstream down" in failed.getMessage()
    finished = [r.node for r in mine if "finished in" in r.getMessage()]
    assert finished == ["fetch", "save"]
    assert messages[-1] == f"run {run.run_id} completed"


def test_runner__a_stop_hand_off_is_told(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(ctx):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(WAIT_S)
        return 1

    engine.register(
        Workflow("handed", start="a", nodes=[compute("a", slow), compute("b", slow)], edges={"a": "b"})
    )
    with caplog.at_level(logging.INFO, logger="tether"):
        runner = engine.runner(concurrency=1)
        run = engine.client.start("handed")
        assert entered.wait(WAIT_S)
        runner.stop()
        release.set()
        engine.stop(runner)
    handed = [
        r
        for r in caplog.records
        if r.getMessage() == f"run {run.run_id} handed back (its runner is stopping)"
    ]
    assert len(handed) == 1 and handed[0].run_id == run.run_id


def test_json_formatter__one_object_per_line_with_the_fields() -> None:
    record = logging.LogRecord("tether.runner", logging.INFO, __file__, 1, "run %s claimed", ("r-1",), None)
    record.run_id, record.node, record.attempt, record.duration_s = "r-1", "fetch", 2, 0.25
    line = JsonFormatter().format(record)
    assert "\n" not in line
    body = json.loads(line)
    assert body["message"] == "run r-1 claimed"
    assert (body["level"], body["logger"]) == ("INFO", "tether.runner")
    assert (body["run_id"], body["node"], body["attempt"], body["duration_s"]) == ("r-1", "fetch", 2, 0.25)
    assert body["time"].endswith("+00:00")
    assert "workflow" not in body  # fields a record does not carry are left out
