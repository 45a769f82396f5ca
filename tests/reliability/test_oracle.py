"""The oracle catches what it promises to catch: each check fails on a database or a history
broken in exactly that way (a copy of one healthy database, damaged by hand)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability import oracle
from tests.reliability.support import TracingRunner
from tests.reliability.workflows import FAN_ITEMS, FAN_OUT_ITEMS, fanned
from tests.store.conftest import LEASE, at, reserve_args
from tether import open_store
from tether.client import Tether
from tether.engine.registry import Registry
from tether.engine.runner import RunnerConfig
from tether.store import Store

TOKEN_A, TOKEN_B, TOKEN_C = "tok-oracle-a", "tok-oracle-b", "tok-oracle-c"


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, oracle.History]:
    """Three finished runs: one taken over (with a refused stale write), one completed, one
    cancelled while an effect was applying."""
    path = tmp_path_factory.mktemp("oracle") / "healthy.db"
    store = open_store(f"sqlite:///{path}")
    for n in (1, 2, 3):
        store.reserve(**reserve_args(f"run-{n}", origin_session_id=f"session-{n}"))
    store.claim(run_id="run-1", runner_id="host-a", claim_token=TOKEN_A, lease_ms=LEASE, now=at(10))
    store.mark_running(run_id="run-1", claim_token=TOKEN_A, now=at(11))
    store.claim(run_id="run-1", runner_id="host-b", claim_token=TOKEN_B, lease_ms=LEASE, now=at(LEASE + 20))
    assert not store.mark_running(run_id="run-1", claim_token=TOKEN_A, now=at(LEASE + 21))
    store.set_run_status(run_id="run-1", claim_token=TOKEN_B, status="running", now=at(LEASE + 22))
    store.set_run_status(run_id="run-1", claim_token=TOKEN_B, status="completed", now=at(LEASE + 23))
    assert store.complete(run_id="run-1", claim_token=TOKEN_B, now=at(LEASE + 24))
    assert store.fail(run_id="run-2", error_code="x", error_message="y", now=at(30))
    store.claim(run_id="run-3", runner_id="host-c", claim_token=TOKEN_C, lease_ms=LEASE, now=at(40))
    effect = store.effect_enqueue(
        run_id="run-3", claim_token=TOKEN_C, effect_type="mail", idempotency_key="key-3", now=at(41)
    )
    store.effect_begin(run_id="run-3", claim_token=TOKEN_C, effect_id=effect.effect_id, now=at(42))
    assert store.cancel(run_id="run-3", claim_token=TOKEN_C, now=at(43))
    store.close()
    history = oracle.History(
        reserved={"run-1", "run-2", "run-3"},
        tokens={TOKEN_A, TOKEN_B, TOKEN_C},
        rejections=[
            {
                "op": "mark_running",
                "run_id": "run-1",
                "generation": 1,
                "current_generation": 2,
                "current_status": "starting",
                "expired": True,
                "still_live": False,
            }
        ],
        sink=[{"run_id": "run-3", "generation": 1, "node_id": "pub", "phase": "begin", "key": "key-3"}],
    )
    return path, history


def damaged(base: Path, tmp_path: Path, *statements: str) -> Store:
    copy = tmp_path / "damaged.db"
    shutil.copyfile(base, copy)
    connection = sqlite3.connect(copy)
    try:
        for statement in statements:
            connection.execute(statement)
        connection.commit()
    finally:
        connection.close()
    return open_store(f"sqlite:///{copy}")


def copy_history(history: oracle.History, **changes: object) -> oracle.History:
    fresh = oracle.History(
        reserved=set(history.reserved),
        tokens=set(history.tokens),
        rejections=list(history.rejections),
        sink=list(history.sink or []),
    )
    for name, value in changes.items():
        setattr(fresh, name, value)
    return fresh


RUN1 = "(SELECT resource_id FROM runs WHERE run_id = 'run-1')"
LAST1 = f"(SELECT max(resource_revision) FROM events WHERE resource_id = {RUN1})"

DAMAGE: list[tuple[str, list[str], Callable[[oracle.History], oracle.History], str]] = [
    ("a reserved run is lost", [], lambda h: copy_history(h, reserved={*h.reserved, "run-9"}), "lost"),
    (
        "a run nobody reserved",
        [],
        lambda h: copy_history(h, reserved={"run-1", "run-2"}),
        "no accepted reserve",
    ),
    (
        "a run is not finished after the drain",
        ["UPDATE run_queue SET status = 'running', finished_at = NULL WHERE run_id = 'run-2'"],
        copy_history,
        "not terminal after the drain",
    ),
    (
        "a second terminal transition",
        [
            "INSERT INTO events(event_id, resource_id, resource_revision, event_type, actor_type, "
            "recorded_at) "
            f"SELECT 'event-x', {RUN1}, {LAST1} + 1, 'run.queue_failed', 'system', 1",
            f"UPDATE resources SET revision = revision + 1 WHERE resource_id = {RUN1}",
        ],
        copy_history,
        "2 terminal transitions",
    ),
    (
        "an event after the terminal event",
        [
            "INSERT INTO events(event_id, resource_id, resource_revision, event_type, actor_type, "
            "recorded_at) "
            f"SELECT 'event-y', {RUN1}, {LAST1} + 1, 'note', 'system', 1",
            f"UPDATE resources SET revision = revision + 1 WHERE resource_id = {RUN1}",
        ],
        copy_history,
        "events after its terminal event",
    ),
    (
        "a write accepted from a superseded generation",
        [
            f"UPDATE events SET lease_generation = 1 WHERE resource_id = {RUN1} "
            "AND event_type = 'run.running' AND lease_generation = 2"
        ],
        copy_history,
        "accepted from generation 1 while generation 2 was current",
    ),
    (
        "a revision missing from a run's journal",
        [f"DELETE FROM events WHERE resource_id = {RUN1} AND resource_revision = 2"],
        copy_history,
        "are not exactly 1..",
    ),
    (
        "an effect left applying on a finished run",
        ["UPDATE effects SET status = 'applying'"],
        copy_history,
        "never classified",
    ),
    (
        "an effect applied twice that was never ambiguous",
        [
            "UPDATE effects SET status = 'applied'",
            "UPDATE events SET event_type = 'effect.applied' WHERE event_type = 'effect.ambiguous'",
        ],
        lambda h: copy_history(
            h, sink=[*(h.sink or []), *(h.sink or []), {**(h.sink or [])[0], "phase": "end"}]
        ),
        "never ambiguous",
    ),
    (
        "a cancelled effect that began in the world",
        ["UPDATE effects SET status = 'cancelled'"],
        copy_history,
        "silently applied",
    ),
    (
        "a raw claim token stored",
        [
            "INSERT INTO blobs(blob_hash, media_type, byte_length, content, created_at) "
            f"VALUES (randomblob(32), 'text/plain', {len(TOKEN_B)}, CAST('{TOKEN_B}' AS BLOB), 1)"
        ],
        copy_history,
        "raw claim token",
    ),
    (
        "a live claim refused",
        [],
        lambda h: copy_history(h, rejections=[{**h.rejections[0], "still_live": True}]),
        "refused a live claim",
    ),
    (
        "no stale attempt was refused",
        [],
        lambda h: copy_history(h, rejections=[]),
        "did not exercise fencing",
    ),
    (
        "a dangling foreign key",
        [
            "PRAGMA foreign_keys = OFF",
            "INSERT INTO run_sources VALUES ('run-404', '', 'builtin', 'x', '1')",
        ],
        copy_history,
        "dangling foreign keys",
    ),
]


def test_oracle__passes_the_healthy_database(healthy: tuple[Path, oracle.History], tmp_path: Path) -> None:
    base, history = healthy
    store = damaged(base, tmp_path)
    verdict = oracle.check(store, history)
    store.close()
    assert verdict.counts["rejected_superseded"] == 1
    assert verdict.counts["effect_ambiguous"] == 1


@pytest.mark.parametrize(("case", "statements", "edit", "expected"), DAMAGE, ids=[d[0] for d in DAMAGE])
def test_oracle__catches(
    healthy: tuple[Path, oracle.History],
    tmp_path: Path,
    case: str,
    statements: list[str],
    edit: Callable[[oracle.History], oracle.History],
    expected: str,
) -> None:
    base, history = healthy
    store = damaged(base, tmp_path, *statements)
    try:
        with pytest.raises(AssertionError, match=expected):
            oracle.check(store, edit(history))
    finally:
        store.close()


def test_oracle__catches_a_token_in_a_log(healthy: tuple[Path, oracle.History], tmp_path: Path) -> None:
    base, history = healthy
    log = tmp_path / "runner.log"
    log.write_text(f"renewing with {TOKEN_A}\n")
    store = damaged(base, tmp_path)
    try:
        with pytest.raises(AssertionError, match="raw claim token"):
            oracle.check(store, copy_history(history, logs=[log]))
    finally:
        store.close()


# -- fan-outs ----------------------------------------------------------------------------------------
FAN = "fan-1"


@pytest.fixture(scope="module")
def fanned_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, oracle.History]:
    """One run of the storm's fan-out workflow (a fan-out of eight items, then two parallel
    branches), run to its end by a runner in this process."""
    path = tmp_path_factory.mktemp("oracle") / "fanned.db"
    store = open_store(f"sqlite:///{path}")
    Tether(store, workflows=[fanned]).start(fanned, {}, run_id=FAN)
    runner = TracingRunner(store, Registry([fanned]), runner_id="oracle", config=RunnerConfig(poll_ms=10))
    runner.run(stop_when=lambda: store.get_run(FAN).status == "done")  # type: ignore[union-attr]
    store.close()
    return path, oracle.History(reserved={FAN}, min_rejections=0, fan_out_items=dict(FAN_OUT_ITEMS))


def replace_output(node_id: str, edit: Callable[[object], object]) -> Callable[[sqlite3.Connection], None]:
    """A damage: the completed attempt of ``node_id`` gets ``edit(its output)`` as its output."""

    def damage(connection: sqlite3.Connection) -> None:
        ((content,),) = connection.execute(
            "SELECT b.content FROM node_attempts a JOIN blobs b ON b.blob_hash = a.output_hash "
            "WHERE a.node_id = ? AND a.status = 'completed'",
            (node_id,),
        ).fetchall()
        data = json.dumps(edit(json.loads(content))).encode()
        blob = bytes(range(32))
        connection.execute(
            "INSERT INTO blobs(blob_hash, media_type, byte_length, content, created_at) "
            "VALUES (?, 'application/json', ?, ?, 1)",
            (blob, len(data), data),
        )
        connection.execute(
            "UPDATE node_attempts SET output_hash = ? WHERE node_id = ? AND status = 'completed'",
            (blob, node_id),
        )

    return damage


def statements(*sql: str) -> Callable[[sqlite3.Connection], None]:
    def damage(connection: sqlite3.Connection) -> None:
        for statement in sql:
            connection.execute(statement)

    return damage


ITEM_COMPLETED = (
    "(SELECT event_seq FROM events WHERE event_type = 'node.completed' AND payload LIKE '%\"each[3]\"%')"
)

FAN_DAMAGE: list[tuple[str, Callable[[sqlite3.Connection], None], str]] = [
    (
        "an item lost",
        statements("DELETE FROM node_attempts WHERE node_id = 'each[3]'"),
        "item 3 is in the output but never completed",
    ),
    (
        "an item completed twice",
        statements(
            "INSERT INTO node_attempts SELECT 'attempt-again', run_id, node_id, attempt_number, status, "
            "output_hash, exit_name, error_hash, timeout_ms, lease_generation, created_at, updated_at, "
            "started_at, finished_at FROM node_attempts WHERE node_id = 'each[2]'"
        ),
        r"each\[2\]: the item completed 2 times",
    ),
    (
        "an item accepted under another claim than it ran under",
        statements(
            "UPDATE node_attempts SET lease_generation = 2 WHERE node_id = 'each[5]'",
            "UPDATE events SET lease_generation = 2 WHERE event_type = 'node.completed' "
            "AND payload LIKE '%\"each[5]\"%'",
        ),
        "ran under generation 1 and was accepted under 2",
    ),
    (
        "an item recorded after its node completed",
        statements(f"UPDATE events SET event_seq = 100000 WHERE event_seq = {ITEM_COMPLETED}"),
        r"item\(s\) \['3'\] recorded after the node completed",
    ),
    (
        "the outputs out of item order",
        replace_output("each", lambda output: list(reversed(output))),  # type: ignore[call-overload]
        "output entry 0 is not item 0's output",
    ),
    (
        "an item missing from the output",
        replace_output("each", lambda output: output[:-1]),  # type: ignore[index]
        f"the output lists {FAN_ITEMS - 1} item",
    ),
    (
        "a branch recorded but not joined",
        replace_output("both", lambda output: {"left": output["left"]}),  # type: ignore[index]
        r"branch\(es\) \['right'\] recorded completed but not joined",
    ),
    (
        "a done run whose fan-out never completed",
        statements("DELETE FROM node_attempts WHERE node_id = 'each'"),
        "the run is done but its fan-out never completed",
    ),
]


def test_oracle__passes_a_healthy_fan_out(fanned_run: tuple[Path, oracle.History], tmp_path: Path) -> None:
    base, history = fanned_run
    store = damaged(base, tmp_path)
    try:
        verdict = oracle.check(store, history)
    finally:
        store.close()
    assert verdict.counts["fan_outs_checked"] == 1 and verdict.counts["parallels_checked"] == 1
    assert verdict.counts["items_completed"] == FAN_ITEMS + 2


@pytest.mark.parametrize(("case", "damage", "expected"), FAN_DAMAGE, ids=[d[0] for d in FAN_DAMAGE])
def test_oracle__catches_in_a_fan_out(
    fanned_run: tuple[Path, oracle.History],
    tmp_path: Path,
    case: str,
    damage: Callable[[sqlite3.Connection], None],
    expected: str,
) -> None:
    base, history = fanned_run
    copy = tmp_path / "damaged.db"
    shutil.copyfile(base, copy)
    connection = sqlite3.connect(copy)
    try:
        damage(connection)
        connection.commit()
    finally:
        connection.close()
    store = open_store(f"sqlite:///{copy}")
    try:
        with pytest.raises(AssertionError, match=expected):
            oracle.check(store, history)
    finally:
        store.close()
