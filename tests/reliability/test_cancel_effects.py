"""Cancel against effects: cancels land at random points of runs that apply effects, and on purpose
while an effect is mid-apply (its function held on a latch until the cancel has committed).

Every interrupted effect ends ``ambiguous``: none is recorded applied after its run's terminal
commit (the late ``effect_finish`` is refused), none is silently applied (recorded cancelled or
never-applied although it began in the world), none is dropped (recorded applied without having
finished in the world). The runners run in threads of this process.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reliability import oracle
from tests.reliability.support import (
    DIR_ENV,
    Operator,
    RecordingStore,
    TracingRunner,
    read_lines,
    soak_report,
    unfinished,
    wait_for,
)
from tests.reliability.workflows import _record, publish, step
from tether import open_store
from tether.client import Tether
from tether.engine.graph import Workflow, compute, effect
from tether.engine.registry import Registry
from tether.engine.runner import Context, RunnerConfig
from tether.errors import Conflict
from tether.store import Store
from tether.store.control import CANCEL_REQUESTED_EVENT as CANCEL_REQUESTED

LATCHES: dict[str, threading.Event] = {}
ENTERED: dict[str, threading.Event] = {}


def latched_publish(ctx: Context, key: str) -> dict[str, Any]:
    """An effect that holds mid-apply until the test releases its latch."""
    record = _record(ctx, "begin", key=key)
    ENTERED[ctx.run_id].set()
    if not LATCHES[ctx.run_id].wait(30):
        raise TimeoutError("latch never released")
    _record(ctx, "end", key=key)
    return {"key": key, "generation": record["generation"]}


latched = Workflow(
    "latched",
    description="A step, an effect held on a latch, a step",
    start="a",
    nodes=[compute("a", step), effect("pub", latched_publish), compute("c", step)],
    edges={"a": "pub", "pub": "c"},
)

publishing = Workflow(
    "publishing",
    description="A step, three effects, a step",
    start="a",
    nodes=[
        compute("a", step),
        effect("one", publish),
        effect("two", publish),
        effect("three", publish),
        compute("c", step),
    ],
    edges={"a": "one", "one": "two", "two": "three", "three": "c"},
)


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "records"
    folder.mkdir()
    monkeypatch.setenv(DIR_ENV, str(folder))
    return folder


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(f"sqlite:///{tmp_path}/cancel.db")
    yield store
    store.close()


class Runners:
    def __init__(self, store: Store, records: Path, count: int) -> None:
        self.runners = [
            TracingRunner(
                RecordingStore(store, records),  # type: ignore[arg-type]
                Registry([latched, publishing]),
                runner_id=f"host-t{n}",
                config=RunnerConfig(lease_ms=1500, renew_ms=100, poll_ms=20, concurrency=4),
            )
            for n in range(count)
        ]
        self.threads = [threading.Thread(target=r.run, daemon=True) for r in self.runners]
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        for latch in LATCHES.values():
            latch.set()
        for runner in self.runners:
            runner.stop()
        for thread in self.threads:
            thread.join(30)
            assert not thread.is_alive(), "a runner did not stop"


@pytest.mark.slow
def test_cancel_against_effects__every_interrupted_effect_is_ambiguous_none_applied_or_dropped(
    store: Store, records: Path, seed: int, soak: bool
) -> None:
    rng = random.Random(seed)
    client = Tether(store, workflows=[latched, publishing])
    held = [f"held-{n:02d}" for n in range(10 if soak else 4)]
    random_ids = [f"pub-{n:03d}" for n in range(400 if soak else 80)]
    for run_id in held:
        LATCHES[run_id], ENTERED[run_id] = threading.Event(), threading.Event()
        client.start(latched, {"work_ms": 5}, run_id=run_id)
    for run_id in random_ids:
        client.start(publishing, {"work_ms": 40}, run_id=run_id)
    runners = Runners(store, records, 2)
    outcomes: dict[str, str] = {}
    # Cancels at random moments: before a claim, between nodes, inside effects, after the end.
    cancel_at = sorted(
        (rng.uniform(0, 2.0), run_id) for run_id in rng.sample(random_ids, len(random_ids) // 2)
    )
    begin = time.monotonic()

    def cancel_randomly() -> None:
        for when, run_id in cancel_at:
            time.sleep(max(0.0, begin + when - time.monotonic()))
            try:
                outcomes[run_id] = client.cancel(run_id)
            except Conflict:
                outcomes[run_id] = "already finished"

    canceller = threading.Thread(target=cancel_randomly, daemon=True)
    canceller.start()
    try:
        for run_id in held:
            # The window on purpose: the effect is applying in the world and in the store.
            wait_for(ENTERED[run_id].is_set, timeout=30, what=f"{run_id}'s effect to begin")
            assert [e.status for e in store.effects(run_id=run_id)] == ["applying"]
            outcomes[run_id] = client.cancel(run_id)
            wait_for(lambda r=run_id: client.result(r).finished, timeout=30, what=f"{run_id} to be cancelled")
            assert [e.status for e in store.effects(run_id=run_id)] == ["ambiguous"]
            LATCHES[run_id].set()
        canceller.join(60)
        assert not canceller.is_alive()
        # A runner that lost its lease mid-effect leaves the effect ambiguous and the run parked
        # for a person: the operator settles it (applied if it finished in the world, else retry).
        operator = Operator(records)

        def drained() -> bool:
            operator.act(store)
            return unfinished(store) == 0

        wait_for(drained, timeout=900 if soak else 300, what="every run to finish", interval=0.2)
    finally:
        runners.stop()

    history = oracle.History(seed=seed, reserved={*held, *random_ids})
    issued = read_lines(records.glob("tokens-*.jsonl"))
    history.tokens = {r["token"] for r in issued}
    history.rejections = read_lines(records.glob("rejections-*.jsonl"))
    history.sink = read_lines(records.glob("sink-*.jsonl"))
    history.logs = [*records.glob("sink-*.jsonl"), *records.glob("rejections-*.jsonl")]
    history.min_rejections = len(held)
    verdict = oracle.check(store, history)

    begun = {r["key"] for r in history.sink if r["phase"] == "begin"}
    finished = {r["key"] for r in history.sink if r["phase"] == "end"}
    terminal_seq = {
        run_id: next(
            e.seq
            for e in store.events_after(0, run_id=run_id, limit=10_000)
            if e.type in oracle.TERMINAL_EVENTS
        )
        for run_id in [*held, *random_ids]
    }
    applied_seq = {
        row[0]: row[1]
        for row in oracle.rows(
            store,
            "SELECT f.idempotency_key, e.event_seq FROM effects f "
            "JOIN events e ON e.resource_id = f.resource_id WHERE e.event_type = 'effect.applied'",
        )
    }
    for run_id in [*held, *random_ids]:
        for item in store.effects(run_id=run_id):
            key = item.idempotency_key
            if key in begun:
                # Begun in the world: applied (and recorded before the run ended) or ambiguous.
                assert item.status in ("applied", "ambiguous"), (run_id, item)
            else:
                assert item.status in ("cancelled", "pending"), (run_id, item)
            if item.status == "applied":
                assert key in finished, (run_id, item)
                assert applied_seq[key] < terminal_seq[run_id], f"{key} applied after its run ended"
    for run_id in held:
        result = client.result(run_id)
        assert (result.status, result.run_state_status) == ("cancelled", "cancelled")
        assert outcomes[run_id] == "requested"
        (item,) = store.effects(run_id=run_id)
        assert item.status == "ambiguous" and item.idempotency_key in finished
        refused = [r for r in history.rejections if r["run_id"] == run_id and r["op"] == "effect_finish"]
        assert refused, f"{run_id}: the late effect_finish was not refused"
        types = [e.type for e in store.events_after(0, run_id=run_id, limit=10_000)]
        assert types.count(CANCEL_REQUESTED) == 1 and types[-1] == "run.queue_cancelled"
    counts = {
        "runs": len(held) + len(random_ids),
        "cancels": len(outcomes),
        "cancelled at once / requested / already finished": "/".join(
            str(list(outcomes.values()).count(k)) for k in ("cancelled", "requested", "already finished")
        ),
        "ambiguous effects": verdict.counts.get("effect_ambiguous", 0),
        "applied effects": verdict.counts.get("effect_applied", 0),
        "cancelled effects": verdict.counts.get("effect_cancelled", 0),
        "rejected stale attempts": verdict.counts.get("rejected_stale", 0),
        "operator: applied / retried": f"{operator.applied} / {operator.retried}",
    }
    print("cancel against effects:", counts)
    soak_report("Cancel against effects", counts, [f"seed {seed}."])


def test_cancel_request__never_lands_after_the_run_finished(store: Store, records: Path) -> None:
    """A cancel is one transaction that reads the run and records the request: when the holder
    finished the run first, the request is refused and nothing is appended after the terminal
    event (the journal ends at the run's one ending)."""
    client = Tether(store, workflows=[publishing])
    client.start(publishing, {}, run_id="race-1")
    token = "tok-race-holder"
    assert store.claim(run_id="race-1", runner_id="host-x", claim_token=token, lease_ms=60_000)
    # The holder completes the run right before the operator's cancel commits.
    with store.transaction():
        store.set_run_status(run_id="race-1", claim_token=token, status="running")
        store.set_run_status(run_id="race-1", claim_token=token, status="completed")
        assert store.complete(run_id="race-1", claim_token=token)
    with pytest.raises(Conflict, match="already done"):
        client.cancel("race-1")
    types = [e.type for e in store.events_after(0, run_id="race-1", limit=1000)]
    assert CANCEL_REQUESTED not in types
    assert types[-1] == "run.queue_done"
    assert not store.cancel_requested("race-1")
    oracle.check(store, oracle.History(reserved={"race-1"}, tokens={token}, min_rejections=0))


def test_operator_resolution__of_a_cancelled_runs_effect_keeps_the_run_journal_ended(
    store: Store, records: Path
) -> None:
    """An operator classifies the ambiguous effect a cancel left behind: the effect's journal
    records it (and the run's feed shows it), the run's journal still ends at its terminal event,
    and a retry (which no runner could ever apply) is refused."""
    client = Tether(store, workflows=[publishing])
    client.start(publishing, {}, run_id="resolve-1")
    token = "tok-resolve-holder"
    assert store.claim(run_id="resolve-1", runner_id="host-x", claim_token=token, lease_ms=60_000)
    effect = store.effect_enqueue(
        run_id="resolve-1", claim_token=token, effect_type="mail.send", idempotency_key="resolve-1:k"
    )
    store.effect_begin(run_id="resolve-1", claim_token=token, effect_id=effect.effect_id)
    assert store.cancel(run_id="resolve-1", claim_token=token)
    assert [e.status for e in store.effects(run_id="resolve-1")] == ["ambiguous"]
    before = [e.type for e in store.events_after(0, run_id="resolve-1", limit=1000)]

    with pytest.raises(Conflict, match="finished run"):
        store.effect_resolve(effect_id=effect.effect_id, outcome="retry")
    resolved = store.effect_resolve(effect_id=effect.effect_id, outcome="applied")

    assert resolved.status == "applied"
    # The feed shows the resolution after the run's terminal event, under the run; the run's own
    # entries still end there (the oracle checks it).
    after = store.events_after(0, run_id="resolve-1", limit=1000)
    assert [e.type for e in after] == [*before, "effect.applied"]
    assert after[-1].payload["effectId"] == effect.effect_id
    assert before[-1] == "run.queue_cancelled"
    oracle.check(store, oracle.History(reserved={"resolve-1"}, tokens={token}, min_rejections=0))
