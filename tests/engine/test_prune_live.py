"""Retention while workers run: runners drain runs while ``prune`` deletes the ones that
finished, on both backends. Every run executes its nodes once and ends done, prune takes each
only once it finished, and when all is over nothing of any run is left."""

from __future__ import annotations

import threading
from datetime import timedelta

from tests.engine.conftest import Engine, wait_until
from tether import open_store
from tether.engine.graph import Workflow, compute
from tether.store import Store

RUNS = 40


def test_prune__while_runners_drain_every_run_finishes_and_goes_once(engine: Engine, store_url: str) -> None:
    executed: list[tuple[str, str]] = []
    lock = threading.Lock()

    def step(ctx: object) -> dict[str, str]:
        with lock:
            executed.append((ctx.run_id, ctx.node_id))  # type: ignore[attr-defined]
        return {"ok": "yes"}

    engine.register(
        Workflow("pair", start="a", nodes=[compute("a", step), compute("b", step)], edges={"a": "b"})
    )
    started = [engine.client.start("pair", {"n": n}, run_id=f"run-{n:02d}").run_id for n in range(RUNS)]
    pruner: Store = open_store(store_url)
    pruned: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def prune_loop() -> None:
        try:
            while not stop.is_set():
                report = pruner.prune(finished_before=pruner.now() + timedelta(days=1), statuses=["done"])
                pruned.extend(report.run_ids)
        except BaseException as error:  # the test fails on any error below
            errors.append(error)

    thread = threading.Thread(target=prune_loop)
    thread.start()
    try:
        engine.runner(concurrency=4)
        engine.runner(concurrency=4)
        wait_until(lambda: len(set(pruned)) == RUNS or errors, what="every run pruned")
    finally:
        stop.set()
        thread.join(60)
        pruner.close()
    assert not errors, errors
    assert sorted(pruned) == sorted(started)  # each once, and only once it finished
    assert sorted(executed) == sorted((r, n) for r in started for n in ("a", "b"))
    assert engine.store.list_runs() == []
    for table in ("runs", "events", "node_attempts", "viewer_runs", "run_queue", "resources", "leases"):
        assert engine.sql(f"SELECT count(*) FROM {table}") == [(0,)], table
