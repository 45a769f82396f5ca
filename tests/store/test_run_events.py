"""The run inbox: events sent into a run are kept until taken, each taken once under the run's
claim; runs waiting for an event are put back in the queue when it comes or their time is up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.store.conftest import LEASE, at, row_dicts
from tether.errors import ClaimLost, Conflict, NotFound
from tether.store import RunRecord, Store


def park_waiting(store: Store, run_id: str, token: str, deadline: Any = None) -> None:
    """What a wait_for_event node does when no event waits: record the wait, park waiting."""
    store.event_wait_open(
        run_id=run_id, claim_token=token, attempt_id="a", name="go", deadline_at=deadline, now=at(1)
    )
    store.set_run_status(run_id=run_id, claim_token=token, status="running", now=at(1))
    store.set_run_status(run_id=run_id, claim_token=token, status="waiting", now=at(1))
    assert store.park(run_id=run_id, claim_token=token, now=at(1))


def inbox_rows(store: Store) -> list[dict[str, Any]]:
    return row_dicts(store, "SELECT * FROM run_inbox ORDER BY sent_at")


def test_event_send__keeps_the_event_for_a_run_not_waiting_yet(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    sent = store.event_send(run_id="run-1", name="approved", payload={"by": "ann"}, sent_by="ann", now=at(5))
    assert (sent.name, sent.payload, sent.sent_by, sent.sent_at, sent.taken_at) == (
        "approved",
        {"by": "ann"},
        "ann",
        at(5),
        None,
    )
    assert store.inbox("run-1") == [sent]
    assert "run.event_sent" in [e.type for e in store.events_after(0, run_id="run-1")]


def test_event_send__refuses_an_unknown_or_finished_run_writing_nothing(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    with pytest.raises(NotFound, match="Workflow run not found: nope"):
        store.event_send(run_id="nope", name="approved", payload=None)
    reserve()
    assert store.cancel(run_id="run-1", now=at(1))
    with pytest.raises(Conflict, match="takes no more events"):
        store.event_send(run_id="run-1", name="approved", payload=None, now=at(2))
    assert inbox_rows(store) == []


def test_event_take__takes_the_oldest_once_under_the_claim(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    store.event_send(run_id="run-1", name="approved", payload=1, now=at(1))
    store.event_send(run_id="run-1", name="other", payload=2, now=at(2))
    store.event_send(run_id="run-1", name="approved", payload=3, now=at(3))
    first = store.event_take(
        run_id="run-1", claim_token="tok-run-1", attempt_id="a-1", name="approved", now=at(4)
    )
    second = store.event_take(
        run_id="run-1", claim_token="tok-run-1", attempt_id="a-2", name="approved", now=at(5)
    )
    none = store.event_take(
        run_id="run-1", claim_token="tok-run-1", attempt_id="a-3", name="approved", now=at(6)
    )
    assert first is not None and second is not None and none is None
    assert (first.payload, first.taken_by_attempt_id, second.payload) == (1, "a-1", 3)
    assert [(e.payload, e.taken_by_attempt_id) for e in store.inbox("run-1")] == [
        (1, "a-1"),
        (2, None),
        (3, "a-2"),
    ]
    with pytest.raises(ClaimLost):
        store.event_take(run_id="run-1", claim_token="stale", attempt_id="a-4", name="other", now=at(7))
    assert store.inbox("run-1")[1].taken_at is None


def test_event_waits_ready__the_event_came_or_the_time_is_up(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    for run_id, deadline in (("run-1", None), ("run-2", at(1000))):
        claimed(run_id)
        park_waiting(store, run_id, f"tok-{run_id}", deadline)
    assert store.event_waits_ready(now=at(999)) == []
    assert store.event_waits_ready(now=at(1000)) == ["run-2"]
    wait = store.event_wait("run-2")
    assert wait is not None and (wait.name, wait.deadline_at) == ("go", at(1000))
    # An event of another name wakes nobody.
    store.event_send(run_id="run-1", name="stop", payload=None, now=at(2))
    assert store.event_waits_ready(now=at(3)) == []


def test_event_send__puts_a_run_waiting_for_it_back_in_the_queue(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    park_waiting(store, "run-1", "tok-run-1")
    assert store.claim_next(runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(2)) is None
    store.event_send(run_id="run-1", name="go", payload=None, now=at(3))
    record = store.claim_next(runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(4))
    assert record is not None and record.run_id == "run-1"
    store.event_wait_close(run_id="run-1", claim_token="tok-b", now=at(5))
    assert store.event_wait("run-1") is None


def test_prune__deletes_a_run_with_its_inbox(store: Store, reserve: Callable[..., RunRecord]) -> None:
    reserve()
    store.event_send(run_id="run-1", name="go", payload={"n": 1}, now=at(1))
    assert store.cancel(run_id="run-1", now=at(2))
    assert store.prune(finished_before=at(10)).run_ids == ["run-1"]
    assert inbox_rows(store) == []
