"""Blobs, canonical JSON, resource ids, token digests, stored generations (checklist items 78-80;
SPEC §2.1, §2.2, §9 inv. 8 and 12, departure 18)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from tests.store.conftest import LEASE, T0, at, execute, reserve_args, rows, snapshot
from tether.errors import Conflict, InvalidInput
from tether.store import RunRecord, Store
from tether.store.journal import INLINE_PAYLOAD_BYTES
from tether.values import canonical_bytes

Reserve = Callable[..., RunRecord]
Claimed = Callable[..., RunRecord]
T0_MS = int(T0.timestamp() * 1000)


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def blob(store: Store, content: bytes) -> list[tuple[Any, ...]]:
    return rows(store, "SELECT media_type, byte_length, content FROM blobs WHERE blob_hash = ?", sha(content))


def refused_json(store: Store, message: str, **overrides: Any) -> None:
    before = snapshot(store)
    with pytest.raises(InvalidInput) as caught:
        store.reserve(**reserve_args("run-x", origin_session_id="session-x", **overrides))
    assert caught.value.message == message
    assert snapshot(store) == before


# -- 78. content-addressed storage -----------------------------------------------------------


def test_blobs__same_content_is_stored_once(store: Store, reserve: Reserve) -> None:
    reserve("run-1", input={"same": True}, origin_session_id="s1")
    count = rows(store, "SELECT count(*) FROM blobs")
    reserve("run-2", input={"same": True}, origin_session_id="s2", now=at(10))
    assert rows(store, "SELECT count(*) FROM blobs") == count
    assert rows(store, "SELECT count(*) FROM blobs WHERE blob_hash = ?", sha(b'{"same":true}')) == [(1,)]
    assert rows(store, "SELECT count(DISTINCT input_hash), count(*) FROM runs") == [(1, 2)]


def test_blobs__a_transaction_reads_back_the_json_it_stored_without_a_query(
    store: Store, reserve: Reserve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs reserved in one transaction: the record each reservation returns reads its
    definition, input and options, which that transaction stored or read already."""
    reads: list[bytes] = []
    one = store.db.one

    def counted(name: str, /, **params: Any) -> Any:
        if name == "blob_get":
            reads.append(params["hash"])
        return one(name, **params)

    monkeypatch.setattr(store.db, "one", counted)
    with store.transaction():
        first = reserve("run-1")
        second = reserve("run-2", input={"n": 2}, origin_session_id="session-2")
    assert reads == []
    assert (first.input, second.input) == ({"n": 1}, {"n": 2})
    assert first.workflow_source == second.workflow_source


def test_blobs__every_blob_is_keyed_by_the_sha256_of_its_bytes(store: Store, claimed: Claimed) -> None:
    claimed("run-1")
    assert store.fail(
        run_id="run-1", claim_token="tok-run-1", error_code="e", error_message="boom", now=at(5)
    )
    stored = rows(store, "SELECT blob_hash, media_type, byte_length, content FROM blobs")
    assert len(stored) > 3
    for blob_hash, media_type, length, content in stored:
        assert blob_hash == sha(content)
        assert length == len(content)
        assert media_type in ("application/json", "text/plain")
    assert blob(store, b"boom") == [("text/plain", 4, b"boom")]
    assert blob(store, b'{"n":1}') == [("application/json", 7, b'{"n":1}')]


def test_blobs__json_is_stored_canonically(store: Store, reserve: Reserve) -> None:
    reserve(
        input={"z": {"b": 1.0, "a": -0.0}, "a": [2.5, "ünï", None, False], "m": 10**15},
        launch_options={"b": [], "a": {}},
    )
    canonical_input = '{"a":[2.5,"ünï",null,false],"m":1000000000000000,"z":{"a":0,"b":1}}'.encode()
    assert blob(store, canonical_input) == [("application/json", len(canonical_input), canonical_input)]
    assert blob(store, b'{"a":{},"b":[]}') != []
    ((input_hash,),) = rows(store, "SELECT input_hash FROM runs")
    assert input_hash == sha(canonical_input)
    record = store.get_run("run-1")
    assert record is not None
    assert record.input == {"a": [2.5, "ünï", None, False], "m": 10**15, "z": {"a": 0, "b": 1}}


@pytest.mark.parametrize("field", ["input", "launch_options", "definition_snapshot"])
@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_blobs__refuse_non_finite_numbers(store: Store, field: str, number: float) -> None:
    refused_json(store, "JSON numbers must be finite", **{field: {"n": [number]}})


@pytest.mark.parametrize("value", [{1: "x"}, {None: 1}, {("a",): 1}, {"ok": {2.5: 1}}])
def test_blobs__refuse_objects_with_non_string_keys(store: Store, value: Any) -> None:
    refused_json(store, "Only plain objects can be stored as canonical JSON", input=value)


@pytest.mark.parametrize(
    ("value", "type_name"),
    [({1, 2}, "set"), (b"raw", "bytes"), (object(), "object"), (Decimal("1.5"), "Decimal"), (1j, "complex")],
)
def test_blobs__refuse_unsupported_value_types(store: Store, value: Any, type_name: str) -> None:
    refused_json(store, f"Unsupported JSON value type: {type_name}", input={"v": value})


def test_blobs__text_equal_to_stored_json_bytes_is_not_a_conflict(store: Store, claimed: Claimed) -> None:
    claimed("run-1", input=None)
    assert blob(store, b"null") == [("application/json", 4, b"null")]
    assert store.fail(
        run_id="run-1", claim_token="tok-run-1", error_code="e", error_message="null", now=at(5)
    )
    assert blob(store, b"null") == [("application/json", 4, b"null")]
    record = store.get_run("run-1")
    assert record is not None
    assert (record.input, record.error_message) == (None, "null")


def test_blobs__json_over_equal_text_bytes_promotes_the_media_type(store: Store, claimed: Claimed) -> None:
    claimed("run-1")
    assert store.fail(run_id="run-1", claim_token="tok-run-1", error_code="e", error_message="[7]", now=at(5))
    assert blob(store, b"[7]") == [("text/plain", 3, b"[7]")]
    store.reserve(**reserve_args("run-2", input=[7], now=at(10)))
    assert blob(store, b"[7]") == [("application/json", 3, b"[7]")]
    first, second = store.get_run("run-1"), store.get_run("run-2")
    assert first is not None and second is not None
    assert first.error_message == "[7]"
    assert second.input == [7]


def test_blobs__a_rolled_back_promotion_is_not_taken_for_json(store: Store, claimed: Claimed) -> None:
    claimed("run-1")
    assert store.fail(run_id="run-1", claim_token="tok-run-1", error_code="e", error_message="[7]", now=at(5))
    assert blob(store, b"[7]") == [("text/plain", 3, b"[7]")]
    with pytest.raises(RuntimeError), store.transaction():
        store.reserve(**reserve_args("run-2", input=[7], now=at(10)))
        raise RuntimeError("roll back")
    assert blob(store, b"[7]") == [("text/plain", 3, b"[7]")]
    store.reserve(**reserve_args("run-2", input=[7], now=at(11)))
    assert blob(store, b"[7]") == [("application/json", 3, b"[7]")]
    record = store.get_run("run-2")
    assert record is not None and record.input == [7]


def test_blobs__different_bytes_under_a_stored_hash_are_a_conflict(
    store: Store, reserve: Reserve, open_at: Callable[..., Store]
) -> None:
    reserve("run-1", origin_session_id="s1")
    # Stand in for a hash collision: the stored bytes under the hash of '{}' are replaced. (The
    # store that wrote '{}' knows it stored and skips writing it again; a store that never saw
    # it writes it, and that write refuses the different bytes.)
    execute(store, "UPDATE blobs SET content = X'5B5D', byte_length = 2 WHERE blob_hash = ?", sha(b"{}"))
    other = open_at()
    # The conflict surfaces after the resource and lease rows were written (on PostgreSQL, with
    # the statement or the commit the write went out with): the whole reservation rolls back.
    before = snapshot(store)
    with pytest.raises(Conflict) as caught:
        other.reserve(**reserve_args("run-2", origin_session_id="s2", now=at(10)))
    assert caught.value.message == "Content-addressed blob conflict"
    assert snapshot(store) == before


# -- pruning ---------------------------------------------------------------------------------


#: Pads a note's payload past the size kept in the journal entry, so that it is stored as a blob.
PAD = "x" * INLINE_PAYLOAD_BYTES


def note(store: Store, payload: dict[str, Any], ms: int) -> None:
    store.record_event(
        run_id="run-1",
        workflow_ref="builtin:demo",
        type="test.note",
        payload={**payload, "pad": PAD},
        now=at(ms),
    )


def padded(payload: dict[str, Any]) -> bytes:
    """A note's payload blob as stored."""
    return canonical_bytes({**payload, "pad": PAD})


def orphan_notes(store: Store) -> None:
    """Give the test's notes a payload of their own, leaving their blobs referenced by nothing."""
    execute(store, "UPDATE events SET payload_hash = NULL, payload = '{}' WHERE event_type = 'test.note'")


def test_blobs__prune_deletes_only_blobs_nothing_refers_to(store: Store, claimed: Claimed) -> None:
    claimed("run-1")
    note(store, {"note": "orphan"}, 5)
    orphan_notes(store)
    kept = rows(store, "SELECT count(*) FROM blobs")[0][0] - 1
    store.prune_blobs()
    assert blob(store, padded({"note": "orphan"})) == []
    assert rows(store, "SELECT count(*) FROM blobs") == [(kept,)]
    record = store.get_run("run-1")
    assert record is not None and record.input == {"n": 1}  # what runs refer to stays readable
    assert len(store.events_after(0, run_id="run-1")) > 1


@pytest.mark.parametrize("pruner", ["same store", "another store"])
def test_blobs__a_pruned_blob_is_written_again_by_a_store_that_knew_it_stored(
    store: Store, claimed: Claimed, open_at: Callable[..., Store], pruner: str
) -> None:
    # A store skips writing JSON blobs its committed writes stored, until a prune runs anywhere.
    claimed("run-1")
    note(store, {"note": "again"}, 5)
    note(store, {"note": "again"}, 6)  # known stored: no write, still referenced correctly
    orphan_notes(store)
    (store if pruner == "same store" else open_at()).prune_blobs()
    assert blob(store, padded({"note": "again"})) == []
    note(store, {"note": "again"}, 7)
    content = padded({"note": "again"})
    assert blob(store, content) == [("application/json", len(content), content)]
    payloads = [e.payload for e in store.events_after(0, run_id="run-1", event_type="test.note")]
    assert payloads[-1] == {"note": "again", "pad": PAD}


# -- 79. resource ids and token digests ------------------------------------------------------


@pytest.mark.parametrize("run_id", ["a", "run-1", "Run.2_b-c", "x" * 200])
def test_resource_id__is_run_dash_40_hex_of_sha256_of_run_nul_id(
    store: Store, reserve: Reserve, run_id: str
) -> None:
    reserve(run_id)
    expected = "run-" + hashlib.sha256(b"run\x00" + run_id.encode()).hexdigest()[:40]
    assert re.fullmatch(r"run-[0-9a-f]{40}", expected)
    assert rows(store, "SELECT resource_id, resource_type, aggregate_key FROM resources") == [
        (expected, "run", run_id)
    ]
    assert rows(store, "SELECT resource_id FROM runs") == [(expected,)]
    assert rows(store, "SELECT DISTINCT resource_id FROM leases") == [(expected,)]
    assert rows(store, "SELECT DISTINCT resource_id FROM events") == [(expected,)]


def test_resource_id__is_the_same_in_another_database(store: Store, reserve: Reserve, tmp_path: Any) -> None:
    from tether import open_store

    reserve("run-1")
    with open_store(f"sqlite:///{tmp_path}/second.db") as second:
        second.reserve(**reserve_args("run-1"))
        assert rows(second, "SELECT resource_id FROM resources") == rows(
            store, "SELECT resource_id FROM resources"
        )


def test_claim_token__only_its_sha256_is_stored(store: Store, reserve: Reserve) -> None:
    token = "raw-token-7f3c9e"
    reserve()
    claimed = store.claim(run_id="run-1", runner_id="host-a", claim_token=token, lease_ms=LEASE, now=at(1))
    assert claimed is not None and claimed.claim_token == token
    assert rows(store, "SELECT token_hash FROM leases") == [(sha(token.encode()),)]
    assert store.renew(run_id="run-1", claim_token=token, lease_ms=LEASE, now=at(2))
    assert store.mark_running(run_id="run-1", claim_token=token, now=at(3))
    store.record_event(
        run_id="run-1", workflow_ref="builtin:demo", type="note", runner_id="host-a", now=at(4)
    )
    raw = token.encode()
    for table, table_rows in snapshot(store).items():
        for row in table_rows:
            for cell in row:
                assert not (isinstance(cell, str) and token in cell), table
                assert not (isinstance(cell, bytes) and raw in cell), table
    assert store.park(run_id="run-1", claim_token=token, now=at(5))
    assert rows(store, "SELECT generation, token_hash FROM leases") == [(1, None)]


# -- 80. lease generation 0 is stored NULL ---------------------------------------------------


def test_events__store_generation_0_as_null(store: Store, claimed: Claimed) -> None:
    store.reserve(**reserve_args("run-1"))
    assert rows(store, "SELECT event_type, lease_generation FROM events") == [("run.queued", None)]
    claimed("run-1", now=10)
    assert store.park(run_id="run-1", claim_token="tok-run-1", now=at(20))
    assert store.request_resume(run_id="run-1", now=at(30))
    assert rows(
        store, "SELECT resource_revision, event_type, lease_generation FROM events ORDER BY event_seq"
    ) == [
        (1, "run.queued", None),
        (2, "lease.claimed", 1),
        (3, "run.queue_running", 1),
        (4, "run.queue_parked", 1),
        (5, "run.resume_requested", None),
    ]
    assert rows(store, "SELECT count(*) FROM events WHERE lease_generation = 0") == [(0,)]
