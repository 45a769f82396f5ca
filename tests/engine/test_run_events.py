"""Events into a running run, driven through the client with real runners: an event sent
before the run reaches its wait is kept; each is taken once; a payload breaking the schema is
refused at send; a wait times out by its ``timeout`` exit."""

from __future__ import annotations

import pytest

from tether.engine.context import Context
from tether.engine.graph import Workflow, compute, wait_for_event
from tether.errors import Conflict, InvalidInput, NotFound

from .conftest import Engine, wait_until

APPROVAL = {"type": "object", "properties": {"by": {"type": "string"}}, "required": ["by"]}


def approved_by(ctx: Context) -> object:
    return [ctx.outputs["first"]["payload"], ctx.outputs.get("second", {}).get("payload")]


TWICE = Workflow(
    "twice",
    start="first",
    nodes=[
        wait_for_event("first", "approved", schema=APPROVAL),
        wait_for_event("second", "approved", schema=APPROVAL),
        compute("report", approved_by),
    ],
    edges={"first": "second", "second": "report"},
)
TIMED = Workflow(
    "timed",
    start="wait",
    nodes=[
        wait_for_event("wait", "shipped", timeout_s=0.3),
        compute("arrived", lambda ctx: {"arrived": ctx.outputs["wait"]["payload"]}),
        compute("late", lambda ctx: {"late": ctx.outputs["wait"]}),
    ],
    edges={"wait.ok": "arrived", "wait.timeout": "late"},
)


def waiting_for_event(engine: Engine, run_id: str) -> None:
    wait_until(
        lambda: (
            engine.statuses(run_id) == ("parked", "waiting") and engine.store.event_wait(run_id) is not None
        ),
        what=f"run {run_id} to wait for an event",
    )


def test_event_sent_before_the_wait__is_kept_and_each_taken_once(engine: Engine) -> None:
    engine.register(TWICE)
    run = engine.client.start("twice")
    engine.client.send_event(run.run_id, "approved", {"by": "ann"})  # before any runner
    engine.runner()
    waiting_for_event(engine, run.run_id)  # the first wait took it; the second waits
    assert [e.taken_by_attempt_id is not None for e in engine.store.inbox(run.run_id)] == [True]
    engine.client.send_event(run.run_id, "approved", {"by": "bob"})
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output == [{"by": "ann"}, {"by": "bob"}]
    events = engine.store.inbox(run.run_id)
    assert len({e.taken_by_attempt_id for e in events}) == 2


def test_event_sent_to_a_waiting_run__wakes_it(engine: Engine) -> None:
    engine.register(TIMED)
    engine.runner()
    run = engine.client.start("timed")
    engine.client.send_event(run.run_id, "shipped", {"id": 7})
    result = engine.wait(run.run_id)
    assert result.output == {"arrived": {"id": 7}}


def test_wait_for_event__times_out_by_its_timeout_exit(engine: Engine) -> None:
    engine.register(TIMED)
    engine.runner()
    run = engine.client.start("timed")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"late": {"name": "shipped", "timedOut": True}}
    assert engine.store.event_wait(run.run_id) is None
    # A finished run takes no more events: refused, nothing kept.
    with pytest.raises(Conflict, match="takes no more events"):
        engine.client.send_event(run.run_id, "shipped", {"id": 8})
    assert engine.store.inbox(run.run_id) == []


def test_send_event__refuses_a_payload_breaking_the_schema_or_an_unknown_name(engine: Engine) -> None:
    engine.register(TWICE)
    run = engine.client.start("twice")
    with pytest.raises(InvalidInput, match="Event approved does not match its schema"):
        engine.client.send_event(run.run_id, "approved", {"by": 3})
    with pytest.raises(InvalidInput, match="waits for no event named 'rejected' \\(its events: approved\\)"):
        engine.client.send_event(run.run_id, "rejected", None)
    with pytest.raises(NotFound):
        engine.client.send_event("nope", "approved", {"by": "ann"})
    assert engine.store.inbox(run.run_id) == []


def test_wait_for_event__declares_its_timeout_exit() -> None:
    with pytest.raises(InvalidInput, match="exit node w cannot produce: 'timeout'"):
        Workflow(
            "no_timeout",
            start="w",
            nodes=[wait_for_event("w", "go"), compute("x", lambda ctx: None)],
            edges={"w.timeout": "x"},
        )
