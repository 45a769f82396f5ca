"""Reads: SPEC §3 record and view mapping, §3.2 reads (checklist items 21-27).

Reads never write: each read test checks the database is unchanged around the reads it makes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from tests.store.conftest import DIGEST, LEASE, SOURCE, T0, at, reserve_args, rows, snapshot
from tether.errors import InvalidInput
from tether.store import ListRevision, RunRecord, RunView, Store

T0_MS = int(T0.timestamp() * 1000)
Reserve = Callable[..., RunRecord]
Claimed = Callable[..., RunRecord]

FILE_SOURCE = {"kind": "file", "path": "flows/child.py", "hash": "h1"}
MOUNTED_SOURCE = {
    "root": SOURCE,
    "mounted": [{"mountPath": ["child"], "workflowName": "child", "source": FILE_SOURCE}],
}


def ids(runs: list[RunRecord] | list[RunView]) -> list[str]:
    return [run.run_id for run in runs]


def paused_waiting_run(store: Store, claimed: Claimed, run_id: str = "run-1") -> None:
    """A parked run that waits on its session's input, then paused by the control surface."""
    token = f"tok-{run_id}"
    claimed(run_id)
    store.set_run_status(run_id=run_id, claim_token=token, status="running", now=at(1))
    attempt = store.attempt_start(run_id=run_id, claim_token=token, node_id="ask", now=at(2))
    with store.transaction():
        store.request_open(
            run_id=run_id,
            claim_token=token,
            attempt_id=attempt.attempt_id,
            kind="input",
            payload={},
            now=at(3),
        )
        assert store.park(run_id=run_id, claim_token=token, now=at(3))
    assert store.pause_parked(run_id=run_id, now=at(4))


# -- 21. record mapping ----------------------------------------------------------------------


def test_get_run__returns_none_for_an_unknown_run(store: Store) -> None:
    assert store.get_run("ghost") is None
    assert store.get_run_view("ghost") is None


def test_record__shows_the_owner_even_after_its_lease_expired(store: Store, claimed: Claimed) -> None:
    claimed("run-1", now=0)
    expired = at(LEASE + 1)
    assert not store.verify_claim(run_id="run-1", claim_token="tok-run-1", now=expired)
    before = snapshot(store)
    record = store.get_run("run-1")
    assert record is not None
    assert record.runner_id == "host-a"
    assert record.claim_generation == 1
    assert record.claim_expires_at == at(LEASE)
    assert record.claim_token is None
    assert record.status == "running"
    assert record.started_at == T0
    assert record.finished_at is None
    assert snapshot(store) == before


def test_record__claim_fields_are_empty_when_unowned_though_the_generation_stays(
    store: Store, claimed: Claimed
) -> None:
    claimed("run-1")
    assert store.park(run_id="run-1", claim_token="tok-run-1", now=at(10))
    record = store.get_run("run-1")
    assert record is not None
    assert (record.runner_id, record.claim_generation, record.claim_expires_at) == (None, None, None)
    assert record.status == "parked"
    assert rows(store, "SELECT generation, owner_id FROM leases") == [(1, None)]

    second = store.claim(run_id="run-1", runner_id="runner-b", claim_token="tok-b", lease_ms=500, now=at(20))
    assert second is not None
    assert second.claim_token == "tok-b"
    assert (second.runner_id, second.claim_generation, second.claim_expires_at) == ("runner-b", 2, at(520))
    again = store.get_run("run-1")
    assert again is not None and again.claim_token is None and again.claim_generation == 2


def test_record__initialized_once_the_run_status_leaves_queued(store: Store, claimed: Claimed) -> None:
    claimed("run-1")
    record = store.get_run("run-1")
    assert record is not None and record.initialized is False
    store.set_run_status(run_id="run-1", claim_token="tok-run-1", status="running", now=at(5))
    record = store.get_run("run-1")
    assert record is not None and record.initialized is True


def test_record__maps_queue_error_and_times(store: Store, claimed: Claimed) -> None:
    claimed("run-1", now=100)
    message = "step exploded: " + "x" * 10_000
    assert store.fail(
        run_id="run-1", claim_token="tok-run-1", error_code="nodeFailed", error_message=message, now=at(300)
    )
    record = store.get_run("run-1")
    assert record is not None
    assert record.status == "failed"
    assert record.error_code == "nodeFailed"
    assert record.error_message == message
    assert record.created_at == T0
    assert record.started_at == at(100)
    assert record.updated_at == at(300)
    assert record.finished_at == at(300)
    assert (record.runner_id, record.claim_generation) == (None, None)


def test_record__shows_the_digest_in_lower_case_with_prefix(reserve: Reserve) -> None:
    record = reserve(definition_digest=DIGEST.removeprefix("sha256:").upper())
    assert record.definition_digest == DIGEST


def test_record__reads_mounts_with_snapshot_names(reserve: Reserve, store: Store) -> None:
    reserve(
        workflow_source=MOUNTED_SOURCE,
        definition_snapshot={"composition": {"mounts": [{"mountPath": ["child"], "workflowName": "Child"}]}},
    )
    record = store.get_run("run-1")
    assert record is not None
    assert record.workflow_source == {
        "root": SOURCE,
        "mounted": [{"mountPath": ["child"], "workflowName": "Child", "source": FILE_SOURCE}],
    }


# -- 22. view mapping ------------------------------------------------------------------------


def test_view__has_no_input_options_or_claim_fields() -> None:
    fields = {f.name for f in dataclasses.fields(RunView)}
    assert not fields & {"input", "launch_options", "runner_id", "claim_token", "claim_generation"}
    assert {"run_state_status", "paused"} <= fields


def test_view__maps_a_queued_run(store: Store, reserve: Reserve) -> None:
    record = reserve(workflow_source=MOUNTED_SOURCE)
    before = snapshot(store)
    view = store.get_run_view("run-1")
    assert view == RunView(
        run_id="run-1",
        workflow_name="demo",
        workflow_source_ref="builtin:demo",
        workflow_source={"root": SOURCE, "mounted": []},
        initialized=False,
        definition_digest=DIGEST,
        run_state_status="queued",
        paused=False,
        status="queued",
        origin_session_id="session-1",
        execution_mode="interactive",
        parent_run_id=None,
        root_run_id="run-1",
        lineage_kind=None,
        restart_number=0,
        parent_run_revision=None,
        error_code=None,
        error_message=None,
        created_at=T0,
        updated_at=T0,
        started_at=None,
        finished_at=None,
    )
    assert record.workflow_source["mounted"] != []
    assert snapshot(store) == before


def test_view__shows_paused_and_the_durable_status(store: Store, claimed: Claimed) -> None:
    paused_waiting_run(store, claimed)
    view = store.get_run_view("run-1")
    assert view is not None
    assert view.paused is True
    assert view.run_state_status == "waiting"
    assert view.status == "parked"
    assert view.initialized is True
    assert store.is_paused("run-1")


def test_view__shows_terminal_error_text_and_lineage(store: Store, reserve: Reserve) -> None:
    reserve("parent")
    assert store.cancel(run_id="parent", now=at(10))
    ((revision,),) = rows(store, "SELECT revision FROM resources WHERE aggregate_key = 'parent'")
    reserve("child", parent_run_id="parent", lineage_kind="restart", parent_run_revision=revision, now=at(20))
    parent = store.get_run_view("parent")
    child = store.get_run_view("child")
    assert parent is not None and child is not None
    assert (parent.status, parent.run_state_status) == ("cancelled", "cancelled")
    assert (parent.error_code, parent.error_message) == ("cancelled", "Workflow run cancelled")
    assert parent.finished_at == at(10)
    assert (child.parent_run_id, child.root_run_id, child.lineage_kind) == ("parent", "parent", "restart")
    assert (child.restart_number, child.parent_run_revision) == (1, revision)


# -- 23. list revision -----------------------------------------------------------------------


def test_list_revision__is_0_0_0_for_an_empty_store(store: Store) -> None:
    assert store.list_revision() == ListRevision(0, "0:0:0")
    page = store.list_run_views()
    assert (page.total, page.revision, page.runs) == (0, "0:0:0", [])


def test_list_revision__counts_revisions_and_the_newest_queue_change(store: Store, claimed: Claimed) -> None:
    store.reserve(**reserve_args("run-1", now=at(0)))
    store.reserve(**reserve_args("run-2", origin_session_id="session-2", now=at(5)))
    assert store.list_revision() == ListRevision(2, f"2:2:{T0_MS + 5}")
    claimed("run-1", now=10, running=False)
    assert store.list_revision() == ListRevision(2, f"2:3:{T0_MS + 10}")
    assert store.mark_running(run_id="run-1", claim_token="tok-run-1", now=at(12))
    assert store.list_revision().revision == f"2:4:{T0_MS + 12}"


def test_list_revision__is_unchanged_by_renew(store: Store, claimed: Claimed) -> None:
    claimed("run-1", now=0)
    revision = store.list_revision()
    assert store.renew(run_id="run-1", claim_token="tok-run-1", lease_ms=LEASE, now=at(1_000))
    assert store.list_revision() == revision
    assert store.list_run_views().revision == revision.revision


def test_list_revision__covers_every_project(store: Store, open_at: Callable[..., Store]) -> None:
    other = open_at("other")
    other.reserve(**reserve_args("run-o", now=at(7)))
    assert store.list_revision() == ListRevision(1, f"1:1:{T0_MS + 7}")
    assert ids(store.list_run_views().runs) == ["run-o"]


# -- 24. view list ---------------------------------------------------------------------------


@pytest.fixture
def three_runs(store: Store) -> list[str]:
    """Runs created at 0, 20, 10 ms (each with its own session): newest first is b, c, a."""
    for run_id, ms in (("a", 0), ("b", 20), ("c", 10)):
        store.reserve(**reserve_args(run_id, origin_session_id=f"s-{run_id}", now=at(ms)))
    return ["b", "c", "a"]


def test_list_run_views__newest_first_with_total_and_revision(store: Store, three_runs: list[str]) -> None:
    before = snapshot(store)
    page = store.list_run_views()
    assert ids(page.runs) == three_runs
    assert page.total == 3
    assert page.revision == store.list_revision().revision == f"3:3:{T0_MS + 20}"
    assert page.runs[0] == store.get_run_view("b")
    assert snapshot(store) == before


@pytest.mark.parametrize(
    ("offset", "limit", "expected"),
    [(0, 1, ["b"]), (1, 1, ["c"]), (1, 5, ["c", "a"]), (2, 2, ["a"]), (3, 1, []), (10, 10, [])],
)
def test_list_run_views__pages_by_offset_and_limit(
    store: Store, three_runs: list[str], offset: int, limit: int, expected: list[str]
) -> None:
    page = store.list_run_views(offset=offset, limit=limit)
    assert ids(page.runs) == expected
    assert page.total == 3


def test_list_run_views__orders_equal_creation_times_by_run_id(store: Store) -> None:
    for run_id in ("m", "z", "a"):
        store.reserve(**reserve_args(run_id, origin_session_id=f"s-{run_id}", now=at(0)))
    assert ids(store.list_run_views().runs) == ["z", "m", "a"]
    assert ids(store.list_runs()) == ["z", "m", "a"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"offset": -1}, "offset must be a whole number of at least 0"),
        ({"limit": 0}, "limit must be a whole number of at least 1"),
        ({"limit": 1.5}, "limit must be a whole number of at least 1"),
        ({"offset": True}, "offset must be a whole number of at least 0"),
    ],
)
def test_list_run_views__refuses_bad_paging(store: Store, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        store.list_run_views(**kwargs)
    assert caught.value.message == message


# -- 25. list_runs ---------------------------------------------------------------------------


@pytest.fixture
def mixed_runs(store: Store, claimed: Claimed) -> None:
    """queued 'q' (t=0), running 'r' (t=10), parked 'p' (t=20), cancelled 'x' (t=30)."""
    store.reserve(**reserve_args("q", origin_session_id="s-q", now=at(0)))
    store.reserve(**reserve_args("r", origin_session_id="s-r", now=at(10)))
    claimed("r", now=10)
    store.reserve(**reserve_args("p", origin_session_id="s-p", now=at(20)))
    claimed("p", now=20)
    assert store.park(run_id="p", claim_token="tok-p", now=at(21))
    store.reserve(**reserve_args("x", origin_session_id="s-x", now=at(30)))
    assert store.cancel(run_id="x", now=at(31))


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, ["x", "p", "r", "q"]),
        ({"statuses": []}, ["x", "p", "r", "q"]),
        ({"statuses": None}, ["x", "p", "r", "q"]),
        ({"statuses": ["queued"]}, ["q"]),
        ({"statuses": ["parked", "running"]}, ["p", "r"]),
        ({"statuses": ["done", "failed"]}, []),
        ({"exclude_run_ids": ["p", "q"]}, ["x", "r"]),
        ({"exclude_run_ids": []}, ["x", "p", "r", "q"]),
        ({"limit": 2}, ["x", "p"]),
        ({"limit": 0}, []),
        ({"statuses": ["queued", "running", "parked"], "exclude_run_ids": ["r"], "limit": 1}, ["p"]),
    ],
)
def test_list_runs__filters_newest_first(
    store: Store, mixed_runs: None, kwargs: dict[str, Any], expected: list[str]
) -> None:
    before = snapshot(store)
    found = store.list_runs(**kwargs)
    assert ids(found) == expected
    assert all(run == store.get_run(run.run_id) for run in found)
    assert snapshot(store) == before


def test_list_runs__refuses_an_unknown_status(store: Store) -> None:
    with pytest.raises(InvalidInput) as caught:
        store.list_runs(statuses=["bogus"])
    assert caught.value.message == "Unknown queue status: bogus"


def test_list_runs__is_scoped_to_the_stores_project_unless_global(
    store: Store, open_at: Callable[..., Store]
) -> None:
    other = open_at("other")
    store.reserve(**reserve_args("run-d", now=at(0)))
    other.reserve(**reserve_args("run-o", origin_session_id="session-2", now=at(5)))
    everything = open_at(None)
    assert ids(store.list_runs()) == ["run-d"]
    assert ids(other.list_runs()) == ["run-o"]
    assert ids(everything.list_runs()) == ["run-o", "run-d"]
    assert ids(everything.list_runs(statuses=["queued"], exclude_run_ids=["run-o"])) == ["run-d"]


def test_reads__are_not_project_scoped_except_list_runs(store: Store, open_at: Callable[..., Store]) -> None:
    other = open_at("other")
    other.reserve(**reserve_args("run-o"))
    assert store.get_run("run-o") is not None
    assert store.get_run_view("run-o") is not None
    assert store.find_session_reservation("session-1") is not None
    assert store.list_runs() == []


# -- 26. session reservation -----------------------------------------------------------------


def test_find_session_reservation__newest_non_terminal_interactive_run(
    store: Store, claimed: Claimed
) -> None:
    assert store.find_session_reservation("session-1") is None
    claimed("older", now=0)
    assert store.park(run_id="older", claim_token="tok-older", now=at(5))
    store.reserve(**reserve_args("newer", now=at(10)))
    store.reserve(**reserve_args("headless", execution_mode="headless", now=at(20)))
    store.reserve(**reserve_args("elsewhere", origin_session_id="session-2", now=at(30)))

    before = snapshot(store)
    found = store.find_session_reservation("session-1")
    assert found == store.get_run("newer")
    view = store.find_session_reservation_view("session-1")
    assert view == store.get_run_view("newer")
    assert snapshot(store) == before

    assert store.cancel(run_id="newer", now=at(40))
    found = store.find_session_reservation("session-1")
    assert found is not None and (found.run_id, found.status) == ("older", "parked")
    view = store.find_session_reservation_view("session-1")
    assert view is not None and view.run_id == "older"

    assert store.cancel(run_id="older", now=at(50))
    assert store.find_session_reservation("session-1") is None
    assert store.find_session_reservation_view("session-1") is None
    found = store.find_session_reservation("session-2")
    assert found is not None and found.run_id == "elsewhere"


def test_find_session_reservation__includes_claimed_runs(store: Store, claimed: Claimed) -> None:
    claimed("run-1", running=False)
    found = store.find_session_reservation("session-1")
    assert found is not None and found.status == "starting" and found.claim_token is None


# -- 27. project path ------------------------------------------------------------------------


def test_run_project_path__names_the_runs_project_or_none(
    store: Store, open_at: Callable[..., Store]
) -> None:
    other = open_at("projects/other")
    store.reserve(**reserve_args("run-d"))
    other.reserve(**reserve_args("run-o", origin_session_id="session-2"))
    assert store.run_project_path("run-d") == "default"
    assert store.run_project_path("run-o") == "projects/other"
    assert open_at(None).run_project_path("run-d") == "default"
    assert store.run_project_path("ghost") is None
