"""Reservation: SPEC §3.2 reserveWorkflowRun / reserveOrAdoptWorkflowRun, §7 validation, §9 inv. 6, 7, 13.

Checklist items 1-20. Every refused call is checked to leave the database exactly as it was.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from tests.store.conftest import (
    DIGEST,
    SOURCE,
    T0,
    at,
    reserve_args,
    rows,
    snapshot,
)
from tether.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    ProjectNotRegistered,
    SessionBusy,
    TetherError,
)
from tether.store import Preparation, RunRecord, Store

T0_MS = int(T0.timestamp() * 1000)
Reserve = Callable[..., RunRecord]
Claimed = Callable[..., RunRecord]


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def run_resource(run_id: str) -> str:
    return "run-" + hashlib.sha256(b"run\x00" + run_id.encode()).hexdigest()[:40]


def refused(store: Store, error: type[TetherError], message: str, call: Callable[[], Any]) -> None:
    """``call`` raises exactly ``error`` with ``message`` and writes nothing."""
    before = snapshot(store)
    with pytest.raises(error) as caught:
        call()
    assert type(caught.value) is error
    assert caught.value.message == message
    assert snapshot(store) == before


def cancelled_parent(store: Store, reserve: Reserve, run_id: str = "parent", **overrides: Any) -> int:
    """Reserve a run and cancel it (both axes terminal). Its current resource revision."""
    reserve(run_id, **overrides)
    assert store.cancel(run_id=run_id, now=at(100))
    return revision_of(store, run_id)


def revision_of(store: Store, run_id: str) -> int:
    ((revision,),) = rows(store, "SELECT revision FROM resources WHERE resource_id = ?", run_resource(run_id))
    return int(revision)


def restart_args(parent: str, revision: int, run_id: str = "child", **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "parent_run_id": parent,
        "lineage_kind": "restart",
        "parent_run_revision": revision,
        "now": at(1_000),
    }
    return reserve_args(run_id, **{**args, **overrides})


def run_rows(store: Store, run_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row that belongs to one run (to check that a parent is not modified)."""
    resource = run_resource(run_id)
    return {
        "resources": rows(store, "SELECT * FROM resources WHERE resource_id = ?", resource),
        "leases": rows(store, "SELECT * FROM leases WHERE resource_id = ?", resource),
        "events": rows(store, "SELECT * FROM events WHERE resource_id = ?", resource),
        "runs": rows(store, "SELECT * FROM runs WHERE run_id = ?", run_id),
        "run_queue": rows(store, "SELECT * FROM run_queue WHERE run_id = ?", run_id),
        "run_bindings": rows(store, "SELECT * FROM run_bindings WHERE run_id = ?", run_id),
        "run_sources": rows(store, "SELECT * FROM run_sources WHERE run_id = ?", run_id),
        "viewer_runs": rows(store, "SELECT * FROM viewer_runs WHERE run_id = ?", run_id),
    }


# -- 1. reserve writes every row --------------------------------------------------------------


def test_reserve__writes_all_rows_at_revision_1(store: Store, reserve: Reserve) -> None:
    record = reserve()
    resource = run_resource("run-1")

    assert rows(store, "SELECT resource_type, aggregate_key, revision FROM resources") == [
        ("run", "run-1", 1)
    ]
    assert rows(store, "SELECT resource_id FROM resources") == [(resource,)]
    assert rows(
        store,
        "SELECT resource_id, generation, owner_type, owner_id, token_hash, acquired_at, heartbeat_at,"
        " expires_at FROM leases",
    ) == [(resource, 0, None, None, None, None, None, None)]
    assert rows(
        store,
        "SELECT run_id, resource_id, project_id, parent_run_id, root_run_id, lineage_kind, restart_number,"
        " parent_run_revision, definition_digest, workflow_ref, status, paused, status_detail,"
        " error_hash, created_at, updated_at, finished_at FROM runs",
    ) == [
        (
            "run-1",
            resource,
            store.project_id,
            None,
            "run-1",
            None,
            0,
            None,
            bytes.fromhex(DIGEST.removeprefix("sha256:")),
            "builtin:demo",
            "queued",
            0,
            None,
            None,
            T0_MS,
            T0_MS,
            None,
        )
    ]
    assert rows(
        store,
        "SELECT definition_digest, workflow_name, definition_hash, created_at FROM workflow_definitions",
    ) == [
        (bytes.fromhex(DIGEST.removeprefix("sha256:")), "demo", sha(b'{"name":"demo","nodes":["a"]}'), T0_MS)
    ]
    assert rows(
        store, "SELECT run_id, mount_path, source_type, source_ref, source_revision FROM run_sources"
    ) == [("run-1", "", "builtin", "demo", "1")]
    assert rows(store, "SELECT run_id, origin_session_id, execution_mode, created_at FROM run_bindings") == [
        ("run-1", "session-1", "interactive", T0_MS)
    ]
    assert rows(
        store,
        "SELECT run_id, project_id, status, available_at, affinity_runner_id, origin_session_id,"
        " consecutive_errors, error_code, error_hash, created_at, updated_at, started_at, finished_at"
        " FROM run_queue",
    ) == [
        (
            "run-1",
            store.project_id,
            "queued",
            T0_MS,
            None,
            "session-1",
            0,
            None,
            None,
            T0_MS,
            T0_MS,
            None,
            None,
        )
    ]
    assert rows(
        store,
        "SELECT resource_id, resource_revision, event_type, actor_type, actor_id, lease_generation,"
        " payload_hash, payload, recorded_at FROM events",
    ) == [(resource, 1, "run.queued", "session", "session-1", None, None, "{}", T0_MS)]
    ((event_id,),) = rows(store, "SELECT event_id FROM events")
    assert event_id.startswith("event-")
    assert rows(store, "SELECT run_id, presentation_revision, retained_from_revision FROM viewer_runs") == [
        ("run-1", 1, 1)
    ]
    assert rows(store, "SELECT count(*) FROM viewer_revisions") == [(0,)]

    assert record.run_id == "run-1"
    assert record.status == "queued"
    assert record.initialized is False
    assert record.runner_id is None
    assert record.claim_token is None
    assert record.claim_generation is None
    assert record.claim_expires_at is None
    assert record.created_at == record.updated_at == T0
    assert record.started_at is None and record.finished_at is None
    assert record.error_code is None and record.error_message is None


def test_reserve__stores_snapshot_input_and_options_as_canonical_json_blobs(
    store: Store, reserve: Reserve
) -> None:
    reserve(input={"z": [1.0, -0.0], "a": "é"}, launch_options={"b": True, "a": None})
    ((definition_hash,),) = rows(store, "SELECT definition_hash FROM workflow_definitions")
    ((input_hash, options_hash),) = rows(store, "SELECT input_hash, launch_options_hash FROM runs")
    blobs = dict(
        (bytes(h), (media, length, bytes(content)))
        for h, media, length, content in rows(
            store, "SELECT blob_hash, media_type, byte_length, content FROM blobs"
        )
    )
    snapshot_bytes = b'{"name":"demo","nodes":["a"]}'
    input_bytes = '{"a":"é","z":[1,0]}'.encode()
    options_bytes = b'{"a":null,"b":true}'
    assert definition_hash == sha(snapshot_bytes)
    assert input_hash == sha(input_bytes)
    assert options_hash == sha(options_bytes)
    for content in (snapshot_bytes, input_bytes, options_bytes):
        assert blobs[sha(content)] == ("application/json", len(content), content)


def test_reserve__returns_the_same_record_that_get_run_reads(store: Store, reserve: Reserve) -> None:
    record = reserve()
    assert store.get_run("run-1") == record
    assert record.workflow_name == "demo"
    assert record.workflow_source_ref == "builtin:demo"
    assert record.workflow_source == {"root": SOURCE, "mounted": []}
    assert record.definition_digest == DIGEST
    assert record.input == {"n": 1}
    assert record.origin_session_id == "session-1"
    assert record.execution_mode == "interactive"
    assert (record.parent_run_id, record.root_run_id, record.lineage_kind) == (None, "run-1", None)
    assert (record.restart_number, record.parent_run_revision) == (0, None)


def test_reserve__first_writer_names_a_definition_digest(store: Store, reserve: Reserve) -> None:
    reserve("run-1", workflow_name="first", origin_session_id="s1")
    second = reserve("run-2", workflow_name="second", origin_session_id="s2")
    assert rows(store, "SELECT workflow_name FROM workflow_definitions") == [("first",)]
    assert second.workflow_name == "first"


# -- 2. run id -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run_id",
    ["a", "Z", "0", "a" * 200, "9" + "x" * 199, "run.1-b_c", "A..", "a--", "a__"],
)
def test_reserve__accepts_run_ids_matching_the_pattern(reserve: Reserve, run_id: str) -> None:
    assert reserve(run_id).run_id == run_id


@pytest.mark.parametrize(
    "run_id",
    ["", ".run", "-run", "_run", "a" * 201, "run 1", "run/1", "run:1", "rün", "run\n", "run\x00"],
)
def test_reserve__refuses_run_ids_outside_the_pattern(store: Store, run_id: str) -> None:
    message = f"Invalid workflow run id: {run_id}"
    refused(store, InvalidInput, message, lambda: store.reserve(**reserve_args(run_id)))
    refused(store, InvalidInput, message, lambda: store.reserve_or_adopt(**reserve_args(run_id)))


# -- 3. definition digest --------------------------------------------------------------------

HEX = "ab" * 32


@pytest.mark.parametrize(
    "digest", [f"sha256:{HEX}", HEX, f"sha256:{HEX.upper()}", HEX.upper(), "sha256:" + "aB" * 32]
)
def test_reserve__accepts_digest_with_or_without_prefix_in_any_case(
    store: Store, reserve: Reserve, digest: str
) -> None:
    record = reserve(definition_digest=digest)
    assert record.definition_digest == f"sha256:{HEX}"
    assert rows(store, "SELECT definition_digest FROM runs") == [(bytes.fromhex(HEX),)]


@pytest.mark.parametrize(
    "digest",
    [
        "a" * 63,
        "a" * 65,
        "sha256:" + "a" * 63,
        "sha256:" + "a" * 65,
        "SHA256:" + "a" * 64,
        "sha256:" + "g" * 64,
        "sha1:" + "a" * 64,
        "",
        "sha256:",
        " " + "a" * 64,
    ],
)
def test_reserve__refuses_malformed_digests(store: Store, digest: str) -> None:
    refused(
        store,
        InvalidInput,
        "Expected a SHA-256 digest",
        lambda: store.reserve(**reserve_args(definition_digest=digest)),
    )


# -- 4. now ----------------------------------------------------------------------------------


@pytest.mark.parametrize("now", ["not a time", "", "2026-13-01T00:00:00Z", "2026-01-01T25:00:00Z"])
def test_reserve__refuses_an_unparsable_now(store: Store, now: str) -> None:
    refused(store, InvalidInput, "Invalid timestamp", lambda: store.reserve(**reserve_args(now=now)))
    refused(store, InvalidInput, "Invalid timestamp", lambda: store.reserve_or_adopt(**reserve_args(now=now)))


@pytest.mark.parametrize("now", [datetime(2026, 1, 1), "2026-01-01T00:00:00", 1767225600000, 1.5])
def test_reserve__refuses_a_naive_or_non_time_now(store: Store, now: object) -> None:
    before = snapshot(store)
    with pytest.raises(InvalidInput) as caught:
        store.reserve(**reserve_args(now=now))
    assert caught.value.message.startswith("Invalid timestamp")
    assert snapshot(store) == before


@pytest.mark.parametrize(
    "now",
    [
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00.000Z",
        "2026-01-01T01:00:00+01:00",
        "2025-12-31T19:00:00-05:00",
        datetime(2026, 1, 1, 2, tzinfo=timezone(timedelta(hours=2))),
        datetime(2026, 1, 1, 0, 0, 0, 999, tzinfo=UTC),
    ],
)
def test_reserve__reads_now_as_aware_time_or_iso_string_to_the_millisecond(
    store: Store, reserve: Reserve, now: object
) -> None:
    record = reserve(now=now)
    assert record.created_at == T0
    assert rows(store, "SELECT created_at, available_at FROM run_queue") == [(T0_MS, T0_MS)]


def test_reserve__without_now_uses_the_wall_clock(store: Store, reserve: Reserve) -> None:
    before = datetime.now(UTC)
    record = reserve(now=None)
    after = datetime.now(UTC)
    assert before - timedelta(milliseconds=1) <= record.created_at <= after


# -- 5. duplicates ---------------------------------------------------------------------------


def test_reserve__refuses_a_taken_run_id_and_writes_nothing(store: Store, reserve: Reserve) -> None:
    reserve()
    refused(
        store,
        Conflict,
        "Workflow run already reserved: run-1",
        lambda: store.reserve(**reserve_args(origin_session_id="session-2", now=at(5))),
    )


def test_reserve__refuses_a_taken_run_id_even_after_the_run_finished(store: Store, reserve: Reserve) -> None:
    cancelled_parent(store, reserve, "run-1")
    refused(
        store,
        Conflict,
        "Workflow run already reserved: run-1",
        lambda: store.reserve(**reserve_args("run-1")),
    )


# -- 6-7. lineage declarations ---------------------------------------------------------------


@pytest.mark.parametrize(
    "lineage",
    [
        {"lineage_kind": "restart"},
        {"parent_run_id": "parent"},
        {"parent_run_id": "parent", "lineage_kind": "fork"},
        {"parent_run_id": "parent", "parent_run_revision": 2, "restart_number": 1},
        {"parent_run_id": "ghost"},
    ],
)
def test_reserve__refuses_a_parent_without_an_explicit_restart(
    store: Store, reserve: Reserve, lineage: dict[str, Any]
) -> None:
    cancelled_parent(store, reserve)
    refused(
        store,
        InvalidInput,
        "Only an explicit restart can declare a parent run",
        lambda: store.reserve(**reserve_args("child", **lineage)),
    )


@pytest.mark.parametrize(
    "metadata",
    [{"restart_number": 0}, {"restart_number": 1}, {"parent_run_revision": 0}, {"parent_run_revision": 3}],
)
def test_reserve__refuses_restart_metadata_on_a_root_run(store: Store, metadata: dict[str, Any]) -> None:
    refused(
        store,
        InvalidInput,
        "A root workflow run cannot declare restart metadata",
        lambda: store.reserve(**reserve_args(**metadata)),
    )


# -- 8-11. restart parents -------------------------------------------------------------------


def test_reserve__refuses_an_unknown_parent(store: Store) -> None:
    refused(
        store,
        NotFound,
        "Workflow run not found: ghost",
        lambda: store.reserve(**restart_args("ghost", 1)),
    )


def test_reserve__refuses_a_parent_of_another_session(store: Store, reserve: Reserve) -> None:
    revision = cancelled_parent(store, reserve, origin_session_id="session-1")
    refused(
        store,
        Conflict,
        "Workflow parent belongs to another session",
        lambda: store.reserve(**restart_args("parent", revision, origin_session_id="session-2")),
    )


def test_reserve__compares_the_parents_binding_origin_even_when_headless(
    store: Store, reserve: Reserve
) -> None:
    revision = cancelled_parent(store, reserve, execution_mode="headless", origin_session_id="session-1")
    child = store.reserve(**restart_args("parent", revision, origin_session_id="session-1"))
    assert child.parent_run_id == "parent"
    refused(
        store,
        Conflict,
        "Workflow parent belongs to another session",
        lambda: store.reserve(**restart_args("parent", revision, "child-2", origin_session_id="session-9")),
    )


def _parent_queued(store: Store, reserve: Reserve, claimed: Claimed) -> None:
    reserve("parent")


def _parent_run_terminal_queue_running(store: Store, reserve: Reserve, claimed: Claimed) -> None:
    claimed("parent")
    store.set_run_status(run_id="parent", claim_token="tok-parent", status="running", now=at(1))
    store.set_run_status(run_id="parent", claim_token="tok-parent", status="completed", now=at(2))


def _parent_queue_done_run_running(store: Store, reserve: Reserve, claimed: Claimed) -> None:
    claimed("parent")
    store.set_run_status(run_id="parent", claim_token="tok-parent", status="running", now=at(1))
    assert store.complete(run_id="parent", claim_token="tok-parent", now=at(2))


def _parent_parked(store: Store, reserve: Reserve, claimed: Claimed) -> None:
    claimed("parent")
    assert store.park(run_id="parent", claim_token="tok-parent", now=at(2))


@pytest.mark.parametrize(
    "make_parent",
    [_parent_queued, _parent_run_terminal_queue_running, _parent_queue_done_run_running, _parent_parked],
)
def test_reserve__refuses_a_parent_not_terminal_on_both_axes(
    store: Store, reserve: Reserve, claimed: Claimed, make_parent: Callable[..., None]
) -> None:
    make_parent(store, reserve, claimed)
    revision = revision_of(store, "parent")
    refused(
        store,
        Conflict,
        "Restart parent is not terminal",
        lambda: store.reserve(**restart_args("parent", revision)),
    )


@pytest.mark.parametrize("revision", [None, -1, 1.5, True, "2", 2**64])
def test_reserve__refuses_a_missing_or_malformed_parent_revision(
    store: Store, reserve: Reserve, revision: object
) -> None:
    cancelled_parent(store, reserve)
    refused(
        store,
        InvalidInput,
        "Restart requires the exact parent run revision",
        lambda: store.reserve(**restart_args("parent", revision)),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("offset", [-1, 1, -2])
def test_reserve__refuses_a_stale_parent_revision(store: Store, reserve: Reserve, offset: int) -> None:
    revision = cancelled_parent(store, reserve)
    refused(
        store,
        Conflict,
        "Restart parent revision changed",
        lambda: store.reserve(**restart_args("parent", revision + offset)),
    )


def test_reserve__restart_defaults_its_number_to_parent_plus_one_and_pins_the_revision(
    store: Store, reserve: Reserve
) -> None:
    revision = cancelled_parent(store, reserve)
    parent_before = run_rows(store, "parent")
    child = store.reserve(**restart_args("parent", revision))
    assert child.parent_run_id == "parent"
    assert child.root_run_id == "parent"
    assert child.lineage_kind == "restart"
    assert child.restart_number == 1
    assert child.parent_run_revision == revision
    assert rows(
        store,
        "SELECT parent_run_id, root_run_id, lineage_kind, restart_number, parent_run_revision"
        " FROM runs WHERE run_id = 'child'",
    ) == [("parent", "parent", "restart", 1, revision)]
    assert run_rows(store, "parent") == parent_before


def test_reserve__restart_chain_copies_the_root_and_counts_restarts(store: Store, reserve: Reserve) -> None:
    revision = cancelled_parent(store, reserve, "root")
    store.reserve(**restart_args("root", revision, "first", restart_number=1))
    assert store.cancel(run_id="first", now=at(2_000))
    second = store.reserve(**restart_args("first", revision_of(store, "first"), "second", now=at(3_000)))
    assert (second.parent_run_id, second.root_run_id, second.restart_number) == ("first", "root", 2)


@pytest.mark.parametrize("number", [0, 2, -1, True])
def test_reserve__refuses_a_restart_number_that_does_not_follow_the_parent(
    store: Store, reserve: Reserve, number: object
) -> None:
    revision = cancelled_parent(store, reserve)
    refused(
        store,
        InvalidInput,
        "Restart number does not follow its parent",
        lambda: store.reserve(**restart_args("parent", revision, restart_number=number)),
    )


def test_reserve__refuses_a_second_restart_of_one_parent_and_writes_nothing(
    store: Store, reserve: Reserve
) -> None:
    revision = cancelled_parent(store, reserve)
    store.reserve(**restart_args("parent", revision, "child-1"))
    assert store.cancel(run_id="child-1", now=at(2_000))
    before = snapshot(store)
    with pytest.raises(TetherError):
        store.reserve(**restart_args("parent", revision, "child-2", now=at(3_000)))
    assert snapshot(store) == before


# -- 12-13. sources --------------------------------------------------------------------------

FILE_SOURCE = {"kind": "file", "path": "flows/leaf.py", "hash": "h1"}


@pytest.mark.parametrize(
    "source",
    [
        None,
        "builtin:demo",
        [],
        {},
        {"kind": "builtin", "id": "demo"},
        {"kind": "builtin", "id": 1, "revision": "1"},
        {"kind": "file", "path": "a.py"},
        {"kind": "git", "id": "demo", "revision": "1"},
        {"root": SOURCE},
        {"root": {"kind": "builtin"}, "mounted": []},
        {"root": SOURCE, "mounted": {}},
        {"root": SOURCE, "mounted": ["child"]},
        {"root": SOURCE, "mounted": [{"mountPath": "child", "workflowName": "c", "source": SOURCE}]},
        {"root": SOURCE, "mounted": [{"mountPath": ["child", 1], "workflowName": "c", "source": SOURCE}]},
        {"root": SOURCE, "mounted": [{"mountPath": ["child"], "workflowName": 3, "source": SOURCE}]},
        {"root": SOURCE, "mounted": [{"mountPath": ["child"], "workflowName": "c", "source": {}}]},
    ],
)
def test_reserve__refuses_an_invalid_source_identity(store: Store, source: object) -> None:
    refused(
        store,
        InvalidInput,
        "Stored workflow source identity is invalid",
        lambda: store.reserve(**reserve_args(workflow_source=source)),
    )


@pytest.mark.parametrize("source", [SOURCE, FILE_SOURCE])
def test_reserve__normalises_a_bare_source_to_root_with_no_mounts(
    store: Store, reserve: Reserve, source: dict[str, str]
) -> None:
    record = reserve(workflow_source=source)
    assert record.workflow_source == {"root": source, "mounted": []}
    parts = tuple(source[k] for k in ("kind", "id" if source["kind"] == "builtin" else "path"))
    revision = source["revision"] if source["kind"] == "builtin" else source["hash"]
    assert rows(store, "SELECT mount_path, source_type, source_ref, source_revision FROM run_sources") == [
        ("", *parts, revision)
    ]


def test_reserve__names_mounts_from_the_snapshot_composition_else_by_mount_path(
    store: Store, reserve: Reserve
) -> None:
    snapshot_with_mounts = {
        "name": "demo",
        "composition": {
            "mounts": [
                {"mountPath": ["child", "leaf"], "workflowName": "leaf-from-snapshot"},
                {"mountPath": ["unused"], "workflowName": "unused"},
                {"mountPath": "aux", "workflowName": "malformed entry is ignored"},
            ]
        },
    }
    source = {
        "root": SOURCE,
        "mounted": [
            {"mountPath": ["child", "leaf"], "workflowName": "given-name", "source": FILE_SOURCE},
            {"mountPath": ["aux"], "workflowName": "aux-given", "source": SOURCE},
        ],
    }
    record = reserve(workflow_source=source, definition_snapshot=snapshot_with_mounts)
    assert record.workflow_source == {
        "root": SOURCE,
        "mounted": [
            {"mountPath": ["aux"], "workflowName": "aux", "source": SOURCE},
            {"mountPath": ["child", "leaf"], "workflowName": "leaf-from-snapshot", "source": FILE_SOURCE},
        ],
    }
    # The reservation's record (its sources as written) is what a later read returns.
    assert store.get_run("run-1") == record
    assert rows(
        store,
        "SELECT mount_path, source_type, source_ref, source_revision FROM run_sources ORDER BY mount_path",
    ) == [
        ("", "builtin", "demo", "1"),
        ("aux", "builtin", "demo", "1"),
        ("child/leaf", "file", "flows/leaf.py", "h1"),
    ]


def test_reserve__names_mounts_by_path_when_the_snapshot_has_no_composition(reserve: Reserve) -> None:
    source = {
        "root": SOURCE,
        "mounted": [{"mountPath": ["a", "b"], "workflowName": "given", "source": FILE_SOURCE}],
    }
    record = reserve(workflow_source=source, definition_snapshot={"composition": "not an object"})
    assert record.workflow_source["mounted"] == [
        {"mountPath": ["a", "b"], "workflowName": "a/b", "source": FILE_SOURCE}
    ]


# -- 14-16. defaults, headless, one active interactive run per session ------------------------


def test_reserve__defaults_input_null_options_empty_and_interactive(store: Store) -> None:
    args = reserve_args()
    del args["input"]
    record = store.reserve(**args)
    assert record.input is None
    assert record.launch_options == {}
    assert record.execution_mode == "interactive"
    assert rows(store, "SELECT input_hash, launch_options_hash FROM runs") == [(sha(b"null"), sha(b"{}"))]
    assert rows(store, "SELECT execution_mode FROM run_bindings") == [("interactive",)]


def test_reserve__keeps_explicit_input_null_and_launch_options(reserve: Reserve) -> None:
    record = reserve(input=None, launch_options={"model": "small", "retries": 2})
    assert record.input is None
    assert record.launch_options == {"model": "small", "retries": 2}


def test_reserve__headless_run_has_no_queue_origin_and_is_no_reservation(
    store: Store, reserve: Reserve
) -> None:
    record = reserve(execution_mode="headless")
    assert record.execution_mode == "headless"
    assert record.origin_session_id is None
    assert rows(store, "SELECT origin_session_id FROM run_queue") == [(None,)]
    assert rows(store, "SELECT origin_session_id, execution_mode FROM run_bindings") == [
        ("session-1", "headless")
    ]
    assert rows(store, "SELECT actor_type, actor_id FROM events") == [("session", "session-1")]
    assert store.find_session_reservation("session-1") is None
    assert store.find_session_reservation_view("session-1") is None
    view = store.get_run_view("run-1")
    assert view is not None and view.origin_session_id is None


def test_reserve__refuses_an_unknown_execution_mode(store: Store) -> None:
    refused(
        store,
        InvalidInput,
        "execution_mode must be 'interactive' or 'headless'",
        lambda: store.reserve(**reserve_args(execution_mode="batch")),
    )


@pytest.mark.parametrize("queue_status", ["queued", "starting", "running"])
def test_reserve__refuses_a_second_active_interactive_run_of_a_session(
    store: Store, reserve: Reserve, claimed: Claimed, queue_status: str
) -> None:
    if queue_status == "queued":
        reserve("run-1")
    else:
        claimed("run-1", running=queue_status == "running")
    assert rows(store, "SELECT status FROM run_queue") == [(queue_status,)]
    before = snapshot(store)
    with pytest.raises(SessionBusy) as caught:
        store.reserve(**reserve_args("run-2", now=at(10)))
    assert isinstance(caught.value, Conflict)
    assert "session-1" in caught.value.message
    assert snapshot(store) == before


def test_reserve__other_sessions_headless_parked_and_finished_runs_do_not_block(
    store: Store, reserve: Reserve, claimed: Claimed
) -> None:
    reserve("active", origin_session_id="session-1")
    reserve("other-session", origin_session_id="session-2")
    reserve("headless-1", origin_session_id="session-1", execution_mode="headless")
    reserve("headless-2", origin_session_id="session-1", execution_mode="headless")
    claimed("parked", origin_session_id="session-3")
    assert store.park(run_id="parked", claim_token="tok-parked", now=at(1))
    reserve("after-parked", origin_session_id="session-3")
    assert store.cancel(run_id="active", now=at(2))
    reserve("after-cancel", origin_session_id="session-1", now=at(3))
    assert rows(
        store,
        "SELECT origin_session_id, count(*) FROM run_queue WHERE status IN ('queued', 'starting', 'running')"
        " AND origin_session_id IS NOT NULL GROUP BY origin_session_id ORDER BY 1",
    ) == [("session-1", 1), ("session-2", 1), ("session-3", 1)]


# -- 17. project registration ----------------------------------------------------------------


def test_reserve__refuses_a_store_without_a_registered_project(
    store: Store, open_at: Callable[..., Store]
) -> None:
    global_store = open_at(None)
    message = "Project is not registered in the state database"
    refused(store, ProjectNotRegistered, message, lambda: global_store.reserve(**reserve_args()))
    refused(store, ProjectNotRegistered, message, lambda: global_store.reserve_or_adopt(**reserve_args()))
    assert store.get_run("run-1") is None


def test_reserve__records_the_stores_project(store: Store, open_at: Callable[..., Store]) -> None:
    other = open_at("other")
    other.reserve(**reserve_args("run-o"))
    store.reserve(**reserve_args("run-d", origin_session_id="session-2"))
    assert rows(store, "SELECT run_id, project_id FROM runs ORDER BY run_id") == [
        ("run-d", store.project_id),
        ("run-o", other.project_id),
    ]
    assert rows(store, "SELECT run_id, project_id FROM run_queue ORDER BY run_id") == [
        ("run-d", store.project_id),
        ("run-o", other.project_id),
    ]


# -- 6. atomicity ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {"input": {"x": float("nan")}},
        {"launch_options": {1: "x"}},
        {"definition_snapshot": {"s": {1, 2}}},
        {"workflow_name": ""},
        {"workflow_source_ref": ""},
        {"origin_session_id": ""},
    ],
)
def test_reserve__is_atomic_when_a_value_is_refused(
    store: Store, reserve: Reserve, overrides: dict[str, Any]
) -> None:
    reserve("existing")
    before = snapshot(store)
    with pytest.raises(InvalidInput):
        store.reserve(**reserve_args("run-2", **{"origin_session_id": "session-2", **overrides}))
    assert snapshot(store) == before


# -- 18-20. reserve or adopt ------------------------------------------------------------------


def test_reserve_or_adopt__reserves_when_absent(store: Store) -> None:
    prepared = store.reserve_or_adopt(**reserve_args())
    assert isinstance(prepared, Preparation)
    assert prepared.state == "reserved"
    assert prepared.run == store.get_run("run-1")
    assert rows(store, "SELECT event_type, resource_revision FROM events") == [("run.queued", 1)]
    assert rows(store, "SELECT presentation_revision FROM viewer_runs") == [(1,)]


def test_reserve_or_adopt__adopts_a_matching_run_and_writes_nothing(store: Store, reserve: Reserve) -> None:
    reserve()
    before = snapshot(store)
    prepared = store.reserve_or_adopt(**reserve_args(now=at(5_000)))
    assert prepared.state == "adopted"
    assert prepared.run == store.get_run("run-1")
    assert snapshot(store) == before


def test_reserve_or_adopt__adopts_a_claimed_run_as_it_is_now(store: Store, claimed: Claimed) -> None:
    claimed("run-1", now=100)
    before = snapshot(store)
    prepared = store.reserve_or_adopt(**reserve_args(now=at(200)))
    assert prepared.state == "adopted"
    assert prepared.run.status == "running"
    assert prepared.run.runner_id == "host-a"
    assert prepared.run.claim_token is None
    assert snapshot(store) == before


@pytest.mark.parametrize(
    "equivalent",
    [
        {"input": {"n": 1.0}},
        {"workflow_source": {"root": SOURCE, "mounted": []}},
        {"definition_digest": DIGEST.removeprefix("sha256:").upper()},
        {"launch_options": {}},
        {"launch_options": None},
        {"execution_mode": "interactive"},
    ],
)
def test_reserve_or_adopt__compares_canonical_forms(
    store: Store, reserve: Reserve, equivalent: dict[str, Any]
) -> None:
    reserve()
    before = snapshot(store)
    assert store.reserve_or_adopt(**reserve_args(**equivalent)).state == "adopted"
    assert snapshot(store) == before


def test_reserve_or_adopt__compares_input_canonically_regardless_of_key_order(
    store: Store, reserve: Reserve
) -> None:
    reserve(input={"b": [1, {"y": 2, "x": 1}], "a": -0.0})
    prepared = store.reserve_or_adopt(**reserve_args(input={"a": 0, "b": [1.0, {"x": 1, "y": 2}]}))
    assert prepared.state == "adopted"


@pytest.mark.parametrize(
    "mismatch",
    [
        {"workflow_name": "renamed"},
        {"workflow_source_ref": "builtin:other"},
        {"workflow_source": {"kind": "builtin", "id": "demo", "revision": "2"}},
        {
            "workflow_source": {
                "root": SOURCE,
                "mounted": [{"mountPath": ["m"], "workflowName": "m", "source": SOURCE}],
            }
        },
        {"definition_digest": "sha256:" + "0" * 64},
        {"input": {"n": 2}},
        {"input": None},
        {"launch_options": {"retries": 1}},
        {"origin_session_id": "session-2"},
        {"execution_mode": "headless"},
    ],
)
def test_reserve_or_adopt__refuses_a_mismatched_field_and_writes_nothing(
    store: Store, reserve: Reserve, mismatch: dict[str, Any]
) -> None:
    reserve()
    refused(
        store,
        Conflict,
        "Workflow run preparation conflicts: run-1",
        lambda: store.reserve_or_adopt(**reserve_args(**mismatch)),
    )


def test_reserve_or_adopt__refuses_a_root_run_prepared_as_a_restart(store: Store, reserve: Reserve) -> None:
    revision = cancelled_parent(store, reserve)
    reserve("child", origin_session_id="session-1", now=at(1_000))
    refused(
        store,
        Conflict,
        "Workflow run preparation conflicts: child",
        lambda: store.reserve_or_adopt(**restart_args("parent", revision)),
    )


def test_reserve_or_adopt__adopts_a_restart_without_rechecking_its_preconditions(
    store: Store, reserve: Reserve
) -> None:
    revision = cancelled_parent(store, reserve)
    store.reserve(**restart_args("parent", revision))
    store.record_event(run_id="parent", workflow_ref="builtin:demo", type="note", now=at(2_000))
    assert revision_of(store, "parent") == revision + 1
    before = snapshot(store)
    prepared = store.reserve_or_adopt(**restart_args("parent", revision))
    assert prepared.state == "adopted"
    assert prepared.run.parent_run_revision == revision
    assert store.reserve_or_adopt(**restart_args("parent", revision, restart_number=1)).state == "adopted"
    assert snapshot(store) == before


@pytest.mark.parametrize(
    "mismatch",
    [
        {"parent_run_revision": None},
        {"parent_run_revision": 0},
        {"restart_number": 2},
        {"restart_number": 0},
        {"parent_run_id": None, "lineage_kind": None, "parent_run_revision": None},
        {"parent_run_id": "other-parent"},
    ],
)
def test_reserve_or_adopt__refuses_mismatched_lineage(
    store: Store, reserve: Reserve, mismatch: dict[str, Any]
) -> None:
    revision = cancelled_parent(store, reserve)
    cancelled_parent(store, reserve, "other-parent")
    store.reserve(**restart_args("parent", revision))
    args = restart_args("parent", revision)
    args.update(mismatch)
    refused(
        store, Conflict, "Workflow run preparation conflicts: child", lambda: store.reserve_or_adopt(**args)
    )


def test_reserve_or_adopt__adopts_from_a_store_without_a_project(
    store: Store, reserve: Reserve, open_at: Callable[..., Store]
) -> None:
    reserve()
    before = snapshot(store)
    prepared = open_at(None).reserve_or_adopt(**reserve_args())
    assert prepared.state == "adopted"
    assert prepared.run == store.get_run("run-1")
    assert snapshot(store) == before


def test_reserve_or_adopt__validates_like_reserve_before_looking(store: Store, reserve: Reserve) -> None:
    reserve()
    refused(
        store,
        InvalidInput,
        "Expected a SHA-256 digest",
        lambda: store.reserve_or_adopt(**reserve_args(definition_digest="nope")),
    )
    refused(
        store,
        InvalidInput,
        "Stored workflow source identity is invalid",
        lambda: store.reserve_or_adopt(**reserve_args(workflow_source={"kind": "builtin"})),
    )


def test_reserve_or_adopt__reserved_run_blocks_its_session_like_reserve(
    store: Store, reserve: Reserve
) -> None:
    assert store.reserve_or_adopt(**reserve_args("run-1")).state == "reserved"
    before = snapshot(store)
    with pytest.raises(SessionBusy):
        store.reserve_or_adopt(**reserve_args("run-2"))
    assert snapshot(store) == before
