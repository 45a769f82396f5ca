"""The runner's durability: source changes, unknown workflows, crash recovery from the last
committed node, poison runs, graceful stop, fencing of a runner that lost its lease, and several
runners sharing one store."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tether.engine.clock import FakeClock
from tether.engine.graph import Workflow, compute, include, shell, sleep
from tether.engine.registry import Registry
from tether.engine.runner import Runner, RunnerConfig
from tether.errors import CommitUnknown, StoreUnavailable
from tether.store import Store

from .conftest import Engine, wait_until


def _counting(calls: Counter[str]):  # type: ignore[no-untyped-def]
    def fn(ctx):  # type: ignore[no-untyped-def]
        calls[f"{ctx.run_id}/{ctx.node_id}"] += 1
        return {"node": ctx.node_id}

    return fn


def _abc(calls: Counter[str], name: str = "abc") -> Workflow:
    fn = _counting(calls)
    return Workflow(
        name,
        start="a",
        nodes=[compute("a", fn), compute("b", fn), compute("c", fn)],
        edges={"a": "b", "b": "c"},
    )


def _crash_during(engine: Engine, run_id: str, *, completed: list[str], running: str, token: str) -> None:
    """Play a runner that commits ``completed`` nodes, starts ``running`` and dies."""
    store = engine.store
    assert store.claim(run_id=run_id, runner_id=f"host-{token}", claim_token=token, lease_ms=300)
    assert store.mark_running(run_id=run_id, claim_token=token)
    if engine.statuses(run_id)[1] == "queued":
        store.set_run_status(run_id=run_id, claim_token=token, status="running")
    store.attempt_interrupt_active(run_id=run_id, claim_token=token)
    for node_id in completed:
        attempt = store.attempt_start(run_id=run_id, claim_token=token, node_id=node_id)
        store.attempt_finish(
            run_id=run_id,
            claim_token=token,
            attempt_id=attempt.attempt_id,
            status="completed",
            output={"node": node_id, "by": "dead"},
            exit_name="ok",
        )
    store.attempt_start(run_id=run_id, claim_token=token, node_id=running)
    wait_until(
        lambda: not store.verify_claim(run_id=run_id, claim_token=token), what="the dead lease to expire"
    )


# -- source identity -------------------------------------------------------------------------
def _waiting_note(engine: Engine, run_id: str) -> str:
    view = engine.store.get_run_view(run_id)
    assert view is not None
    return engine.client.waiting_notes([view]).get(run_id, "")


def test_source_change__a_runner_with_another_definition_leaves_the_run_queued(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    fn = _counting(calls)
    v1 = Workflow("evolving", start="a", nodes=[compute("a", fn)])
    v2 = Workflow("evolving", start="a", nodes=[compute("a", fn), compute("b", fn)], edges={"a": "b"})
    assert v1.digest != v2.digest
    engine.register(v1)
    run = engine.client.start("evolving")

    engine.runner(workflows=[v2])
    note = wait_until(lambda: _waiting_note(engine, run.run_id), what="the run to say why it waits")
    assert note.startswith("no live worker has workflow evolving at this definition (sha256:")
    assert engine.statuses(run.run_id) == ("queued", "queued")
    assert calls == Counter()
    assert engine.attempts(run.run_id) == []

    # The operator cancels it and restarts it on the new definition.
    assert engine.client.cancel(run.run_id) == "cancelled"
    engine.client.registry.add(v2, replace=True)
    child = engine.client.restart(run.run_id)
    assert child.definition_digest == v2.digest
    result = engine.wait(child.run_id)
    assert result.status == "done"
    assert [a.node_id for a in engine.attempts(child.run_id)] == ["a", "b"]


def test_source__the_same_definition_from_another_file_runs(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    wf = Workflow("sourced", start="a", nodes=[compute("a", _counting(calls))])
    engine.register(wf)
    run = engine.client.start("sourced")
    moved = Registry()
    moved.add(wf, {"kind": "file", "path": "elsewhere/sourced.py", "hash": wf.digest})
    engine.runner(registry=moved)
    assert engine.wait(run.run_id).status == "done"
    assert list(calls.values()) == [1]


def test_unknown_workflow__the_run_waits_for_a_worker_that_has_it(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    engine.register(_abc(calls, "known-to-client"))
    run = engine.client.start("known-to-client")
    engine.runner(workflows=[_abc(calls, "something-else")])
    note = wait_until(lambda: _waiting_note(engine, run.run_id), what="the run to say why it waits")
    assert "workflow known-to-client" in note
    assert engine.statuses(run.run_id) == ("queued", "queued")
    assert calls == Counter()
    engine.runner(workflows=[_abc(calls, "known-to-client")])
    assert engine.wait(run.run_id).status == "done"
    assert _waiting_note(engine, run.run_id) == ""


# -- crashes ---------------------------------------------------------------------------------
def test_crash__resumes_from_the_last_committed_node(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    engine.register(_abc(calls))
    run = engine.client.start("abc")
    _crash_during(engine, run.run_id, completed=["a"], running="b", token="crash-1")

    engine.runner()
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert calls == Counter({f"{run.run_id}/b": 1, f"{run.run_id}/c": 1})
    assert [(a.node_id, a.status) for a in engine.attempts(run.run_id)] == [
        ("a", "completed"),
        ("b", "interrupted"),
        ("b", "completed"),
        ("c", "completed"),
    ]
    assert engine.attempts(run.run_id, "a")[0].output == {"node": "a", "by": "dead"}
    assert engine.event_types(run.run_id).count("node.interrupted") == 1


def test_crash__poison_run_fails_after_max_takeovers(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    engine.register(_abc(calls))
    run = engine.client.start("abc")
    _crash_during(engine, run.run_id, completed=["a"], running="b", token="crash-1")
    _crash_during(engine, run.run_id, completed=[], running="b", token="crash-2")
    engine.runner(max_takeovers=2)
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert result.error_code == "poisonRun"
    assert "stopped 2 times while running node b (limit 2)" in (result.error_message or "")
    assert calls == Counter()


def test_crash__below_max_takeovers_the_run_still_completes(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    engine.register(_abc(calls))
    run = engine.client.start("abc")
    _crash_during(engine, run.run_id, completed=["a"], running="b", token="crash-1")
    _crash_during(engine, run.run_id, completed=[], running="b", token="crash-2")
    engine.runner(max_takeovers=3)
    assert engine.wait(run.run_id).status == "done"
    assert calls[f"{run.run_id}/b"] == 1


# -- change notices --------------------------------------------------------------------------
def test_notices__a_runner_listens_for_new_runs_only_while_it_has_a_free_slot(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(While it holds runs it listens to the journal for their cancels: not counted here.)"""
    for_runs: set[threading.Event] = set()
    subscribe, unsubscribe = engine.store.changes.subscribe, engine.store.changes.unsubscribe

    def counted(channel: str, wake: threading.Event) -> None:
        if channel == "runs":
            for_runs.add(wake)
        subscribe(channel, wake)

    def uncounted(channel: str, wake: threading.Event) -> None:
        if channel == "runs":
            for_runs.discard(wake)
        unsubscribe(channel, wake)

    monkeypatch.setattr(engine.store.changes, "subscribe", counted)
    monkeypatch.setattr(engine.store.changes, "unsubscribe", uncounted)
    latch = engine.latch()
    engine.register(Workflow("held", start="a", nodes=[compute("a", lambda ctx: latch.hold())]))
    engine.runner(concurrency=1)
    wait_until(lambda: bool(for_runs), what="the idle runner to listen")
    run = engine.client.start("held")
    assert latch.entered.wait(10)
    wait_until(lambda: not for_runs, what="the runner with no free slot to stop listening")
    waiting = engine.client.start("held")
    latch.release.set()
    assert engine.wait(run.run_id).status == "done"
    assert engine.wait(waiting.run_id).status == "done", "the run started while it did not listen"
    wait_until(lambda: bool(for_runs), what="the idle runner to listen again")


def test_notices__a_runner_whose_claims_find_runs_does_not_listen(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a drain the next claim comes with each completion: the runner listens (on SQLite,
    its watcher polls) only once a claim found the queue without a run, at the drain's end."""
    subscribed: list[str] = []
    subscribe = engine.store.changes.subscribe

    def counted(channel: str, wake: threading.Event) -> None:
        if channel == "runs":  # a client's wait follows "events"
            subscribed.append(channel)
        subscribe(channel, wake)

    monkeypatch.setattr(engine.store.changes, "subscribe", counted)
    engine.register(Workflow("quick", start="a", nodes=[compute("a", lambda ctx: None)]))
    runs = [engine.client.start("quick") for _ in range(40)]
    engine.runner(concurrency=2)
    for run in runs:
        assert engine.wait(run.run_id).status == "done"
    wait_until(lambda: engine.store.changes.listening, what="the idle runner to listen")
    assert subscribed == ["runs"], "the runner listened while its claims found runs"


# -- graceful stop ---------------------------------------------------------------------------
def test_stop__lets_the_node_finish_and_parks_the_run(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    latch = engine.latch()

    def held(ctx):  # type: ignore[no-untyped-def]
        calls["held"] += 1
        latch.hold()
        return {"held": True}

    wf = Workflow(
        "stoppable",
        start="held",
        nodes=[compute("held", held), compute("next", _counting(calls))],
        edges={"held": "next"},
    )
    engine.register(wf)
    first = engine.runner()
    run = engine.client.start("stoppable")
    assert latch.entered.wait(10)
    first.stop()
    latch.release.set()
    engine.stop(first)
    assert engine.statuses(run.run_id) == ("parked", "running")
    assert [(a.node_id, a.status) for a in engine.attempts(run.run_id)] == [("held", "completed")]
    assert engine.store.get_run(run.run_id).runner_id is None  # type: ignore[union-attr]

    engine.runner()
    assert engine.wait(run.run_id).status == "done"
    assert calls == Counter({"held": 1, f"{run.run_id}/next": 1})


def test_stop__a_node_begun_with_the_claim_but_not_run_is_interrupted_not_a_takeover(engine: Engine) -> None:
    # A new run's first node starts in the claim's own transaction; a runner that stops before the
    # node runs marks that attempt interrupted and parks the run, and the next runner does not count
    # it as a runner that died (with max_takeovers=1 it would fail the run as poisoned).
    calls: Counter[str] = Counter()
    engine.register(_abc(calls))
    run = engine.client.start("abc")

    class StopsBeforeRunning(Runner):
        def _drive(self, active):  # type: ignore[no-untyped-def]
            self.stop()
            super()._drive(active)

    StopsBeforeRunning(engine.store, engine.client.registry, config=RunnerConfig(poll_ms=20)).run()
    assert [(a.node_id, a.status) for a in engine.store.attempts(run.run_id)] == [("a", "interrupted")]
    assert engine.client.result(run.run_id).status == "parked"
    assert calls == Counter()
    engine.runner(max_takeovers=1)
    assert engine.wait(run.run_id).status == "done"
    assert calls == Counter({f"{run.run_id}/{node}": 1 for node in "abc"})


def test_stop__interrupts_a_command_and_parks_the_run(engine: Engine) -> None:
    wf = Workflow(
        "long-cmd", start="cmd", nodes=[shell("cmd", [sys.executable, "-c", "import time; time.sleep(30)"])]
    )
    engine.register(wf)
    runner = engine.runner()
    run = engine.client.start("long-cmd")
    wait_until(lambda: engine.attempts(run.run_id, "cmd"), what="the command to start")
    wait_until(lambda: runner.active_run_ids, what="the runner to hold the run")
    stopped = time.monotonic()
    engine.stop(runner)
    # The 30 s command was killed, not waited for.
    assert time.monotonic() - stopped < 20
    assert engine.statuses(run.run_id) == ("parked", "running")
    (attempt,) = engine.attempts(run.run_id)
    assert attempt.status == "interrupted"
    assert attempt.error_message == "interrupted by runner shutdown"


# -- fencing ---------------------------------------------------------------------------------
def test_fencing__a_runner_that_lost_its_lease_cannot_commit(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: Counter[str] = Counter()
    latch = engine.latch()

    def held(ctx):  # type: ignore[no-untyped-def]
        calls["held"] += 1
        latch.hold()
        return {"late": True}

    wf = Workflow(
        "fenced",
        start="held",
        nodes=[compute("held", held), compute("next", _counting(calls))],
        edges={"held": "next"},
    )
    engine.register(wf)
    runner = engine.runner(lease_ms=400, renew_ms=100)
    run = engine.client.start("fenced")
    assert latch.entered.wait(10)
    # Renewals stop getting through (a partitioned runner): the lease lapses while the node runs.
    monkeypatch.setattr(engine.store, "renew", lambda **_: False)

    def expired() -> bool:
        record = engine.store.get_run(run.run_id)
        return (
            record is not None
            and record.claim_expires_at is not None
            and record.claim_expires_at < datetime.now(UTC)
        )

    wait_until(expired, what="the runner's lease to lapse")
    thief = engine.store.claim(
        run_id=run.run_id, runner_id="host-thief", claim_token="t-thief", lease_ms=30_000
    )
    assert thief is not None

    latch.release.set()
    wait_until(lambda: not runner.active_run_ids, what="the fenced runner to give up")
    assert engine.store.verify_claim(run_id=run.run_id, claim_token="t-thief")
    (attempt,) = engine.attempts(run.run_id)
    assert (attempt.node_id, attempt.status) == ("held", "running")
    assert calls == Counter({"held": 1})


# -- several runners -------------------------------------------------------------------------
def test_runners__share_a_store_and_run_every_node_once(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    engine.register(_abc(calls))
    engine.runner(runner_id="host-one", concurrency=2)
    engine.runner(runner_id="host-two", concurrency=2)
    runs = [engine.client.start("abc", {"n": n}) for n in range(6)]
    for run in runs:
        assert engine.wait(run.run_id).status == "done"
    assert len(calls) == 18
    assert set(calls.values()) == {1}


@pytest.mark.parametrize("concurrency", [1, 3])
def test_runner__is_not_idle_while_a_run_thread_claims_the_next_run(engine: Engine, concurrency: int) -> None:
    # A run thread that finishes a run claims the next one itself; in between, the runner holds no
    # run but is not idle: run(stop_when=...) returns only once nothing is left to claim.
    calls: Counter[str] = Counter()
    engine.register(_abc(calls))
    runs = [engine.client.start("abc", {"n": n}) for n in range(12)]
    runner = Runner(engine.store, engine.client.registry, config=RunnerConfig(concurrency=concurrency))
    runner.run(stop_when=lambda: True)
    assert [engine.client.result(run.run_id).status for run in runs] == ["done"] * 12
    assert len(calls) == 36


def test_runner__run_returns_when_stop_when_holds_while_idle(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    engine.register(_abc(calls))
    run = engine.client.start("abc")
    runner = Runner(
        engine.store, engine.client.registry, config=RunnerConfig(lease_ms=2000, poll_ms=20, renew_ms=100)
    )
    done = threading.Event()

    def work() -> None:
        runner.run(stop_when=lambda: engine.client.result(run.run_id).finished)
        done.set()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    assert done.wait(10)
    thread.join(5)
    assert engine.client.result(run.run_id).status == "done"
    assert len(calls) == 3


def test_source_change__of_a_mounted_workflow_changes_the_including_definition(engine: Engine) -> None:
    calls: Counter[str] = Counter()

    def parent_with(fn: Any) -> Workflow:
        child = Workflow("child", start="x", nodes=[compute("x", fn)])
        return Workflow(
            "parent",
            start="pre",
            nodes=[compute("pre", _counting(calls)), include("inc", child)],
            edges={"pre": "inc"},
        )

    def x_one(ctx):  # type: ignore[no-untyped-def]
        return 1

    def x_two(ctx):  # type: ignore[no-untyped-def]
        return 2

    v1, v2 = parent_with(x_one), parent_with(x_two)
    assert v1.digest != v2.digest
    engine.register(v1)
    run = engine.client.start("parent")
    engine.runner(workflows=[v2])
    wait_until(lambda: _waiting_note(engine, run.run_id), what="the run to say why it waits")
    assert calls == Counter() and engine.attempts(run.run_id) == []


def test_crash__graceful_stops_do_not_count_as_takeovers(engine: Engine) -> None:
    flag = engine.tmp_path / "go"
    script = f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.02)"
    wf = Workflow("patient", start="cmd", nodes=[shell("cmd", [sys.executable, "-c", script])])
    engine.register(wf)
    run = engine.client.start("patient")
    for stops in (1, 2):
        runner = engine.runner()
        wait_until(lambda n=stops: len(engine.attempts(run.run_id)) == n, what="the command to start")
        engine.stop(runner)
        assert engine.attempts(run.run_id)[-1].status == "interrupted"
    # One real crash after two graceful stops.
    _crash_during(engine, run.run_id, completed=[], running="cmd", token="crash-1")
    flag.write_text("go")
    engine.runner(max_takeovers=2)
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert [a.status for a in engine.attempts(run.run_id)] == ["interrupted"] * 3 + ["completed"]


def test_unexpected_error__parks_the_run_for_an_operator(engine: Engine) -> None:
    from tether.engine.graph import Node

    # A hand-built compute node without a function: the runner itself trips over it.
    broken = Node("broken", "compute", {"retries": 0, "backoffS": 1.0, "exits": []})
    engine.register(Workflow("odd", start="broken", nodes=[broken]))
    engine.runner()
    run = engine.client.start("odd")
    wait_until(
        lambda: engine.store.get_run_view(run.run_id).error_code == "runnerNoProgress",  # type: ignore[union-attr]
        what="the run to park for no progress",
    )
    view = engine.store.get_run_view(run.run_id)
    assert view is not None and view.status == "parked"
    assert "AssertionError" in (view.error_message or "")
    assert engine.store.claim_next(runner_id="probe", claim_token="t-probe", lease_ms=1000) is None


def test_source_change__a_mounted_builtin_revision_bump_changes_the_definition(engine: Engine) -> None:
    calls: Counter[str] = Counter()
    fn = _counting(calls)

    def build(child_revision: str) -> tuple[Workflow, Workflow]:
        child = Workflow("sub", start="x", nodes=[compute("x", fn)], revision=child_revision)
        return Workflow("host", start="inc", nodes=[include("inc", child)]), child

    host_v1, sub_v1 = build("1")
    host_v2, sub_v2 = build("2")
    assert host_v1.digest != host_v2.digest
    engine.register(host_v1, sub_v1)
    run = engine.client.start("host")
    engine.runner(workflows=[host_v2, sub_v2])
    wait_until(lambda: _waiting_note(engine, run.run_id), what="the run to say why it waits")
    assert calls == Counter()


# -- one active run per session ----------------------------------------------------------------
def _session_pair(engine: Engine, latch):  # type: ignore[no-untyped-def]
    napper = Workflow(
        "napper",
        start="nap",
        nodes=[sleep("nap", 0.2), compute("after", lambda ctx: {"woke": True})],
        edges={"nap": "after"},
    )
    holder = Workflow("holder", start="hold", nodes=[compute("hold", lambda ctx: latch.hold())])
    engine.register(napper, holder)


def test_session__a_run_waking_while_its_session_is_busy_does_not_stop_the_runner(engine: Engine) -> None:
    latch = engine.latch()
    _session_pair(engine, latch)
    runner = engine.runner()
    session = engine.client.session("session-shared")
    napping = session.start("napper")
    wait_until(lambda: engine.attempts(napping.run_id, "nap"), what="the first run to sleep")
    # The session's slot is free while the first run sleeps, so a second run takes it.
    holding = session.start("holder")
    assert latch.entered.wait(10)
    wake = datetime.fromisoformat(engine.attempts(napping.run_id, "nap")[0].output["wakeAt"])
    # Let the runner try the woken run a few times while the session is still busy.
    wait_until(lambda: datetime.now(UTC) > wake + timedelta(seconds=0.2), what="the sleep to be over")
    assert engine.statuses(napping.run_id) == ("parked", "running")
    assert runner.active_run_ids == [holding.run_id]
    latch.release.set()
    assert engine.wait(holding.run_id).status == "done"
    assert engine.wait(napping.run_id).output == {"woke": True}


def test_session__a_run_blocked_by_its_session_does_not_starve_other_runs(engine: Engine) -> None:
    latch = engine.latch()
    _session_pair(engine, latch)
    engine.register(_abc(Counter(), "free"))
    engine.runner()
    session = engine.client.session("session-starve")
    napping = session.start("napper")
    wait_until(lambda: engine.attempts(napping.run_id, "nap"), what="the first run to sleep")
    session.start("holder")
    assert latch.entered.wait(10)
    wake = datetime.fromisoformat(engine.attempts(napping.run_id, "nap")[0].output["wakeAt"])
    wait_until(lambda: datetime.now(UTC) > wake + timedelta(seconds=0.05), what="the sleep to be over")
    free = engine.client.start("free")
    try:
        assert engine.wait(free.run_id, timeout=3).status == "done"
    finally:
        latch.release.set()


# -- concurrency -----------------------------------------------------------------------------
def test_concurrency__runs_execute_in_parallel_up_to_the_limit(engine: Engine) -> None:
    barrier = threading.Barrier(2, timeout=5)
    wf = Workflow("together", start="meet", nodes=[compute("meet", lambda ctx: {"slot": barrier.wait()})])
    engine.register(wf)
    engine.runner(concurrency=2)
    runs = [engine.client.start("together") for _ in range(2)]
    outputs = sorted(engine.wait(run.run_id).output["slot"] for run in runs)
    assert outputs == [0, 1]


def test_concurrency__a_runner_never_holds_more_runs_than_its_limit(engine: Engine) -> None:
    latch = engine.latch()
    inside: list[str] = []

    def held(ctx):  # type: ignore[no-untyped-def]
        inside.append(ctx.run_id)
        latch.hold()
        return {}

    engine.register(Workflow("one-at-a-time", start="held", nodes=[compute("held", held)]))
    runner = engine.runner(concurrency=1)
    runs = [engine.client.start("one-at-a-time") for _ in range(2)]
    assert latch.entered.wait(10)
    time.sleep(0.2)  # several claim rounds while the first run holds the only slot
    assert len(inside) == 1
    assert len(runner.active_run_ids) == 1
    waiting = next(r for r in runs if r.run_id not in inside)
    assert engine.statuses(waiting.run_id) == ("queued", "queued")
    latch.release.set()
    for run in runs:
        assert engine.wait(run.run_id).status == "done"
    assert len(inside) == 2


def test_runner__an_idle_runner_is_woken_by_a_new_run_not_by_its_poll(engine: Engine) -> None:
    """With a 60 s poll, an idle runner's wait grows to seconds (it doubles from 10 ms); a new
    run's change notice must cut it short. On a fake clock the wait is let grow past 2 s, then
    the clock stands still: only the notice can end the wait, so the run getting done proves it."""
    engine.register(Workflow("wake", start="a", nodes=[compute("a", lambda ctx: {"ok": True})]))
    clock = FakeClock()

    def idle_wait() -> float:
        # Let every wait under way run out, until the claim loop waits longer than 2 s.
        ahead = [w for w in clock.waiters() if w != float("inf")]
        if ahead and max(ahead) > 2.0:
            return max(ahead)
        clock.advance(max(ahead, default=0.01))
        return 0.0

    engine.runner(poll_ms=60_000, clock=clock)
    wait_until(idle_wait, what="the idle runner's wait to grow past 2 s")
    run = engine.client.start("wake")
    result = engine.wait(run.run_id, timeout=10.0)
    assert result.status == "done" and result.output == {"ok": True}


def test_runner__takes_over_a_dead_runners_run_when_its_lease_lapses_not_at_its_poll(engine: Engine) -> None:
    """With a 60 s poll, an idle runner's wait doubles from 10 ms: its checks come about 2.55 s and
    5.11 s after it starts. A dead runner's 3 s lease lapses between them; the run must be taken
    over then, not at the poll about 2 s later."""
    engine.register(Workflow("lapse", start="a", nodes=[compute("a", lambda ctx: {"ok": True})]))
    run = engine.client.start("lapse")
    claimed_at = time.monotonic()
    assert engine.store.claim(run_id=run.run_id, runner_id="host-dead", claim_token="dead", lease_ms=3000)
    engine.runner(poll_ms=60_000)

    result = engine.wait(run.run_id, timeout=10.0)
    taken_over_after = time.monotonic() - claimed_at
    assert result.status == "done" and result.output == {"ok": True}
    assert 3.0 <= taken_over_after < 4.5, taken_over_after


def test_runner__a_wait_as_short_as_a_short_poll_does_not_ask_when_leases_lapse(engine: Engine) -> None:
    """An idle wait of at most 20 ms (the poll) ends soon enough by itself: the runner does not
    ask the store when another runner's lease lapses (a query) before it. With a longer poll,
    the same runner asks once its wait has grown past ``LAPSE_ASKED_PAST_S``."""
    engine.register(Workflow("lapse", start="a", nodes=[compute("a", lambda ctx: {"ok": True})]))
    held = engine.client.start("lapse")
    assert engine.store.claim(run_id=held.run_id, runner_id="host-other", claim_token="t", lease_ms=60_000)
    asked: list[int | None] = []
    ask = engine.store.next_lease_lapse_ms

    def counted(**kwargs: Any) -> int | None:
        asked.append(ask(**kwargs))
        return asked[-1]

    engine.store.next_lease_lapse_ms = counted  # type: ignore[method-assign]
    for poll_ms, idle_rounds in ((20, 30), (200, 8)):
        runs = [engine.client.start("lapse") for _ in range(3)]
        rounds = iter(range(idle_rounds))
        runner = Runner(engine.store, engine.client.registry, config=RunnerConfig(poll_ms=poll_ms))
        runner.run(stop_when=lambda rounds=rounds: next(rounds, None) is None)
        assert all(engine.client.result(run.run_id).status == "done" for run in runs)
        if poll_ms == 20:
            assert asked == []
    assert asked and all(lapse is not None and lapse > 50_000 for lapse in asked)


def _count_write_transactions(store: Store) -> Counter[str]:
    """Count the outermost write transactions the store opens from now on."""
    counted: Counter[str] = Counter()
    db: Any = store.db
    opened = db._outermost

    def counting(write: bool, first: bool) -> Any:
        counted["write" if write else "read"] += 1
        return opened(write, first)

    db._outermost = counting
    return counted


def test_runner__a_completed_run_and_the_next_runs_claim_commit_together(engine: Engine) -> None:
    """A run thread completing a run claims the next one (claim, take-up, first node begun) in
    the completion's own transaction: draining one-node runs one at a time costs about one write
    transaction per run, not one for the completion and one for the next claim."""
    engine.register(Workflow("one", start="a", nodes=[compute("a", lambda ctx: {"n": ctx.input})]))
    runs = [engine.client.start("one", n) for n in range(20)]
    writes = _count_write_transactions(engine.store)
    runner = Runner(engine.store, engine.client.registry, config=RunnerConfig(concurrency=1, poll_ms=20))
    runner.run(stop_when=lambda: True)

    assert [engine.client.result(run.run_id).output for run in runs] == [{"n": n} for n in range(20)]
    assert 20 <= writes["write"] <= 28, writes


def test_runner__a_node_completion_begins_the_next_compute_node_in_its_transaction(engine: Engine) -> None:
    """A completed node whose successor is a compute node begins it in the same transaction:
    draining three-node runs one at a time costs about three write transactions per run (one per
    node), not five (a node's start apart from the completion before it)."""
    calls: Counter[str] = Counter()
    engine.register(_abc(calls))
    runs = [engine.client.start("abc") for _ in range(10)]
    writes = _count_write_transactions(engine.store)
    runner = Runner(engine.store, engine.client.registry, config=RunnerConfig(concurrency=1, poll_ms=20))
    runner.run(stop_when=lambda: True)

    assert calls == Counter({f"{run.run_id}/{node}": 1 for run in runs for node in "abc"})
    for run in runs:
        assert engine.client.result(run.run_id).output == {"node": "c"}
        assert [(a.node_id, a.status) for a in engine.attempts(run.run_id)] == [
            ("a", "completed"),
            ("b", "completed"),
            ("c", "completed"),
        ]
    assert 30 <= writes["write"] <= 38, writes


def test_runner__a_claim_that_fails_with_a_completion_leaves_the_completion_to_commit_alone(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next run's take-up fails unexpectedly inside the completing run's transaction: that
    rolls back, the completion commits alone (its node is not run again), and the failing run is
    parked for an operator as making no progress."""
    calls: Counter[str] = Counter()
    engine.register(Workflow("one", start="a", nodes=[compute("a", _counting(calls))]))
    first = engine.client.start("one", run_id="run-first")
    broken = engine.client.start("one", run_id="run-broken")
    take_up = Runner._take_up

    def failing(self: Runner, active: Any) -> bool:
        if active.run_id == broken.run_id:
            raise RuntimeError("take-up trips over a bug")
        return take_up(self, active)

    monkeypatch.setattr(Runner, "_take_up", failing)
    engine.runner(concurrency=1)
    assert engine.wait(first.run_id).status == "done"
    wait_until(
        lambda: engine.store.get_run_view(broken.run_id).error_code == "runnerNoProgress",  # type: ignore[union-attr]
        what="the broken run to park for no progress",
    )
    assert calls == Counter({f"{first.run_id}/a": 1})
    assert [(a.node_id, a.status) for a in engine.attempts(first.run_id)] == [("a", "completed")]


@pytest.mark.parametrize("outcome", ["landed", "lost"])
def test_runner__a_completion_whose_commit_is_unknown_launches_the_runs_it_did_claim(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    """The connection breaks as the transaction that completes a run and claims the next one
    commits (``CommitUnknown``). Landed, the next run was claimed and taken up: it is executed at
    once, not left to its lease (a minute here) to lapse. Lost, nothing was claimed: the next run
    is claimed again as usual. Either way every node runs once, but for the cut completion's own
    when it was lost: its runner hands that run back and it runs again."""
    calls: Counter[str] = Counter()
    engine.register(Workflow("one", start="a", nodes=[compute("a", _counting(calls))]))
    runs = [engine.client.start("one", run_id=f"run-{n}") for n in range(4)]
    db: Any = engine.store.db
    opened = db._outermost
    completing, claiming = engine.store.complete, engine.store.claim_next
    cut: list[str] = []  # the run whose completion was cut, and the run claimed with it
    here = threading.local()  # what the thread's open transaction completed and claimed

    def complete(**kwargs: Any) -> bool:
        here.completed = kwargs["run_id"]
        return completing(**kwargs)

    def claim_next(**kwargs: Any) -> Any:
        record = claiming(**kwargs)
        here.claimed = getattr(here, "claimed", None) or record
        return record

    @contextmanager
    def cutting(write: bool, first: bool) -> Iterator[None]:
        here.completed = here.claimed = None
        with opened(write, first):
            yield
            cutting_this = not cut and here.completed is not None and here.claimed is not None
            if cutting_this:
                cut.extend([here.completed, here.claimed.run_id])
                if outcome == "lost":
                    raise CommitUnknown("the connection broke while committing (lost)")
        if cutting_this:
            raise CommitUnknown("the connection broke while committing (landed)")

    monkeypatch.setattr(engine.store, "complete", complete)
    monkeypatch.setattr(engine.store, "claim_next", claim_next)
    db._outermost = cutting
    engine.runner(concurrency=1, lease_ms=60_000, renew_ms=20_000)

    for run in runs:
        assert engine.wait(run.run_id, timeout=10).status == "done"
    completed, claimed = cut
    expected = Counter({f"{run.run_id}/a": 1 for run in runs})
    if outcome == "lost":
        expected[f"{completed}/a"] += 1
    assert calls == expected
    assert len(engine.attempts(claimed)) == 1


def _transaction_of_each_completion(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, method: str = "complete"
) -> dict[str, list[int]]:
    """Number the outermost transactions the store opens from now on: each run's numbers are
    those of the transactions its calls of ``method`` (the run's completion) went out in."""
    db: Any = engine.store.db
    opened = db._outermost
    numbers = itertools.count()
    here = threading.local()
    completed_in: dict[str, list[int]] = {}

    @contextmanager
    def numbered(write: bool, first: bool) -> Iterator[None]:
        here.number = next(numbers)
        with opened(write, first):
            yield

    completing = getattr(engine.store, method)

    def complete(**kwargs: Any) -> Any:
        done = completing(**kwargs)
        completed_in.setdefault(kwargs["run_id"], []).append(here.number)
        return done

    monkeypatch.setattr(engine.store, method, complete)
    monkeypatch.setattr(db, "_outermost", numbered)
    return completed_in


def _complete_as_a_group(
    engine: Engine, runs: int, workflow: str = "one", *, also: str | None = None, then: str | None = None
) -> list[str]:
    """Start ``runs`` runs (the first of workflow ``also`` when given) on a runner whose group
    commit is held until the completions of their first nodes all wait for it, then run ``then``
    for the group to claim when given; the ids of the group's runs."""
    runner = engine.runner(concurrency=runs)
    runner._committing.acquire()  # another group committing: the completions queue behind it
    try:
        names = [also or workflow] + [workflow] * (runs - 1)
        run_ids = [engine.client.start(name, run_id=f"run-{n}").run_id for n, name in enumerate(names)]
        wait_until(lambda: len(runner._completions) == runs, what="every completion to wait for the commit")
        if then is not None:
            engine.client.start(workflow, run_id=then)
    finally:
        runner._committing.release()
    return run_ids


def test_runner__completions_waiting_together_commit_in_one_transaction(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run threads that complete their runs while another thread commits wait for it, then
    commit every completion in one transaction (a group commit)."""
    calls: Counter[str] = Counter()
    engine.register(Workflow("one", start="a", nodes=[compute("a", _counting(calls))]))
    completed_in = _transaction_of_each_completion(engine, monkeypatch)
    run_ids = _complete_as_a_group(engine, 3)

    for run_id in run_ids:
        assert engine.wait(run_id).status == "done"
    assert len({numbers[-1] for numbers in completed_in.values()}) == 1, completed_in
    assert calls == Counter({f"{run_id}/a": 1 for run_id in run_ids})


def test_runner__node_completions_of_runs_that_go_on_commit_together_too(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node completion after which the run goes on joins a group commit too (it frees no slot)."""
    calls: Counter[str] = Counter()
    engine.register(_abc(calls))
    finished_in = _transaction_of_each_completion(engine, monkeypatch, "attempt_finish")
    run_ids = _complete_as_a_group(engine, 3, "abc")

    for run_id in run_ids:
        assert engine.wait(run_id).status == "done"
    assert len({numbers[0] for numbers in finished_in.values()}) == 1, finished_in  # node a's
    assert calls == Counter({f"{run_id}/{node}": 1 for run_id in run_ids for node in "abc"})


def test_runner__a_group_whose_transaction_fails_completes_each_run_alone(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One completion of a group fails (once): the group's transaction rolls back, nothing of it
    lands, and each run completes alone in its own transaction; no node runs again."""
    calls: Counter[str] = Counter()
    engine.register(Workflow("one", start="a", nodes=[compute("a", _counting(calls))]))
    completed_in = _transaction_of_each_completion(engine, monkeypatch)
    numbered_complete = engine.store.complete
    tried: list[str] = []

    def failing_once(**kwargs: Any) -> bool:
        tried.append(kwargs["run_id"])
        if tried.count("run-1") == 1 and kwargs["run_id"] == "run-1":
            raise RuntimeError("the completion trips over a bug")
        return numbered_complete(**kwargs)

    monkeypatch.setattr(engine.store, "complete", failing_once)
    run_ids = _complete_as_a_group(engine, 3)

    for run_id in run_ids:
        assert engine.wait(run_id).status == "done"
    assert tried.count("run-1") == 2, tried  # in the group, then alone
    landed = [completed_in[run_id][-1] for run_id in run_ids]
    rolled_back = [numbers[0] for numbers in completed_in.values() if len(numbers) == 2]
    assert len(set(landed)) == 3 and not set(rolled_back) & set(landed), completed_in
    assert calls == Counter({f"{run_id}/a": 1 for run_id in run_ids})
    for run_id in run_ids:
        assert [(a.node_id, a.status) for a in engine.attempts(run_id)] == [("a", "completed")]


def test_runner__a_run_claimed_with_a_group_that_cannot_be_started_leaves_the_group_committed(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starting a run claimed with a group commit fails after the commit: the group's completions
    stand (they are not completed again, nor is the run that goes on, its next node begun with
    the group, parked); the run that could not be started is taken over once its lease lapses."""
    calls: Counter[str] = Counter()
    engine.register(Workflow("one", start="a", nodes=[compute("a", _counting(calls))]), _abc(calls))
    launch, commit_group = Runner._launch, Runner._commit_group
    here = threading.local()
    failed: list[str] = []

    def launch_failing_once_in_a_group(self: Runner, active: Any) -> None:
        if not failed and getattr(here, "committing", False):
            failed.append(active.run_id)
            raise RuntimeError("can't start new thread")
        launch(self, active)

    def committing_group(self: Runner, group: Any) -> None:
        here.committing = True
        try:
            commit_group(self, group)
        finally:
            here.committing = False

    monkeypatch.setattr(Runner, "_launch", launch_failing_once_in_a_group)
    monkeypatch.setattr(Runner, "_commit_group", committing_group)
    going_on, ending = _complete_as_a_group(engine, 2, also="abc", then="run-next")

    for run_id in (going_on, ending, "run-next"):
        assert engine.wait(run_id).status == "done"
    assert failed == ["run-next"]
    taken_over = [(a.node_id, a.status) for a in engine.attempts("run-next")]
    assert taken_over == [("a", "interrupted"), ("a", "completed")]
    assert [(a.node_id, a.status) for a in engine.attempts(going_on)] == [(n, "completed") for n in "abc"]
    assert [(a.node_id, a.status) for a in engine.attempts(ending)] == [("a", "completed")]
    assert calls == Counter({f"{going_on}/{n}": 1 for n in "abc"} | {f"{ending}/a": 1, "run-next/a": 1})


@pytest.mark.parametrize("outcome", ["landed", "lost"])
def test_runner__every_run_of_a_group_whose_commit_is_unknown_hears_it(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    """The connection breaks as a group's transaction commits (``CommitUnknown``): each run's
    thread gets that outcome as its own. Landed, every run is done and no node runs again; lost,
    each runner hands its run back and the node runs again."""
    calls: Counter[str] = Counter()
    engine.register(Workflow("one", start="a", nodes=[compute("a", _counting(calls))]))
    db: Any = engine.store.db
    opened = db._outermost
    completing = engine.store.complete
    here = threading.local()
    cut: list[int] = []

    def complete(**kwargs: Any) -> bool:
        here.completed = getattr(here, "completed", 0) + 1
        return completing(**kwargs)

    @contextmanager
    def cutting(write: bool, first: bool) -> Iterator[None]:
        here.completed = 0
        with opened(write, first):
            yield
            cutting_this = not cut and here.completed == 2
            if cutting_this:
                cut.append(here.completed)
                if outcome == "lost":
                    raise CommitUnknown("the connection broke while committing (lost)")
        if cutting_this:
            raise CommitUnknown("the connection broke while committing (landed)")

    monkeypatch.setattr(engine.store, "complete", complete)
    monkeypatch.setattr(db, "_outermost", cutting)
    run_ids = _complete_as_a_group(engine, 2)

    for run_id in run_ids:
        assert engine.wait(run_id).status == "done"
    assert cut == [2]
    assert calls == Counter({f"{run_id}/a": 1 if outcome == "landed" else 2 for run_id in run_ids})
    # Lost, each run's own thread handed it back at once (no lease had to lapse for a takeover).
    handed_back = [("a", "interrupted", "handed back by its runner")] if outcome == "lost" else []
    for run_id in run_ids:
        assert [(a.node_id, a.status, a.error_message) for a in engine.attempts(run_id)] == [
            *handed_back,
            ("a", "completed", None),
        ]


def test_concurrency__group_commits_never_run_more_nodes_at_once_than_the_limit(engine: Engine) -> None:
    """The runs claimed with a group commit fill the slots its ended runs free, no more."""
    lock = threading.Lock()
    running: list[int] = [0]
    most: list[int] = [0]

    def gauged(ctx):  # type: ignore[no-untyped-def]
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.005)
        with lock:
            running[0] -= 1
        return {}

    engine.register(
        Workflow("gauged", start="a", nodes=[compute("a", gauged), compute("b", gauged)], edges={"a": "b"})
    )
    runs = [engine.client.start("gauged") for _ in range(40)]
    engine.runner(concurrency=3)
    for run in runs:
        assert engine.wait(run.run_id).status == "done"
    assert most[0] == 3


def test_stop__a_run_completing_as_its_runner_stops_is_done_and_the_runner_stops(engine: Engine) -> None:
    """A run whose last node returns after its runner was told to stop completes (no claim comes
    with it: the run waiting for its slot stays queued), and the runner stops."""
    latch = engine.latch()

    def held(ctx):  # type: ignore[no-untyped-def]
        latch.hold()
        return {"held": True}

    engine.register(Workflow("last", start="held", nodes=[compute("held", held)]))
    runner = engine.runner(concurrency=1)
    run = engine.client.start("last")
    waiting = engine.client.start("last")
    assert latch.entered.wait(10)
    runner.stop()
    latch.release.set()
    engine.stop(runner)
    assert engine.statuses(run.run_id) == ("done", "completed")
    assert engine.statuses(waiting.run_id) == ("queued", "queued")


@pytest.mark.parametrize("how", ["stopped", "store_lost"])
def test_runner__a_resumed_run_given_back_before_its_step_goes_back_to_the_queue(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A resumed run is queued with its durable status still waiting until a step moves it on.
    A runner that gives it back before that (a stop, a lost database session) requeues it:
    parked and waiting, it would look like a run waiting on a person and no runner would claim
    it again."""
    calls: Counter[str] = Counter()
    engine.register(_abc(calls))
    run = engine.client.start("abc")
    store = engine.store
    assert store.claim(run_id=run.run_id, runner_id="host-old", claim_token="old", lease_ms=60_000)
    store.set_run_status(run_id=run.run_id, claim_token="old", status="running")
    store.set_run_status(run_id=run.run_id, claim_token="old", status="waiting")
    assert store.park(run_id=run.run_id, claim_token="old")
    assert store.request_resume(run_id=run.run_id)
    assert engine.statuses(run.run_id) == ("queued", "waiting")
    take_up = Runner._take_up

    def give_back_after_take_up(self: Runner, active: Any) -> bool:
        taken_up = take_up(self, active)
        if how == "stopped":
            self.stop()
        else:
            raise StoreUnavailable("The connection to the database was lost; retry the call")
        return taken_up

    monkeypatch.setattr(Runner, "_take_up", give_back_after_take_up)
    first = engine.runner()
    wait_until(lambda: engine.event_types(run.run_id).count("lease.claimed") >= 2, what="the claim")
    engine.stop(first)
    assert engine.statuses(run.run_id) == ("queued", "waiting")
    assert not calls, "no step ran"
    monkeypatch.setattr(Runner, "_take_up", take_up)
    engine.runner()
    assert engine.wait(run.run_id).status == "done"
    assert calls == Counter({f"{run.run_id}/{node}": 1 for node in "abc"})
