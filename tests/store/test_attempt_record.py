"""``Store.attempt_record``: the tries of fan-out items, recorded in one transaction under the live
claim beside their node's active attempt."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.store.conftest import LEASE, at, snapshot
from tether.errors import CancelRequested, ClaimLost, InvalidInput
from tether.store import RunRecord, SettledTry, Store

TOKEN = "tok-run-1"
Claimed = Callable[..., RunRecord]


def test_attempt_record__writes_settled_tries_beside_the_active_attempt(
    store: Store, claimed: Claimed
) -> None:
    claimed()
    store.set_run_status(run_id="run-1", claim_token=TOKEN, status="running", now=at(1))
    node = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="each", now=at(2))
    ids = store.attempt_record(
        run_id="run-1",
        claim_token=TOKEN,
        tries=[
            SettledTry("each[0]", "completed", ran_ms=5, output={"n": 0}),
            SettledTry("each[1]", "failed", ran_ms=3, error_message="ValueError: no"),
        ],
        now=at(10),
    )
    again = store.attempt_record(
        run_id="run-1", claim_token=TOKEN, tries=[SettledTry("each[1]", "completed", output=1)], now=at(20)
    )
    attempts = store.attempts("run-1")
    assert [a.attempt_id for a in attempts] == [node.attempt_id, *ids, *again]
    assert [(a.node_id, a.attempt_number, a.status) for a in attempts] == [
        ("each", 1, "running"),
        ("each[0]", 1, "completed"),
        ("each[1]", 1, "failed"),
        ("each[1]", 2, "completed"),
    ]
    first, failed = attempts[1], attempts[2]
    assert (first.output, first.started_at, first.finished_at) == ({"n": 0}, at(5), at(10))
    assert failed.error_message == "ValueError: no"
    events = [e for e in store.events_after(0, run_id="run-1") if e.type.startswith("node.")]
    assert [(e.type, e.payload["nodeId"]) for e in events] == [  # type: ignore[index]
        ("node.started", "each"),
        ("node.completed", "each[0]"),
        ("node.failed", "each[1]"),
        ("node.completed", "each[1]"),
    ]


def test_attempt_record__a_stale_claim_writes_nothing(store: Store, claimed: Claimed) -> None:
    claimed()
    before = snapshot(store)
    with pytest.raises(ClaimLost):
        store.attempt_record(
            run_id="run-1", claim_token="tok-other", tries=[SettledTry("each[0]", "completed")], now=at(1)
        )
    with pytest.raises(ClaimLost):  # the lease lapsed
        store.attempt_record(
            run_id="run-1", claim_token=TOKEN, tries=[SettledTry("each[0]", "completed")], now=at(LEASE + 1)
        )
    assert snapshot(store) == before


@pytest.mark.parametrize(
    ("tries", "message"),
    [
        ([SettledTry("each[0]", "running")], "completed, failed or timed_out"),
        ([SettledTry("each[0]", "completed", ran_ms=-1)], "ran_ms"),
        ([SettledTry("each[0]", "failed", error_message=3)], "error_message"),  # type: ignore[arg-type]
        ([SettledTry("each[0]", "completed", output={1, 2})], "Unsupported JSON value"),
        (SettledTry("each[0]", "completed"), "list of SettledTry"),
    ],
)
def test_attempt_record__refuses_bad_tries_and_writes_nothing(
    store: Store, claimed: Claimed, tries: object, message: str
) -> None:
    claimed()
    before = snapshot(store)
    with pytest.raises(InvalidInput, match=message):
        store.attempt_record(run_id="run-1", claim_token=TOKEN, tries=tries, now=at(1))  # type: ignore[arg-type]
    assert snapshot(store) == before


def test_attempt_record__refused_once_a_cancel_committed(store: Store, claimed: Claimed) -> None:
    claimed()
    assert store.request_cancel(run_id="run-1", now=at(1)) == "requested"
    before = snapshot(store)
    with pytest.raises(CancelRequested):
        store.attempt_record(
            run_id="run-1", claim_token=TOKEN, tries=[SettledTry("each[0]", "completed")], now=at(2)
        )
    assert snapshot(store) == before
