"""The journal, queue-owned effects, interaction deadlines, active time and transactions.

SPEC §2.2, §3.2 (recordRunEvent, listRunEventsAfter, settleRunEffect, interaction timeout), §4, §9
invariants 3 and 4, §11 items 69-75 and 81.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether import open_store
from tether.errors import ClaimLost, InconsistentState, InvalidInput, NotFound
from tether.store import RunEvent, RunRecord, Store

from .conftest import LEASE, at, reserve_args, rows, snapshot
from .readers import ms, viewer_deltas

TOKEN = "tok-run-1"
CONTROL = "tok-control"
DEADLINE_TEXT = "Workflow node model-turn deadline expired"


def run_resource(store: Store, run_id: str = "run-1") -> str:
    return str(rows(store, "SELECT resource_id FROM runs WHERE run_id = ?", run_id)[0][0])


def stored_events(store: Store, resource_id: str) -> list[dict[str, Any]]:
    found = rows(
        store,
        "SELECT e.event_seq, e.resource_revision, e.event_type, e.actor_type, e.actor_id, "
        "e.lease_generation, COALESCE(e.payload, CAST(b.content AS TEXT)), e.recorded_at FROM events e "
        "LEFT JOIN blobs b ON b.blob_hash = e.payload_hash WHERE e.resource_id = ? ORDER BY e.event_seq",
        resource_id,
    )
    keys = ("seq", "revision", "type", "actor_type", "actor_id", "generation", "payload", "recorded_at")
    events = [dict(zip(keys, row, strict=True)) for row in found]
    for event in events:
        event["payload"] = json.loads(event["payload"])
    return events


def revision_of(store: Store, resource_id: str) -> int:
    return int(rows(store, "SELECT revision FROM resources WHERE resource_id = ?", resource_id)[0][0])


def viewer_revision(store: Store, run_id: str = "run-1") -> int:
    return int(rows(store, "SELECT presentation_revision FROM viewer_runs WHERE run_id = ?", run_id)[0][0])


def viewer_targets_at(store: Store, revision: int, run_id: str = "run-1") -> list[tuple[str, str]]:
    return [(d[2], d[3]) for d in viewer_deltas(store, run_id) if d[1] == revision]


# -- record_event ------------------------------------------------------------------------------


def test_record_event__appends_one_event_at_the_next_revision(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    resource = run_resource(store)
    revision = revision_of(store, resource)
    newest = store.last_event_seq()
    event = store.record_event(
        run_id="run-1",
        workflow_ref="builtin:demo",
        type="node.note",
        payload={"b": [1, 2], "a": "x"},
        runner_id="host-a",
        now=at(250),
    )
    # Sequence numbers ascend; on PostgreSQL they have gaps (numbered by the writing transaction).
    assert event.seq > newest
    assert store.last_event_seq() == event.seq
    assert event == RunEvent(
        seq=event.seq,
        recorded_at=at(250),
        run_id="run-1",
        workflow_ref="builtin:demo",
        type="node.note",
        runner_id="host-a",
        payload={"a": "x", "b": [1, 2]},
    )
    assert revision_of(store, resource) == revision + 1
    last = stored_events(store, resource)[-1]
    assert last == {
        "seq": event.seq,
        "revision": revision + 1,
        "type": "node.note",
        "actor_type": "host",
        "actor_id": "host-a",
        "generation": 1,
        "payload": {"a": "x", "b": [1, 2]},
        "recorded_at": ms(250),
    }


def test_record_event__several_in_one_transaction_each_return_their_journal_sequence(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    """After its first event a transaction appends a run's next ones without reading back
    (the run's row and the journal stay locked by it): the sequences it returns are still the
    journal's, with another run's events in between, and each event is one revision up."""
    reserve()
    reserve("run-2", origin_session_id="session-2")
    resource = run_resource(store)
    revision = revision_of(store, resource)
    with store.transaction():
        returned = [
            store.record_event(run_id=run, workflow_ref="builtin:demo", type=f"note.{n}", now=at(10 + n)).seq
            for n, run in enumerate(["run-1", "run-1", "run-2", "run-1", "run-2"])
        ]
    journal = [(e.seq, e.run_id, e.type) for e in store.events_after(0) if e.type.startswith("note.")]
    assert [seq for seq, _, _ in journal] == returned
    assert returned == list(range(returned[0], returned[0] + 5))
    assert [(e["revision"], e["type"]) for e in stored_events(store, resource)[-3:]] == [
        (revision + 1, "note.0"),
        (revision + 2, "note.1"),
        (revision + 3, "note.3"),
    ]


@pytest.mark.parametrize(
    ("runner_id", "actor"),
    [
        ("host-7", ("host", "host-7")),
        ("session-runner", ("session", "session-runner")),
        ("hostile", ("session", "hostile")),
        ("HOST-1", ("session", "HOST-1")),
        (None, ("session", None)),
    ],
)
def test_record_event__actor_type_follows_the_runner_prefix(
    store: Store, reserve: Callable[..., RunRecord], runner_id: str | None, actor: tuple[str, str | None]
) -> None:
    reserve()
    event = store.record_event(run_id="run-1", workflow_ref="x", type="t", runner_id=runner_id, now=at(1))
    assert event.runner_id == runner_id
    last = stored_events(store, run_resource(store))[-1]
    assert (last["actor_type"], last["actor_id"]) == actor


def test_record_event__stores_the_current_lease_generation_without_checking_the_claim(
    store: Store, claimed: Callable[..., RunRecord], reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    store.record_event(run_id="run-1", workflow_ref="x", type="unclaimed", now=at(1))
    claimed()
    assert store.park(run_id="run-1", claim_token=TOKEN, now=at(2))
    # The run is unowned now; an event by any runner is still journaled with the lease generation.
    store.record_event(run_id="run-1", workflow_ref="x", type="parked", runner_id="host-z", now=at(3))
    generations = {e["type"]: e["generation"] for e in stored_events(store, run_resource(store))}
    assert generations["unclaimed"] is None
    assert generations["parked"] == 1


def test_record_event__defaults_the_payload_to_an_empty_object(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    event = store.record_event(run_id="run-1", workflow_ref="x", type="t", now=at(1))
    assert event.payload == {}
    assert stored_events(store, run_resource(store))[-1]["payload"] == {}


def test_record_event__returns_the_stored_workflow_ref(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    event = store.record_event(run_id="run-1", workflow_ref="caller:other", type="t", now=at(1))
    assert event.workflow_ref == "builtin:demo"
    assert store.events_after(0)[-1].workflow_ref == "builtin:demo"


def test_record_event__records_one_viewer_revision(store: Store, reserve: Callable[..., RunRecord]) -> None:
    reserve()
    before = viewer_revision(store)
    store.record_event(run_id="run-1", workflow_ref="x", type="t", now=at(1))
    assert viewer_revision(store) == before + 1


def test_record_event__unknown_run_raises_not_found_and_writes_nothing(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    before = snapshot(store)
    with pytest.raises(NotFound, match=r"^Workflow run not found: run-404$"):
        store.record_event(run_id="run-404", workflow_ref="x", type="t", now=at(1))
    assert snapshot(store) == before


def test_bump_event__an_aggregate_that_is_not_there_raises_not_found_and_appends_nothing(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    """BUMP then EMIT on a resource id no row has: no event, and nothing a reader sees (on SQLite
    no sequence is taken either: the sequence is the connection's last rowid, read only when the
    insert added a row; on PostgreSQL the numbers belong to the writing transaction)."""
    reserve()
    store.record_event(run_id="run-1", workflow_ref="builtin:demo", type="note.before", now=at(5))
    before, last_seq = snapshot(store), max(e.seq for e in store.events_after(0))
    missing = "run-" + "0" * 40
    with pytest.raises(NotFound, match=f"^Resource not found: {missing}$"), store.transaction():
        store._bump_event(missing, "note.lost", "system", None, {}, ms(6))
    assert snapshot(store) == before
    after = store.record_event(run_id="run-1", workflow_ref="builtin:demo", type="note.after", now=at(7))
    if store.db.backend == "sqlite":
        assert after.seq == last_seq + 1
    assert [e.type for e in store.events_after(last_seq)] == ["note.after"]


def test_record_event__refuses_an_invalid_time_and_writes_nothing(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    before = snapshot(store)
    with pytest.raises(InvalidInput, match="Invalid timestamp"):
        store.record_event(run_id="run-1", workflow_ref="x", type="t", now="yesterday")
    with pytest.raises(InvalidInput):
        store.record_event(run_id="run-1", workflow_ref="x", type="t", payload=[1], now=at(1))
    assert snapshot(store) == before


# -- events_after ------------------------------------------------------------------------------


def test_events_after__lists_run_events_in_sequence_order(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve("run-1")
    reserve("run-2", origin_session_id="session-2", now=at(1))
    store.record_event(
        run_id="run-1", workflow_ref="x", type="a", payload={"n": 1}, runner_id="host-a", now=at(2)
    )
    store.record_event(run_id="run-2", workflow_ref="x", type="b", now=at(3))
    events = store.events_after(0)
    assert [(e.run_id, e.type) for e in events] == [
        ("run-1", "run.queued"),
        ("run-2", "run.queued"),
        ("run-1", "a"),
        ("run-2", "b"),
    ]
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert events[0].runner_id == "session-1"  # actor id of run.queued: the origin session
    assert events[2] == RunEvent(seqs[2], at(2), "run-1", "builtin:demo", "a", "host-a", {"n": 1})
    assert [e.type for e in store.events_after(seqs[1])] == ["a", "b"]
    assert store.events_after(seqs[-1]) == []
    assert [e.type for e in store.events_after(0, run_id="run-2")] == ["run.queued", "b"]
    assert store.last_event_seq() == seqs[-1]


def test_events_after__returns_at_most_100_by_default(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    with store.transaction():
        for n in range(120):
            store.record_event(run_id="run-1", workflow_ref="x", type=f"e{n}", now=at(n))
    first = store.events_after(0)
    assert len(first) == 100
    assert [e.type for e in first] == ["run.queued"] + [f"e{n}" for n in range(99)]
    rest = store.events_after(first[-1].seq)
    assert [e.type for e in rest] == [f"e{n}" for n in range(99, 120)]
    assert len(store.events_after(0, limit=500)) == 121
    assert len(store.events_after(0, limit=7)) == 7


def test_events_after__includes_the_events_of_a_runs_effects_once_each_in_journal_order(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    claimed("run-2", origin_session_id="session-2")
    effect = store.effect_enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="mail", idempotency_key="k", now=at(10)
    )
    store.effect_begin(run_id="run-1", claim_token=TOKEN, effect_id=effect.effect_id, now=at(11))
    store.record_event(run_id="run-2", workflow_ref="x", type="note", now=at(12))
    store.effect_mark_ambiguous(run_id="run-1", claim_token=TOKEN, effect_id=effect.effect_id, now=at(13))
    effect_types = rows(
        store,
        "SELECT e.event_type FROM events e JOIN effects f ON f.resource_id = e.resource_id "
        "ORDER BY e.event_seq",
    )
    assert effect_types == [("effect.pending",), ("effect.applying",), ("effect.ambiguous",)]

    # The feed is the whole journal, in order: paged one entry at a time, nothing is missed or
    # repeated; an effect's entries name the run that enqueued it.
    journal = [s for (s,) in rows(store, "SELECT event_seq FROM events ORDER BY event_seq")]
    paged: list[RunEvent] = []
    while page := store.events_after(paged[-1].seq if paged else 0, limit=1):
        paged.extend(page)
    assert [e.seq for e in paged] == journal
    assert store.events_after(0, limit=1000) == paged
    on_effect = {
        s
        for (s,) in rows(
            store, "SELECT e.event_seq FROM events e JOIN effects f ON f.resource_id = e.resource_id"
        )
    }
    effect_events = [e for e in paged if e.seq in on_effect]
    assert [(e.type, e.run_id) for e in effect_events] == [
        ("effect.pending", "run-1"),
        ("effect.applying", "run-1"),
        ("effect.ambiguous", "run-1"),
    ]
    assert effect_events[-1].payload["effectId"] == effect.effect_id

    # One run's feed holds its effects' entries, and the type filter finds them.
    assert store.events_after(0, run_id="run-1", limit=1000) == [e for e in paged if e.run_id == "run-1"]
    assert [e.type for e in store.events_after(0, run_id="run-2", limit=1000)][-1] == "note"
    assert store.events_after(0, event_type="effect.ambiguous") == [effect_events[-1]]
    assert store.events_after(0, run_id="run-2", event_type="effect.ambiguous") == []


@pytest.mark.parametrize("bad", [{"seq": -1}, {"seq": 0, "limit": 0}, {"seq": 1.5}])
def test_events_after__refuses_invalid_bounds(store: Store, bad: dict[str, Any]) -> None:
    options = dict(bad)
    seq = options.pop("seq")
    with pytest.raises(InvalidInput):
        store.events_after(seq, **options)


# -- settle_effects ----------------------------------------------------------------------------


def test_settle_effects__settles_only_pending_effects_of_that_type(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    claimed("run-2", origin_session_id="session-2")

    def enqueue(run_id: str, effect_type: str, key: str) -> str:
        return store.effect_enqueue(
            run_id=run_id,
            claim_token=f"tok-{run_id}",
            effect_type=effect_type,
            idempotency_key=key,
            now=at(10),
        ).effect_id

    target = enqueue("run-1", "run.park_queue", "k1")
    applying = enqueue("run-1", "run.park_queue", "k2")
    store.effect_begin(run_id="run-1", claim_token=TOKEN, effect_id=applying, now=at(11))
    other_type = enqueue("run-1", "run.settle_queue", "k3")
    other_run = enqueue("run-2", "run.park_queue", "k4")
    run_rev, view_rev = revision_of(store, run_resource(store)), viewer_revision(store)
    untouched = {
        e: rows(store, "SELECT * FROM effects WHERE effect_id = ?", e)
        for e in (applying, other_type, other_run)
    }

    assert store.settle_effects("run-1", "run.park_queue", now=at(500)) == 1

    (settled,) = rows(
        store,
        "SELECT e.status, e.updated_at, e.settled_at, r.revision, e.resource_id FROM effects e "
        "JOIN resources r ON r.resource_id = e.resource_id WHERE e.effect_id = ?",
        target,
    )
    assert settled[:4] == ("applied", ms(500), ms(500), 2)
    last = stored_events(store, settled[4])[-1]
    assert {k: last[k] for k in ("revision", "type", "actor_type", "actor_id", "generation", "payload")} == {
        "revision": 2,
        "type": "effect.applied",
        "actor_type": "system",
        "actor_id": None,
        "generation": None,
        "payload": {"runId": "run-1", "effectId": target, "effectType": "run.park_queue"},
    }
    assert {e: rows(store, "SELECT * FROM effects WHERE effect_id = ?", e) for e in untouched} == untouched
    # Settling touches only the effects: the run's revision and viewer projection stay.
    assert (revision_of(store, run_resource(store)), viewer_revision(store)) == (run_rev, view_rev)


def test_settle_effects__with_nothing_pending_writes_nothing(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    before = snapshot(store)
    assert store.settle_effects("run-1", "run.park_queue", now=at(5)) == 0
    assert store.settle_effects("run-404", "run.park_queue", now=at(5)) == 0
    assert snapshot(store) == before


# -- interaction timeout -----------------------------------------------------------------------


def waiting_on_session(
    store: Store,
    claimed: Callable[..., RunRecord],
    *,
    timeout_ms: int | None = 1000,
    elapsed: tuple[int, ...] = (1000,),
) -> tuple[str, str]:
    """A run parked on a pending request whose attempt has ``elapsed`` sampled active time."""
    claimed()
    store.set_run_status(run_id="run-1", claim_token=TOKEN, status="running", now=at(1))
    attempt = store.attempt_start(
        run_id="run-1", claim_token=TOKEN, node_id="model", timeout_ms=timeout_ms, now=at(2)
    ).attempt_id
    clock = 2
    for index, spent in enumerate(elapsed):
        number = store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(clock))
        clock += spent
        store.interval_sample(
            run_id="run-1",
            claim_token=TOKEN,
            attempt_id=attempt,
            interval_number=number,
            elapsed_ms=spent,
            now=at(clock),
        )
        if index < len(elapsed) - 1:  # the last interval stays open, as while a model turn runs
            store.interval_close(
                run_id="run-1", claim_token=TOKEN, attempt_id=attempt, interval_number=number, now=at(clock)
            )
    with store.transaction():
        request = store.request_open(
            run_id="run-1", claim_token=TOKEN, attempt_id=attempt, kind="ask", payload={}, now=at(clock)
        )
        assert store.park(run_id="run-1", claim_token=TOKEN, now=at(clock))
    return attempt, request.request_id


def control_claim(store: Store, now: int = 5_000) -> None:
    claim = store.claim_for_control(
        run_id="run-1", runner_id="host-a", claim_token=CONTROL, lease_ms=LEASE, now=at(now)
    )
    assert claim is not None


def begin(store: Store, now: int = 6_000, *, session: str = "session-1", token: str = CONTROL) -> bool:
    return store.begin_interaction_timeout(
        run_id="run-1", target_session_id=session, claim_token=token, now=at(now)
    )


def test_interaction_timeout__cancels_the_request_and_hands_the_run_back(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    # An answer that came in time (900 ms of the 1 s of active time spent) and waits for
    # validation when the deadline passes is rejected with the timeout.
    attempt, request_id = waiting_on_session(store, claimed, elapsed=(900,))
    validating = store.submit(request_id=request_id, session_id="session-1", payload={"a": 1}, now=at(950))
    control_claim(store)
    # Then the rest of the active time is sampled: the deadline passes with the answer pending.
    store.interval_sample(
        run_id="run-1",
        claim_token=CONTROL,
        attempt_id=attempt,
        interval_number=1,
        elapsed_ms=1000,
        now=at(5_500),
    )
    resource = run_resource(store)
    revision, view = revision_of(store, resource), viewer_revision(store)

    assert begin(store)

    assert rows(
        store,
        "SELECT status, revision, updated_at FROM interactive_requests WHERE request_id = ?",
        request_id,
    ) == [("cancelled", 2, ms(6_000))]
    assert rows(store, "SELECT status, status_detail, finished_at, paused FROM runs") == [
        ("running", "finishing expired interaction deadline", None, 0)
    ]
    assert rows(store, "SELECT status, error_code, error_hash, finished_at FROM run_queue") == [
        ("starting", None, None, None)
    ]
    (submission,) = store.submissions(request_id)
    assert (submission.submission_id, submission.outcome, submission.receipt) == (
        validating.submission_id,
        "rejected",
        {"status": "rejected", "error": DEADLINE_TEXT},
    )
    last = stored_events(store, resource)[-1]
    assert {k: last[k] for k in ("revision", "type", "actor_type", "actor_id", "generation", "payload")} == {
        "revision": revision + 1,
        "type": "run.interaction_timeout_started",
        "actor_type": "host",
        "actor_id": "host-a",
        "generation": 2,
        "payload": {"requestId": request_id, "attemptId": attempt},
    }
    assert viewer_revision(store) == view + 2
    assert viewer_targets_at(store, view + 1) == [
        ("summary", ""),
        ("graph", ""),
        ("replay", ""),
        ("inspector", "run"),
    ]
    assert viewer_targets_at(store, view + 2) == [("summary", ""), ("replay", ""), ("conversation", "")]
    # The caller keeps its claim to finish the node.
    assert store.verify_claim(run_id="run-1", claim_token=CONTROL, now=at(6_001))
    assert rows(store, "SELECT count(*) FROM attempt_active_intervals WHERE ended_at IS NULL") == [(0,)]


def test_interaction_timeout__counts_the_time_of_every_interval(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    waiting_on_session(store, claimed, elapsed=(600, 400))
    control_claim(store)
    assert begin(store)


def test_interaction_timeout__not_expired_returns_false(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    waiting_on_session(store, claimed, elapsed=(600, 399))
    control_claim(store)
    before = snapshot(store)
    # Wall-clock time far past the deadline does not count: only sampled active time does.
    assert not begin(store, now=LEASE - 1)
    assert snapshot(store) == before


@pytest.mark.parametrize("timeout_ms", [0, None])
def test_interaction_timeout__without_a_node_timeout_returns_false(
    store: Store, claimed: Callable[..., RunRecord], timeout_ms: int | None
) -> None:
    waiting_on_session(store, claimed, timeout_ms=timeout_ms)
    control_claim(store)
    before = snapshot(store)
    assert not begin(store)
    assert snapshot(store) == before


@pytest.mark.parametrize("timeout_ms", [None, 1000])
def test_interaction_tick__writes_only_when_there_is_a_clock_to_advance(
    store: Store, claimed: Callable[..., RunRecord], timeout_ms: int | None
) -> None:
    """A sweep that finds no pending request with a deadline opens no write transaction (every
    runner sweeps often); one that finds a clock advances it in one."""
    waiting_on_session(store, claimed, timeout_ms=timeout_ms, elapsed=(600,))
    db: Any = store.db
    opened = db._outermost
    writes: list[bool] = []

    def counting(write: bool, first: bool) -> Any:
        writes.append(write)
        return opened(write, first)

    db._outermost = counting
    before = snapshot(store)
    assert store.interaction_tick(now=at(700)) == []
    if timeout_ms is None:
        assert writes == [False]
        assert snapshot(store) == before
    else:
        assert writes == [False, True]
        assert snapshot(store) != before  # the open interval was sampled
        assert store.interaction_tick(now=at(1_100)) == ["run-1"]


@pytest.mark.parametrize(
    ("token", "now"),
    [
        pytest.param(TOKEN, 6_000, id="released-claim"),
        pytest.param("tok-wrong", 6_000, id="wrong-token"),
        pytest.param(CONTROL, 5_000 + LEASE, id="expired-claim"),
    ],
)
def test_interaction_timeout__without_the_live_claim_returns_false(
    store: Store, claimed: Callable[..., RunRecord], token: str, now: int
) -> None:
    waiting_on_session(store, claimed)
    control_claim(store)
    before = snapshot(store)
    assert not begin(store, now=now, token=token)
    assert snapshot(store) == before


def test_interaction_timeout__with_no_claim_at_all_returns_false(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    waiting_on_session(store, claimed)
    before = snapshot(store)
    assert not begin(store, token=TOKEN)
    assert snapshot(store) == before


def test_interaction_timeout__paused_run_returns_false(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    waiting_on_session(store, claimed)
    assert store.pause_parked(run_id="run-1", now=at(4_000))
    control_claim(store)
    before = snapshot(store)
    assert not begin(store)
    assert snapshot(store) == before


def test_interaction_timeout__other_session_returns_false(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    waiting_on_session(store, claimed)
    control_claim(store)
    before = snapshot(store)
    assert not begin(store, session="session-2")
    assert snapshot(store) == before


def test_interaction_timeout__run_not_parked_returns_false_instead_of_raising(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    store.set_run_status(run_id="run-1", claim_token=TOKEN, status="running", now=at(1))
    attempt = store.attempt_start(
        run_id="run-1", claim_token=TOKEN, node_id="model", timeout_ms=10, now=at(2)
    ).attempt_id
    number = store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(2))
    store.interval_sample(
        run_id="run-1",
        claim_token=TOKEN,
        attempt_id=attempt,
        interval_number=number,
        elapsed_ms=50,
        now=at(52),
    )
    store.request_open(
        run_id="run-1", claim_token=TOKEN, attempt_id=attempt, kind="ask", payload={}, now=at(60)
    )
    before = snapshot(store)
    # The run waits but its queue entry is still running (not parked).
    assert not begin(store, now=100, token=TOKEN)
    assert snapshot(store) == before


def test_interaction_timeout__picks_the_earliest_started_attempt(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    store.set_run_status(run_id="run-1", claim_token=TOKEN, status="running", now=at(1))
    requests = {}
    # The later-started attempt is recorded first, so neither insertion order nor id order decides.
    for node, start in (("late", 900), ("early", 100)):
        attempt = store.attempt_start(
            run_id="run-1", claim_token=TOKEN, node_id=node, timeout_ms=50, now=at(start)
        ).attempt_id
        number = store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(start))
        store.interval_sample(
            run_id="run-1",
            claim_token=TOKEN,
            attempt_id=attempt,
            interval_number=number,
            elapsed_ms=60,
            now=at(start + 60),
        )
        request = store.request_open(
            run_id="run-1", claim_token=TOKEN, attempt_id=attempt, kind="ask", payload={}, now=at(start + 60)
        )
        requests[node] = (attempt, request.request_id)
        if node == "late":
            store.attempt_finish(
                run_id="run-1",
                claim_token=TOKEN,
                attempt_id=attempt,
                status="interrupted",
                now=at(start + 61),
            )
    assert store.park(run_id="run-1", claim_token=TOKEN, now=at(1_000))
    control_claim(store)
    assert begin(store)
    statuses = dict(rows(store, "SELECT request_id, status FROM interactive_requests"))
    assert statuses == {requests["early"][1]: "cancelled", requests["late"][1]: "pending"}
    last = stored_events(store, run_resource(store))[-1]
    assert last["payload"] == {"requestId": requests["early"][1], "attemptId": requests["early"][0]}


# -- active time -------------------------------------------------------------------------------


def test_active_time__counts_only_sampled_intervals(store: Store, claimed: Callable[..., RunRecord]) -> None:
    claimed()
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="n", now=at(0)).attempt_id
    first = store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(0))
    assert store.interval_sample(
        run_id="run-1",
        claim_token=TOKEN,
        attempt_id=attempt,
        interval_number=first,
        elapsed_ms=300,
        now=at(300),
    )
    # A smaller later sample never lowers what was proven.
    assert store.interval_sample(
        run_id="run-1",
        claim_token=TOKEN,
        attempt_id=attempt,
        interval_number=first,
        elapsed_ms=200,
        now=at(400),
    )
    assert store.interval_close(
        run_id="run-1", claim_token=TOKEN, attempt_id=attempt, interval_number=first, now=at(9_000)
    )
    second = store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(10_000))
    assert second == first + 1
    assert store.interval_close(
        run_id="run-1", claim_token=TOKEN, attempt_id=attempt, interval_number=second, now=at(20_000)
    )
    assert rows(
        store,
        "SELECT interval_number, started_at, observed_at, ended_at, elapsed_ms FROM attempt_active_intervals "
        "ORDER BY interval_number",
    ) == [(1, ms(0), ms(400), ms(400), 300), (2, ms(10_000), ms(10_000), ms(10_000), 0)]
    (found,) = store.attempts("run-1")
    assert found.elapsed_ms == 300


def test_active_time__closed_interval_takes_no_more_samples(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="n", now=at(0)).attempt_id
    number = store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(0))
    store.interval_close(
        run_id="run-1", claim_token=TOKEN, attempt_id=attempt, interval_number=number, now=at(5)
    )
    before = snapshot(store)
    assert not store.interval_sample(
        run_id="run-1",
        claim_token=TOKEN,
        attempt_id=attempt,
        interval_number=number,
        elapsed_ms=50,
        now=at(50),
    )
    assert not store.interval_close(
        run_id="run-1", claim_token=TOKEN, attempt_id=attempt, interval_number=number, now=at(60)
    )
    assert snapshot(store) == before


def test_active_time__an_open_interval_must_be_closed_before_the_next(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="n", now=at(0)).attempt_id
    store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(0))
    before = snapshot(store)
    with pytest.raises(InconsistentState):
        store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(5))
    assert snapshot(store) == before
    store.close_run_time(run_id="run-1", claim_token=TOKEN, now=at(6))
    assert store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(7)) == 2


def test_close_run_time__closes_only_that_runs_intervals(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    opened = {}
    for run_id, session in (("run-1", "session-1"), ("run-2", "session-2")):
        claimed(run_id, origin_session_id=session)
        token = f"tok-{run_id}"
        attempt = store.attempt_start(run_id=run_id, claim_token=token, node_id="n", now=at(0)).attempt_id
        number = store.interval_open(run_id=run_id, claim_token=token, attempt_id=attempt, now=at(0))
        store.interval_sample(
            run_id=run_id,
            claim_token=token,
            attempt_id=attempt,
            interval_number=number,
            elapsed_ms=70,
            now=at(70),
        )
        opened[run_id] = attempt
    store.close_run_time(run_id="run-1", claim_token=TOKEN, now=at(500))
    ended = dict(rows(store, "SELECT attempt_id, ended_at FROM attempt_active_intervals"))
    assert ended == {opened["run-1"]: ms(70), opened["run-2"]: None}


def test_close_run_time__needs_the_live_claim(store: Store, claimed: Callable[..., RunRecord]) -> None:
    claimed()
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="n", now=at(0)).attempt_id
    store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(0))
    before = snapshot(store)
    with pytest.raises(ClaimLost):
        store.close_run_time(run_id="run-1", claim_token=TOKEN, now=at(LEASE))
    assert snapshot(store) == before


# -- transactions ------------------------------------------------------------------------------


def test_transaction__an_exception_rolls_back_every_call_inside(store: Store) -> None:
    before = snapshot(store)
    with pytest.raises(RuntimeError, match="host crashed"), store.transaction():
        store.reserve(**reserve_args())
        assert store.claim(run_id="run-1", runner_id="host-a", claim_token=TOKEN, lease_ms=LEASE, now=at(1))
        assert store.mark_running(run_id="run-1", claim_token=TOKEN, now=at(2))
        store.record_event(run_id="run-1", workflow_ref="x", type="t", now=at(3))
        with store.transaction():
            assert store.park(run_id="run-1", claim_token=TOKEN, now=at(4))
            raise RuntimeError("host crashed")
    assert snapshot(store) == before
    assert store.get_run("run-1") is None


def test_transaction__a_refused_nested_call_rolls_back_the_outer_transaction(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    before = snapshot(store)
    with pytest.raises(NotFound), store.transaction():
        store.record_event(run_id="run-1", workflow_ref="x", type="t", now=at(3))
        assert store.park(run_id="run-1", claim_token=TOKEN, now=at(4))
        store.record_event(run_id="run-404", workflow_ref="x", type="t", now=at(5))
    assert snapshot(store) == before
    assert store.verify_claim(run_id="run-1", claim_token=TOKEN, now=at(6))


def test_transaction__nested_calls_commit_with_the_outer_block(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    count = "SELECT count(*) FROM events"
    (before,) = rows(store, count)
    with store.transaction():
        store.record_event(run_id="run-1", workflow_ref="x", type="a", now=at(3))
        with store.transaction():
            store.record_event(run_id="run-1", workflow_ref="x", type="b", now=at(4))
        # Another connection sees nothing until the outermost block ends.
        assert rows(store, count) == [before]
    assert rows(store, count) == [(before[0] + 2,)]


# -- invariants 3 and 4 ------------------------------------------------------------------------


def assert_journal_invariants(store: Store) -> None:
    """Every resource's event revisions are exactly 1..current and sequences rise with revisions."""
    resources = rows(store, "SELECT resource_id, revision FROM resources")
    for resource_id, revision in resources:
        events = rows(
            store,
            "SELECT event_seq, resource_revision FROM events WHERE resource_id = ? ORDER BY event_seq",
            resource_id,
        )
        assert [r for _, r in events] == list(range(1, revision + 1)), resource_id
    seqs = [s for (s,) in rows(store, "SELECT event_seq FROM events ORDER BY rowid")]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_journal__a_lifecycle_keeps_revisions_contiguous_and_sequences_rising(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    steps: list[Callable[[], object]] = [
        lambda: store.renew(run_id="run-1", claim_token=TOKEN, lease_ms=LEASE, now=at(10)),
        lambda: store.record_event(run_id="run-1", workflow_ref="x", type="note", now=at(11)),
        lambda: store.effect_enqueue(
            run_id="run-1", claim_token=TOKEN, effect_type="run.park_queue", idempotency_key="k", now=at(12)
        ),
        lambda: store.park(run_id="run-1", claim_token=TOKEN, now=at(13)),
        lambda: store.claim_next(runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(14)),
        lambda: store.mark_running(run_id="run-1", claim_token="tok-b", now=at(15)),
        lambda: store.park_for_no_progress(run_id="run-1", claim_token="tok-b", detail="stuck", now=at(16)),
        lambda: store.request_resume(run_id="run-1", now=at(17)),
        lambda: store.claim(
            run_id="run-1", runner_id="host-c", claim_token="tok-c", lease_ms=LEASE, now=at(18)
        ),
        lambda: store.cancel(run_id="run-1", now=at(18 + LEASE)),
    ]
    newest = store.last_event_seq()
    for step in steps:
        assert step()
        assert_journal_invariants(store)
        assert store.last_event_seq() >= newest
        newest = store.last_event_seq()
    assert [e.type for e in store.events_after(0)] == [
        "run.queued",
        "lease.claimed",
        "run.queue_running",
        "note",
        "effect.pending",
        "effect.enqueued",
        "run.queue_parked",
        "effect.applied",
        "lease.claimed",
        "run.queue_running",
        "run.worker_no_progress",
        "run.resume_requested",
        "lease.claimed",
        "run.queue_cancelled",
    ]


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "claim",
                "claim_next",
                "mark_running",
                "renew",
                "park",
                "complete",
                "fail",
                "cancel",
                "event",
                "resume",
            ]
        ),
        st.sampled_from(["run-1", "run-2"]),
        st.sampled_from(["tok-a", "tok-b"]),
        st.integers(min_value=0, max_value=LEASE),
    ),
    max_size=25,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=OPERATIONS)
def test_journal__random_operations_keep_the_journal_invariants(
    operations: list[tuple[str, str, str, int]],
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = open_store(f"sqlite:///{Path(folder) / 'tether.db'}?synchronous=NORMAL")
        try:
            store.reserve(**reserve_args("run-1"))
            store.reserve(**reserve_args("run-2", origin_session_id="session-2"))
            clock = 0
            for name, run_id, token, step in operations:
                clock += step
                now = at(clock)
                if name == "claim":
                    store.claim(
                        run_id=run_id, runner_id=f"host-{token}", claim_token=token, lease_ms=LEASE, now=now
                    )
                elif name == "claim_next":
                    store.claim_next(runner_id=f"host-{token}", claim_token=token, lease_ms=LEASE, now=now)
                elif name == "mark_running":
                    store.mark_running(run_id=run_id, claim_token=token, now=now)
                elif name == "renew":
                    store.renew(run_id=run_id, claim_token=token, lease_ms=LEASE, now=now)
                elif name in ("park", "complete"):
                    getattr(store, name)(run_id=run_id, claim_token=token, now=now)
                elif name == "fail":
                    store.fail(run_id=run_id, claim_token=token, error_code="e", error_message="x", now=now)
                elif name == "cancel":
                    store.cancel(run_id=run_id, now=now)
                elif name == "event":
                    store.record_event(run_id=run_id, workflow_ref="x", type="note", runner_id=token, now=now)
                else:
                    store.request_resume(run_id=run_id, now=now)
                assert_journal_invariants(store)
                viewer = rows(
                    store, "SELECT run_id, presentation_revision, retained_from_revision FROM viewer_runs"
                )
                for viewer_run, current, retained in viewer:
                    kept = sorted({d[1] for d in viewer_deltas(store, viewer_run)})
                    # Every revision of the window is kept, nothing past the current one, and
                    # no stored row lies wholly before the window.
                    assert set(range(max(retained, 2), current + 1)) <= set(kept)
                    assert not kept or kept[-1] == current
                    lasts = rows(
                        store, "SELECT last_revision FROM viewer_revisions WHERE run_id = ?", viewer_run
                    )
                    assert all(last >= retained for (last,) in lasts)
        finally:
            store.close()


def test_events_after__filters_by_event_type_for_one_run_and_for_all(store: Store) -> None:
    for run_id in ("run-1", "run-2"):
        store.reserve(**reserve_args(run_id, origin_session_id=f"s-{run_id}", now=at(0)))
        for n in range(3):
            store.record_event(run_id=run_id, workflow_ref="x", type="note", payload={"n": n}, now=at(1))
        store.record_event(run_id=run_id, workflow_ref="x", type="other", payload={}, now=at(2))
    notes = store.events_after(0, run_id="run-2", event_type="note", limit=100)
    assert [(e.run_id, e.type, e.payload) for e in notes] == [("run-2", "note", {"n": n}) for n in range(3)]
    first = store.events_after(0, run_id="run-2", event_type="note", limit=1)
    assert [e.seq for e in first] == [notes[0].seq]
    everywhere = store.events_after(0, event_type="other", limit=100)
    assert [(e.run_id, e.type) for e in everywhere] == [("run-1", "other"), ("run-2", "other")]
    assert store.events_after(0, run_id="run-1", event_type="missing") == []
    with pytest.raises(InvalidInput):
        store.events_after(0, run_id="run-1", event_type="")
