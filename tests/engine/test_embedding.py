"""Embedding the runner in an application: ``start()`` in background threads, ``stop(timeout=...)``
that hands runs back and returns within the timeout (abandoned steps fenced out), ``join()``;
signal handlers that chain to the application's own; and a quiet stop when the application closes
the store under a live runner."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest

from tether import open_store
from tether.client import Tether
from tether.engine.graph import Workflow, compute
from tether.engine.registry import Registry
from tether.engine.runner import Runner, RunnerConfig
from tether.errors import InvalidInput

from .conftest import LEASE_MS, POLL_MS, RENEW_MS, WAIT_S, Engine, wait_until


def _config(**overrides: int) -> RunnerConfig:
    return RunnerConfig(**{"lease_ms": LEASE_MS, "poll_ms": POLL_MS, "renew_ms": RENEW_MS, **overrides})


@pytest.fixture
def runners() -> Iterator[list[Runner]]:
    started: list[Runner] = []
    yield started
    for runner in started:
        runner.stop(timeout=WAIT_S)


def test_runner__start_stop_join_in_the_background(engine: Engine, runners: list[Runner]) -> None:
    engine.register(Workflow("echo", start="a", nodes=[compute("a", lambda ctx: {"got": ctx.input})]))
    runner = Runner(engine.store, engine.client.registry, config=_config())
    runners.append(runner)
    thread = runner.start()
    assert thread.daemon and thread.is_alive()
    run = engine.client.start("echo", {"n": 1})
    assert engine.wait(run.run_id).output == {"got": {"n": 1}}
    with pytest.raises(InvalidInput, match="already started"):
        runner.start()
    assert runner.join(timeout=0.05) is False  # still running
    assert runner.stop(timeout=WAIT_S) is True
    assert runner.join() is True
    assert not thread.is_alive()


def test_runner__stop_with_a_timeout_hands_a_hung_step_back_and_fences_it_out(
    engine: Engine, runners: list[Runner]
) -> None:
    hung, released, calls = threading.Event(), threading.Event(), []

    def stuck(ctx):  # type: ignore[no-untyped-def]
        calls.append(ctx.attempt)
        if len(calls) == 1:
            hung.set()
            released.wait(WAIT_S)  # never returns in time
            return {"late": True}
        return {"late": False}

    engine.register(Workflow("stuck", start="a", nodes=[compute("a", stuck)]))
    runner = Runner(engine.store, engine.client.registry, config=_config(concurrency=1))
    runners.append(runner)
    runner.start()
    run = engine.client.start("stuck")
    assert hung.wait(WAIT_S)

    assert runner.stop(timeout=1.0) is True  # returned although the step still runs
    assert runner.join(timeout=0) is True
    (attempt,) = engine.attempts(run.run_id)
    assert attempt.status == "interrupted"
    assert engine.statuses(run.run_id)[0] in ("queued", "parked")

    released.set()  # the abandoned step returns now: its result must not be recorded
    wait_until(lambda: not runner.active_run_ids, what="the abandoned step's thread to let go")
    assert [a.status for a in engine.attempts(run.run_id)] == ["interrupted"]

    engine.runner(concurrency=1)  # another runner finishes the run
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert result.output == {"late": False}


def test_runner__signal_handlers_need_the_main_thread(engine: Engine) -> None:
    runner = Runner(engine.store, Registry([]), config=_config())
    raised: list[BaseException] = []

    def install() -> None:
        try:
            runner.install_signal_handlers()
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=install)
    thread.start()
    thread.join()
    assert len(raised) == 1 and isinstance(raised[0], InvalidInput)
    assert "main thread" in str(raised[0])


def test_runner__signal_handlers_chain_to_the_application_and_restore(engine: Engine) -> None:
    assert threading.current_thread() is threading.main_thread()
    heard: list[int] = []

    def application(signum: int, frame: FrameType | None) -> None:
        heard.append(signum)

    before = signal.signal(signal.SIGTERM, application)
    try:
        runner = Runner(engine.store, Registry([]), config=_config())
        runner.install_signal_handlers()
        assert signal.getsignal(signal.SIGTERM) is not application
        os.kill(os.getpid(), signal.SIGTERM)
        wait_until(lambda: heard, what="the application's handler to be called")
        assert heard == [signal.SIGTERM]
        assert runner.stopping  # the runner heard it too
        runner.restore_signal_handlers()
        assert signal.getsignal(signal.SIGTERM) is application
    finally:
        signal.signal(signal.SIGTERM, before)


def test_runner__closing_the_store_under_a_live_runner_stops_it_quietly(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(store_url)
    client = Tether(store)
    client.registry.add(Workflow("echo", start="a", nodes=[compute("a", lambda ctx: {"ok": True})]))
    runner = Runner(store, client.registry, config=_config())
    runner.start()
    assert client.wait(client.start("echo").run_id, timeout_s=WAIT_S, poll_s=0.01).status == "done"
    with caplog.at_level(logging.DEBUG, logger="tether"):
        store.close()
        assert runner.join(timeout=WAIT_S) is True
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("tether")]
    assert [r.getMessage() for r in noisy] == [f"runner {runner.label}: its store was closed; stopping"]
