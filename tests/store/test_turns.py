"""Agent conversations in the store: each message one claim-checked journal entry, refused (writing
nothing) without the live claim, for a settled attempt, or with a malformed message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.store.conftest import at, snapshot
from tests.store.readers import revision
from tether.errors import ClaimLost, InvalidInput, NotFound
from tether.store import RunRecord, Store

TOKEN = "tok-run-1"


def _record(store: Store, attempt_id: str, index: int = 1, now: int = 1, **overrides: Any) -> None:
    args: dict[str, Any] = {
        "run_id": "run-1",
        "claim_token": TOKEN,
        "attempt_id": attempt_id,
        "node_id": "think",
        "conversation": attempt_id,
        "index": index,
        "role": "user",
        "body": {"content": "hello"},
        "now": at(now),
    }
    args.update(overrides)
    store.agent_message_record(**args)


def test_agent_message_record__journals_each_message_in_order(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="think", now=at(1))
    before = revision(store)
    _record(store, attempt.attempt_id, 1)
    _record(store, attempt.attempt_id, 2, role="assistant", body={"content": {"answer": "x" * 10_000}})
    found = store.agent_messages("run-1")
    assert [(m.index, m.role, m.node_id, m.conversation, m.attempt_id) for m in found] == [
        (1, "user", "think", attempt.attempt_id, attempt.attempt_id),
        (2, "assistant", "think", attempt.attempt_id, attempt.attempt_id),
    ]
    # A large message is kept whole (a blob, like any large journal entry).
    assert found[1].body == {"content": {"answer": "x" * 10_000}}
    assert revision(store) == before + 2  # each message advances the run's revision once
    assert store.agent_messages("run-1", node_id="other") == []
    assert store.agent_messages("run-1", conversation="other") == []


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"index": 0}, "index must be a whole number of at least 1"),
        ({"index": True}, "index must be a whole number"),
        ({"role": "system"}, "role must be one of user, assistant, tool"),
        ({"body": ["not", "an", "object"]}, "an agent message is a JSON object"),
        ({"body": {"content": float("nan")}}, "must be finite"),
        ({"node_id": ""}, "node_id"),
    ],
)
def test_agent_message_record__refuses_a_malformed_message_and_writes_nothing(
    store: Store, claimed: Callable[..., RunRecord], overrides: dict[str, Any], says: str
) -> None:
    claimed()
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="think", now=at(1))
    before = snapshot(store)
    with pytest.raises(InvalidInput, match=says):
        _record(store, attempt.attempt_id, **overrides)
    assert snapshot(store) == before


def test_agent_message_record__a_stale_claim_or_a_settled_attempt_writes_nothing(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="think", now=at(1))
    before = snapshot(store)
    with pytest.raises(ClaimLost):
        _record(store, attempt.attempt_id, claim_token="tok-stale")
    with pytest.raises(NotFound):
        _record(store, "attempt-unknown")
    assert snapshot(store) == before
    store.attempt_finish(
        run_id="run-1", claim_token=TOKEN, attempt_id=attempt.attempt_id, status="timed_out", now=at(2)
    )
    before = snapshot(store)
    with pytest.raises(ClaimLost, match="is timed_out"):
        _record(store, attempt.attempt_id, now=3)
    assert snapshot(store) == before
    assert store.agent_messages("run-1") == []


def _text(store: Store, attempt_id: str, offset: int, text: str, now: int = 1, **overrides: Any) -> None:
    args: dict[str, Any] = {
        "run_id": "run-1",
        "claim_token": TOKEN,
        "attempt_id": attempt_id,
        "node_id": "think",
        "conversation": attempt_id,
        "index": 2,
        "offset": offset,
        "text": text,
        "now": at(now),
    }
    args.update(overrides)
    store.agent_text_record(**args)


def test_agent_text_record__streamed_pieces_show_until_the_turn_is_recorded(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="think", now=at(1))
    _record(store, attempt.attempt_id, 1)
    assert store.live_text("run-1") == {}
    _text(store, attempt.attempt_id, 0, '{"ans')
    _text(store, attempt.attempt_id, 5, 'wer": ')
    live = store.live_text("run-1")["think"]
    assert (live.text, live.index, live.conversation) == ('{"answer": ', 2, attempt.attempt_id)
    # The streamed text is a view: the recorded turn supersedes it.
    _record(store, attempt.attempt_id, 2, role="assistant", body={"content": {"answer": "x"}})
    assert store.live_text("run-1") == {}
    # The next turn streams anew; once the attempt is settled its text shows no more.
    _text(store, attempt.attempt_id, 0, "more", index=3)
    assert store.live_text("run-1")["think"].text == "more"
    store.attempt_finish(
        run_id="run-1", claim_token=TOKEN, attempt_id=attempt.attempt_id, status="failed", now=at(2)
    )
    assert store.live_text("run-1") == {}


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"index": 0}, "index must be a whole number"),
        ({"offset": -1}, "offset must be a whole number"),
        ({"offset": True}, "offset must be a whole number"),
        ({"text": None}, "agent text must be text"),
        ({"text": "x" * 20_001}, "at most 20000 characters"),
        ({"node_id": ""}, "node_id"),
    ],
)
def test_agent_text_record__refuses_a_malformed_piece_and_writes_nothing(
    store: Store, claimed: Callable[..., RunRecord], overrides: dict[str, Any], says: str
) -> None:
    claimed()
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="think", now=at(1))
    before = snapshot(store)
    given = dict(overrides)
    with pytest.raises(InvalidInput, match=says):
        _text(store, attempt.attempt_id, given.pop("offset", 0), given.pop("text", "hi"), **given)
    assert snapshot(store) == before


def test_agent_text_record__a_stale_claim_or_a_settled_attempt_writes_nothing(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="think", now=at(1))
    before = snapshot(store)
    with pytest.raises(ClaimLost):
        _text(store, attempt.attempt_id, 0, "hi", claim_token="tok-stale")
    assert snapshot(store) == before
    store.attempt_finish(
        run_id="run-1", claim_token=TOKEN, attempt_id=attempt.attempt_id, status="timed_out", now=at(2)
    )
    before = snapshot(store)
    with pytest.raises(ClaimLost, match="is timed_out"):
        _text(store, attempt.attempt_id, 0, "hi", now=3)
    assert snapshot(store) == before
