"""Kill inside a transaction: each write path runs in a child process that exits abruptly at every
instrumented point (after BEGIN, after each statement, before and after COMMIT) through the
store's own crash points (``TETHER_FAULT=<point>:<n>``, exit code 97).

The parent reopens the database after each crash: it must equal, table by table, either the
state before the call or the state a clean run of the same call leaves (the write happened
fully or not at all), the oracle must hold, and the store must take the call again.

Children are forked (cheap) and load the crash plan from TETHER_FAULT as a fresh process would;
their ids come from a seeded counter so that a clean run and a crashed one write identical rows.
A few real ``tether`` CLI processes prove the environment variable path end to end.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sqlite3
import subprocess
import sys
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.support import TETHER, clean_env
from tests.reliability import oracle
from tests.store.conftest import LEASE, at, reserve_args, snapshot
from tether import open_store, values
from tether.store import Store, faults
from tether.store import db as store_db

POINTS = ("begin", "statement", "before_commit", "after_commit")
TOKEN = "tok-crash-0000"


@dataclass(frozen=True)
class WritePath:
    name: str
    #: Brings a fresh store to the state the call needs.
    setup: Callable[[Store], None]
    #: The call under test.
    call: Callable[[Store], Any]


def claimed(store: Store, *, running: bool = True, started: bool = False) -> None:
    store.reserve(**reserve_args("run-1"))
    assert store.claim(run_id="run-1", runner_id="host-a", claim_token=TOKEN, lease_ms=LEASE, now=at(10))
    if running:
        assert store.mark_running(run_id="run-1", claim_token=TOKEN, now=at(11))
    if started:
        store.set_run_status(run_id="run-1", claim_token=TOKEN, status="running", now=at(12))


def with_effect(store: Store, *, begin: bool) -> None:
    claimed(store, started=True)
    effect = store.effect_enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="mail.send", idempotency_key="k1", now=at(20)
    )
    if begin:
        store.effect_begin(run_id="run-1", claim_token=TOKEN, effect_id=effect.effect_id, now=at(21))


def effect_id(store: Store) -> str:
    return store.effects(run_id="run-1")[0].effect_id


def finish(store: Store) -> bool:
    with store.transaction():
        store.set_run_status(run_id="run-1", claim_token=TOKEN, status="completed", now=at(100))
        return store.complete(run_id="run-1", claim_token=TOKEN, now=at(100))


def request_and_park(store: Store) -> bool:
    with store.transaction():
        attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="ask", now=at(100))
        store.request_open(
            run_id="run-1",
            claim_token=TOKEN,
            attempt_id=attempt.attempt_id,
            kind="input",
            payload={"prompt": "name?"},
            now=at(100),
        )
        return store.park(run_id="run-1", claim_token=TOKEN, now=at(100))


WRITE_PATHS = [
    WritePath("reserve", lambda s: None, lambda s: s.reserve(**reserve_args("run-1", now=at(100)))),
    WritePath(
        "claim",
        lambda s: s.reserve(**reserve_args("run-1")),
        lambda s: s.claim(run_id="run-1", runner_id="host-a", claim_token=TOKEN, lease_ms=LEASE, now=at(100)),
    ),
    WritePath(
        "claim_next_takeover",
        claimed,
        lambda s: s.claim_next(
            runner_id="host-b", claim_token="tok-crash-0001", lease_ms=LEASE, now=at(LEASE + 100)
        ),
    ),
    WritePath(
        "mark_running",
        lambda s: claimed(s, running=False),
        lambda s: s.mark_running(run_id="run-1", claim_token=TOKEN, now=at(100)),
    ),
    WritePath("park", claimed, lambda s: s.park(run_id="run-1", claim_token=TOKEN, now=at(100))),
    WritePath("complete", lambda s: claimed(s, started=True), finish),
    WritePath(
        "fail",
        lambda s: with_effect(s, begin=True),
        lambda s: s.fail(
            run_id="run-1", claim_token=TOKEN, error_code="boom", error_message="x", now=at(100)
        ),
    ),
    WritePath(
        "cancel",
        lambda s: with_effect(s, begin=True),
        lambda s: s.cancel(run_id="run-1", claim_token=TOKEN, now=at(100)),
    ),
    WritePath(
        "cancel_stale",
        lambda s: with_effect(s, begin=False),
        lambda s: s.cancel(run_id="run-1", now=at(LEASE + 100)),
    ),
    WritePath(
        "renew",
        claimed,
        lambda s: s.renew(run_id="run-1", claim_token=TOKEN, lease_ms=LEASE, now=at(100)),
    ),
    WritePath(
        "record_event",
        lambda s: s.reserve(**reserve_args("run-1")),
        lambda s: s.record_event(
            run_id="run-1", workflow_ref="builtin:demo", type="note", payload={"n": 1}, now=at(100)
        ),
    ),
    WritePath(
        "effect_enqueue",
        lambda s: claimed(s, started=True),
        lambda s: s.effect_enqueue(
            run_id="run-1", claim_token=TOKEN, effect_type="mail.send", idempotency_key="k1", now=at(100)
        ),
    ),
    WritePath(
        "effect_begin",
        lambda s: with_effect(s, begin=False),
        lambda s: s.effect_begin(run_id="run-1", claim_token=TOKEN, effect_id=effect_id(s), now=at(100)),
    ),
    WritePath(
        "effect_finish",
        lambda s: with_effect(s, begin=True),
        lambda s: s.effect_finish(
            run_id="run-1",
            claim_token=TOKEN,
            effect_id=effect_id(s),
            applied=True,
            result={"sent": True},
            now=at(100),
        ),
    ),
    WritePath("request_open+park", lambda s: claimed(s, started=True), request_and_park),
]


def deterministic_ids() -> None:
    """Every uuid4 and every ordered id's random bits the store draws come from a counter (the
    same sequence in every child)."""
    counter = itertools.count(1)
    uuid.uuid4 = lambda: uuid.UUID(int=next(counter))  # type: ignore[assignment]
    values.random_bits = lambda: next(counter)


def in_child(url: str, call: Callable[[Store], Any], plan: str | None, counts: Path | None = None) -> int:
    """Fork; the child loads the crash plan from TETHER_FAULT, opens the store and makes the call.
    Returns the child's exit status (97 when it crashed at the planned point)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            if plan is None:
                os.environ.pop("TETHER_FAULT", None)
            else:
                os.environ["TETHER_FAULT"] = plan
            faults._plan = faults._load()
            faults._hits = 0
            hits: dict[str, int] = dict.fromkeys(POINTS, 0)
            if counts is not None:
                real = store_db.fault_point

                def counting(name: str) -> None:
                    hits[name] += 1
                    real(name)

                store_db.fault_point = counting  # type: ignore[assignment]
            deterministic_ids()
            store = open_store(url)
            call(store)
            store.close()
            if counts is not None:
                counts.write_text(" ".join(f"{k}={v}" for k, v in hits.items()))
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def prepared_copy(base: Path, target: Path) -> str:
    shutil.copyfile(base, target)
    return f"sqlite:///{target}"


def build_base(path: Path, setup: Callable[[Store], None]) -> None:
    store = open_store(f"sqlite:///{path}")
    try:
        setup(store)
    finally:
        store.close()
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()


def history_for(state: dict[str, list[tuple[Any, ...]]]) -> oracle.History:
    return oracle.History(
        reserved={row[0] for row in state["runs"]},
        tokens={TOKEN, "tok-crash-0001"},
        drained=False,
        min_rejections=0,
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", WRITE_PATHS, ids=[p.name for p in WRITE_PATHS])
def test_kill_inside_a_transaction__the_write_happens_fully_or_not_at_all(
    path: WritePath, tmp_path: Path
) -> None:
    base = tmp_path / "base.db"
    build_base(base, path.setup)
    before_url = prepared_copy(base, tmp_path / "before.db")
    before_store = open_store(before_url)
    before = snapshot(before_store)
    before_store.close()

    clean = tmp_path / "clean.db"
    counts_file = tmp_path / "counts.txt"
    assert in_child(prepared_copy(base, clean), path.call, None, counts_file) == 0
    counts = {k: int(v) for k, v in (item.split("=") for item in counts_file.read_text().split())}
    clean_store = open_store(f"sqlite:///{clean}")
    after = snapshot(clean_store)
    oracle.check(clean_store, history_for(after))
    clean_store.close()
    assert after != before, f"{path.name} wrote nothing in a clean run"
    assert counts["begin"] >= 1 and counts["statement"] >= 1

    crashes = 0
    for point in POINTS:
        for n in range(1, counts[point] + 2):
            target = tmp_path / f"{point}-{n}.db"
            url = prepared_copy(base, target)
            status = in_child(url, path.call, f"{point}:{n}")
            if n > counts[point]:
                assert status == 0, f"{point}:{n} is past the last crash point, yet the child exited {status}"
                continue
            assert status == faults.EXIT_CODE, f"{point}:{n}: child exited {status}"
            crashes += 1
            store = open_store(url)
            try:
                state = snapshot(store)
                committed = point == "after_commit" and n == counts[point]
                expected, label = (after, "after a clean run") if committed else (before, "before the call")
                if state != expected:
                    changed = sorted(t for t in state if state[t] != expected.get(t))
                    pytest.fail(f"{path.name} crashed at {point}:{n}: tables {changed} differ from {label}")
                oracle.check(store, history_for(state))
                if not committed:
                    # The store takes the call again after the crash.
                    path.call(store)
                    assert snapshot(store) != before
            finally:
                store.close()
            target.unlink()
    assert crashes == sum(counts.values())


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_kill_inside_a_transaction__cli_start_with_tether_fault_is_atomic(point: str, tmp_path: Path) -> None:
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "flows.py").write_text(
        "from tether.engine.graph import Workflow, compute\n"
        "def step(ctx):\n    return 1\n"
        "solo = Workflow('solo', start='a', nodes=[compute('a', step)], edges={})\n"
    )
    url = f"sqlite:///{tmp_path}/cli.db"
    open_store(url).close()  # registers the project, so the CLI's only write is the reserve
    probe = open_store(url)
    before = snapshot(probe)
    probe.close()
    command = [str(TETHER), "--store", url, "--folder", str(folder), "start", "solo", "--run-id", "cli-1"]
    crashed = subprocess.run(
        command, env=clean_env(TETHER_FAULT=f"{point}:1"), capture_output=True, text=True, timeout=60
    )
    assert crashed.returncode == faults.EXIT_CODE, crashed.stderr
    store = open_store(url)
    try:
        state = snapshot(store)
        if point == "after_commit":
            assert store.get_run("cli-1") is not None
            oracle.check(store, oracle.History(reserved={"cli-1"}, drained=False, min_rejections=0))
        else:
            assert state == before
            oracle.check(store, oracle.History(drained=False, min_rejections=0))
    finally:
        store.close()
    again = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "cli-1"
