"""Poison runs: a share of the runs kill their runner on every attempt (a node that SIGKILLs its own
process, or an effect that does so while it applies). Each ends ``failed`` with error code
``poisonRun`` after exactly the configured number of takeovers, its in-flight effect classified
ambiguous, while the healthy runs keep completing on the same runners.

Runner processes run one run at a time, so a poison run kills no healthy run with it; a slot whose
runner died gets a new one, and an operator retries the effect a crash left ambiguous.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.reliability import oracle
from tests.reliability.support import Operator, WorkerPool, soak_report, unfinished
from tests.reliability.workflows import healthy, poison, poison_effect
from tether import open_store
from tether.client import Tether

pytestmark = pytest.mark.slow

MAX_TAKEOVERS = 3


def test_poison_runs__fail_after_exactly_the_configured_takeovers_while_healthy_runs_complete(
    tmp_path: Path, seed: int, soak: bool
) -> None:
    rng = random.Random(seed)
    runs = 120 if soak else 24
    db = tmp_path / "poison.db"
    url = f"sqlite:///{db}"
    records = tmp_path / "records"
    records.mkdir()
    store = open_store(url)
    client = Tether(store, workflows=[healthy, poison, poison_effect])
    kinds = {}
    for n in range(runs):
        workflow = rng.choices([healthy, poison, poison_effect], weights=[6, 2, 1])[0]
        run_id = f"{workflow.name}-{n:03d}"
        client.start(workflow, {"work_ms": 5}, run_id=run_id)
        kinds[run_id] = workflow.name
    kinds.setdefault("poison-extra", "poison")
    client.start(poison, {}, run_id="poison-extra")
    kinds.setdefault("poison_effect-extra", "poison_effect")
    client.start(poison_effect, {}, run_id="poison_effect-extra")
    pool = WorkerPool(url, db, records, lease_ms=1000, concurrency=1, max_takeovers=MAX_TAKEOVERS)
    operator = Operator(records)
    finished_at: dict[str, float] = {}
    started = time.monotonic()
    try:
        pool.start(3)
        deadline = time.monotonic() + (900 if soak else 300)
        while time.monotonic() < deadline:
            pool.respawn_dead()
            operator.act(store)
            # Counted before the views are read: a run that finishes in between is still seen.
            drained = not unfinished(store)
            for view in store.list_run_views(limit=1000).runs:
                if view.status in ("done", "failed", "cancelled"):
                    finished_at.setdefault(view.run_id, time.monotonic())
            if drained:
                break
            time.sleep(0.1)
    finally:
        pool.shutdown()
    history = pool.history(oracle.History(seed=seed, reserved=set(kinds)))
    history.rejections += oracle.probe_stale_tokens(store, history.issued)
    verdict = oracle.check(store, history)
    events = {
        run_id: [e.type for e in store.events_after(0, run_id=run_id, limit=10_000)] for run_id in kinds
    }
    crashes = [r for r in history.sink or [] if r["phase"] in ("crash", "begin")]
    poisoned = [run_id for run_id, kind in kinds.items() if kind != "healthy"]
    for run_id in poisoned:
        result = client.result(run_id)
        assert (result.status, result.run_state_status, result.error_code) == (
            "failed",
            "failed",
            "poisonRun",
        )
        assert f"stopped {MAX_TAKEOVERS} times" in (result.error_message or "")
        assert f"(limit {MAX_TAKEOVERS})" in (result.error_message or "")
        assert events[run_id].count("node.interrupted") == MAX_TAKEOVERS, events[run_id]
        mine = [r for r in crashes if r["run_id"] == run_id]
        assert len(mine) == MAX_TAKEOVERS, mine
        assert len({r["generation"] for r in mine}) == MAX_TAKEOVERS
        if kinds[run_id] == "poison_effect":
            (effect,) = store.effects(run_id=run_id)
            assert effect.status == "ambiguous", effect
            assert effect.attempt_count == MAX_TAKEOVERS
    healthy_runs = [run_id for run_id, kind in kinds.items() if kind == "healthy"]
    for run_id in healthy_runs:
        result = client.result(run_id)
        assert result.status == "done", (run_id, result, events[run_id])
        assert events[run_id].count("node.interrupted") == 0
    # Healthy runs kept completing while poison runs were still killing runners.
    last_poison = max(finished_at[r] for r in poisoned)
    assert any(finished_at[r] < last_poison for r in healthy_runs)
    assert pool.deaths >= MAX_TAKEOVERS * len(poisoned)
    counts = {
        "runs": len(kinds),
        "poison runs": len(poisoned),
        "runner deaths": pool.deaths,
        "takeovers": verdict.counts.get("takeovers", 0),
        "rejected stale attempts": verdict.counts.get("rejected_stale", 0),
        "operator retries": operator.retried,
        "seconds": round(time.monotonic() - started, 1),
    }
    print("poison:", counts)
    soak_report("Poison runs", counts, [f"seed {seed}; max takeovers {MAX_TAKEOVERS}."])
    store.close()
