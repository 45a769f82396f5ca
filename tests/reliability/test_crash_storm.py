"""Crash storm: runner processes on one SQLite file, killed and frozen at random while they work.

A chaos driver SIGKILLs a random runner every few hundred milliseconds and starts a new one in its
place, and now and then SIGSTOPs one for longer than the lease and SIGCONTs it after its runs were
taken over (a holder that wakes after takeover). An operator settles what a crash leaves for a
person (an ambiguous effect: applied if the world shows it finished, else retried). After the
drain the oracle checks the database and everything the processes recorded.

The mix: three-step runs, runs with an effect, and a tenth of fan-out runs (a fan-out of eight
items, then two parallel branches; a fan-out whose items publish; or one whose items are outbox
effects). A fan-out run holds its slot about twice as long as a three-step run, so the CI size has
2,800 runs where it had 3,000 of steps and effects only, which keeps its time.

CI size: 8 runners and 2,800 runs, not the 5,000 the suite aims at: on the shared two-core machine
5,000 runs took 2.5 to 4.5 minutes depending on the load, 3,000 take 1.5 to 2.5. ``--soak`` or
``TETHER_SOAK=1`` runs 15,000 runs with ``synchronous=FULL``. CI uses ``synchronous=NORMAL``, which
loses nothing when a process dies (only a power cut can undo its last commits), and is faster.

``run_storm`` takes the store as a ``Storm``: the same harness drives a PostgreSQL database, with
database sessions ended under the runners and runs started during the storm
(``test_crash_storm_postgres.py``).
"""

from __future__ import annotations

import random
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.reliability import oracle
from tests.reliability.support import (
    CONNECTION_LOST,
    POOL_TIMEOUT,
    STORE_BUSY,
    Operator,
    PgSessions,
    WorkerPool,
    append_line,
    chunks,
    soak_report,
    unfinished,
)
from tests.reliability.workflows import (
    FAN_OUT_ITEMS,
    effectful,
    fanned,
    fanned_effects,
    fanned_publish,
    steps,
)
from tests.store.conftest import reserve_args, rows
from tether import open_store
from tether.client import Tether
from tether.engine.graph import Workflow
from tether.errors import CommitUnknown, StoreBusy

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Size:
    runners: int
    runs: int
    concurrency: int = 4
    lease_ms: int = 1500
    #: Random delay between two SIGKILLs (seconds).
    kill_every: tuple[float, float] = (0.3, 0.7)
    #: Random delay between two SIGSTOPs, and how long a stop lasts in leases.
    stop_every: tuple[float, float] = (2.0, 4.0)
    stop_leases: tuple[float, float] = (1.6, 2.6)
    #: Random delay between two ends of runner database sessions (PostgreSQL only; None: never).
    terminate_every: tuple[float, float] | None = None
    #: Longest time a node works (milliseconds), so kills land inside nodes too.
    work_ms: int = 20
    effect_share: float = 0.3
    #: Runs of a fan-out workflow (a third with two parallel branches after it, a third whose
    #: items publish, a third whose items are outbox effects), in place of as many three-step
    #: runs.
    fan_share: float = 0.1
    #: Chaos stops when this share of runs finished (or at the deadline); then the drain.
    chaos_until: float = 0.97
    chaos_seconds: float = 150
    drain_seconds: float = 90
    synchronous: str = "NORMAL"
    #: Stale tokens (issued, no longer holding their run) a zombie holder writes with after the
    #: drain, each of which must be refused; -1: every one.
    probes: int = 0
    #: Runs started while the storm goes on (not up front), ``feed_batch`` per transaction that
    #: also repeats the start of ``feed_repeat`` runs the runners hold; one batch per
    #: ``feed_every`` seconds.
    feed_runs: int = 0
    feed_batch: int = 25
    feed_repeat: int = 5
    feed_every: tuple[float, float] = (0.5, 1.5)
    #: How long the runners get to stop after the drain (SIGTERM) before they are killed.
    stop_timeout_s: float = 30


CI = Size(runners=8, runs=2800, chaos_seconds=150, drain_seconds=300)
SOAK = Size(runners=8, runs=15000, chaos_seconds=1200, drain_seconds=600, synchronous="FULL")


WORKFLOWS = {w.name: w for w in (steps, effectful, fanned, fanned_publish, fanned_effects)}


def pick_workflow(rng: random.Random, size: Size) -> Workflow:
    """A run's workflow: one draw per run, so that a seed's effectful runs are what they were."""
    draw = rng.random()
    if draw < size.effect_share:
        return effectful
    if draw < size.effect_share + size.fan_share / 3:
        return fanned
    if draw < size.effect_share + size.fan_share * 2 / 3:
        return fanned_publish
    if draw < size.effect_share + size.fan_share:
        return fanned_effects
    return steps


@dataclass
class Storm:
    """One store the storm runs on: the runners' URL, and what its backend lets the chaos do
    (stop a runner outside a write on the SQLite file; end its PostgreSQL sessions)."""

    url: str
    db: Path | None = None
    sessions: PgSessions | None = None


def reserve_all(client: Tether, size: Size, rng: random.Random) -> set[str]:
    ids = [f"storm-{n:05d}" for n in range(size.runs - size.feed_runs)]
    for batch in chunks(ids, 500):
        with client.store.transaction():
            for run_id in batch:
                client.start(pick_workflow(rng, size), {"work_ms": size.work_ms}, run_id=run_id)
    # Repeating a start adopts the run and writes nothing.
    for run_id in rng.sample(ids, 20):
        client.start(
            WORKFLOWS[client.store.get_run(run_id).workflow_name],  # type: ignore[union-attr]
            {"work_ms": size.work_ms},
            run_id=run_id,
        )
    return set(ids)


@dataclass
class Feeder:
    """A client that starts runs while the storm goes on, a batch per transaction that also
    repeats the start of runs the runners hold (adopting them writes nothing, but locks them): a
    transaction over several runs, which on PostgreSQL meets the runners' row locks and may get
    ``StoreBusy``; the batch is then retried whole (starts are idempotent by run id), as it is
    after ``CommitUnknown`` (a commit whose outcome the connection did not report)."""

    client: Tether
    size: Size
    pending: list[str]
    #: Its own random stream, so that the chaos schedule stays the seed's whatever it meets.
    rng: random.Random
    batches: int = 0
    busy: int = 0
    commit_unknown: int = 0
    adopted: int = 0

    def feed(self, reserved: set[str]) -> None:
        rng = self.rng
        if not self.pending:
            return
        batch = self.pending[: self.size.feed_batch]
        held = [
            run_id
            for (run_id,) in rows(
                self.client.store, "SELECT run_id FROM run_queue WHERE status IN ('starting', 'running')"
            )
        ]
        again = rng.sample(held, min(self.size.feed_repeat, len(held)))
        # Chosen once: a retry after CommitUnknown must repeat the same starts (or it conflicts).
        workflows = [pick_workflow(rng, self.size) for _ in batch]
        for _ in range(20):
            try:
                with self.client.store.transaction():
                    for run_id, workflow in zip(batch, workflows, strict=True):
                        self.client.start(workflow, {"work_ms": self.size.work_ms}, run_id=run_id)
                    for run_id in again:
                        name = self.client.store.get_run(run_id).workflow_name  # type: ignore[union-attr]
                        self.client.start(name, {"work_ms": self.size.work_ms}, run_id=run_id)
            except StoreBusy:
                self.busy += 1
                time.sleep(rng.uniform(0.01, 0.1))
                continue
            except CommitUnknown:
                self.commit_unknown += 1
                continue
            self.batches += 1
            self.adopted += len(again)
            reserved.update(batch)
            del self.pending[: len(batch)]
            return


def item_calls(history: oracle.History) -> int:
    """How many calls of fan-out items and parallel branches ran to their end in the world."""
    return sum(
        1
        for r in history.sink or ()
        if r.get("phase") in ("step", "end") and str(r.get("node_id", "")).endswith("]")
    )


def look_at_the_stragglers(store: Any, path: Path, at: float) -> None:
    """Append the unfinished runs (at most 50) with their queue row and lease to ``path``."""
    for run_id, status, code, available, owner, expires, generation, now in rows(
        store,
        "SELECT q.run_id, q.status, q.error_code, q.available_at, l.owner_id, l.expires_at, "
        "l.generation, CAST(? AS BIGINT) FROM run_queue q JOIN runs r ON r.run_id = q.run_id "
        "JOIN leases l ON l.resource_id = r.resource_id "
        "WHERE q.status NOT IN ('done', 'failed', 'cancelled') ORDER BY q.run_id LIMIT 50",
        int(time.time() * 1000),
    ):
        append_line(
            path,
            {
                "drain_s": round(at, 1),
                "run_id": run_id,
                "status": status,
                "code": code,
                "available_in_ms": None if available is None else available - now,
                "owner": owner,
                "expires_in_ms": None if expires is None else expires - now,
                "generation": generation,
            },
        )


def run_storm(
    base: Path, size: Size, seed: int, storm: Storm | None = None
) -> tuple[WorkerPool, oracle.Verdict, dict[str, Any]]:
    rng = random.Random(seed)
    if storm is None:
        db = base / "storm.db"
        storm = Storm(f"sqlite:///{db}?synchronous={size.synchronous}", db=db)
    records = base / "records"
    records.mkdir()
    pool = WorkerPool(
        storm.url,
        storm.db,
        records,
        lease_ms=size.lease_ms,
        concurrency=size.concurrency,
        sessions=storm.sessions,
        stop_timeout_s=size.stop_timeout_s,
    )
    sessions = storm.sessions
    operator = Operator(records)
    started = time.monotonic()
    store = open_store(storm.url)
    client = Tether(store, workflows=list(WORKFLOWS.values()))
    history = oracle.History(seed=seed, fan_out_items=dict(FAN_OUT_ITEMS))
    history.reserved = reserve_all(client, size, rng)
    fed = [f"storm-{n:05d}" for n in range(size.runs - size.feed_runs, size.runs)]
    feeder = Feeder(client, size, fed, random.Random(seed + 1))
    try:
        pool.start(size.runners)
        chaos_end = time.monotonic() + size.chaos_seconds
        next_kill = time.monotonic() + rng.uniform(*size.kill_every)
        next_stop = time.monotonic() + rng.uniform(*size.stop_every)
        # (Drawn only when used: a SQLite storm's schedule for a seed is what it always was.)
        next_cut = time.monotonic() + (rng.uniform(*size.terminate_every) if size.terminate_every else 0)
        next_feed = time.monotonic() + (feeder.rng.uniform(*size.feed_every) if size.feed_runs else 0)
        next_check = 0.0
        left = size.runs
        while time.monotonic() < chaos_end and (left > size.runs * (1 - size.chaos_until) or feeder.pending):
            now = time.monotonic()
            pool.wake()
            if now >= next_kill:
                pool.kill_one(rng)
                next_kill = now + rng.uniform(*size.kill_every)
            if now >= next_stop:
                pool.stop_one(rng, rng.uniform(*size.stop_leases) * size.lease_ms / 1000)
                next_stop = time.monotonic() + rng.uniform(*size.stop_every)
            if sessions is not None and size.terminate_every is not None and now >= next_cut:
                sessions.strike(rng, pool.workers)
                next_cut = time.monotonic() + rng.uniform(*size.terminate_every)
            if feeder.pending and now >= next_feed:
                feeder.feed(history.reserved)
                next_feed = time.monotonic() + feeder.rng.uniform(*size.feed_every)
            if now >= next_check:
                pool.respawn_dead()
                operator.act(store)
                left = unfinished(store) + len(feeder.pending)
                next_check = now + 0.5
            time.sleep(0.02)
        chaos_seconds = time.monotonic() - started
        left_after_chaos = unfinished(store) + len(feeder.pending)
        pool.wake(everyone=True)
        for _ in range(100):  # what the chaos left unstarted (nothing, unless it ran out of time)
            if not feeder.pending:
                break
            feeder.feed(history.reserved)
        drain_started = time.monotonic()
        drain_end = drain_started + size.drain_seconds
        next_look = 0.0
        while unfinished(store) and time.monotonic() < drain_end:
            pool.respawn_dead()
            operator.act(store)
            if time.monotonic() >= next_look:
                # What holds up the drain (records/drain.jsonl): for a failure's post-mortem.
                look_at_the_stragglers(store, records / "drain.jsonl", time.monotonic() - drain_started)
                next_look = time.monotonic() + 2
            time.sleep(0.2)
        drain_seconds = time.monotonic() - drain_started
    finally:
        stopping = time.monotonic()
        pool.shutdown()
        shutdown_seconds = time.monotonic() - stopping
        if sessions is not None:
            sessions.close()
    duration = time.monotonic() - started
    pool.history(history)
    from_runners = len(history.rejections)
    if size.probes:
        issued = history.issued
        if 0 < size.probes < len(issued):
            issued = rng.sample(issued, size.probes)
        history.rejections += oracle.probe_stale_tokens(store, issued)
    try:
        verdict = oracle.inspect(store, history)
        ((no_progress,),) = rows(
            store, "SELECT count(*) FROM events WHERE event_type = 'run.worker_no_progress'"
        )
    finally:
        store.close()
    woke_fenced = sum(
        1
        for r in history.rejections
        if r.get("pid") in pool.stopped_pids and (r.get("latest_generation") or 0) > r["generation"]
    )
    measured = {
        "runs": size.runs,
        "runners": size.runners,
        "kills": pool.kills,
        "stops": pool.stops,
        **(
            {}
            if sessions is None
            else {
                "session strikes": sessions.strikes,
                "sessions terminated": sessions.terminated,
                "sessions terminated inside a transaction": sessions.in_transaction,
                "runner processes cut off whole": sessions.runners_cut,
                "sessions ended under a frozen runner": sessions.frozen_in_transaction,
                "connection errors the runners logged": len(pool.log_lines(CONNECTION_LOST)),
                "StoreBusy (locked) the runners logged": len(pool.log_lines(STORE_BUSY)),
                "StoreBusy (no pooled connection in 30 s) the runners logged": len(
                    pool.log_lines(POOL_TIMEOUT)
                ),
            }
        ),
        **(
            {}
            if not size.feed_runs
            else {
                "runs started during the storm": size.feed_runs - len(feeder.pending),
                "start batches committed (runs held by runners adopted)": (
                    f"{feeder.batches} ({feeder.adopted})"
                ),
                "start batches refused StoreBusy (retried)": feeder.busy,
                "start batches of unknown commit outcome (retried)": feeder.commit_unknown,
            }
        ),
        "takeovers": verdict.counts.get("takeovers", 0),
        "interrupted nodes": verdict.counts.get("interrupted_takeovers", 0),
        "rejected stale attempts": verdict.counts.get("rejected_stale", 0),
        "rejected stale attempts by runners": from_runners,
        "rejected superseded attempts": verdict.counts.get("rejected_superseded", 0),
        "rejected after waking from SIGSTOP": woke_fenced,
        "stale tokens probed after the drain": len(history.rejections) - from_runners,
        "runs parked for no progress": int(no_progress),
        "runner processes started": pool.spawned,
        "runners that died by themselves": pool.deaths,
        "fan-out and parallel nodes checked": (
            verdict.counts.get("fan_outs_checked", 0) + verdict.counts.get("parallels_checked", 0)
        ),
        "items and branches completed": verdict.counts.get("items_completed", 0),
        "item and branch calls run again (a crash or takeover ended their try)": item_calls(history)
        - verdict.counts.get("items_completed", 0),
        "ambiguous effects": verdict.counts.get("effects_ever_ambiguous", 0),
        "operator: applied / retried / resumed": (
            f"{operator.applied} / {operator.retried} / {operator.resumed}"
        ),
        "done / failed / cancelled": (
            f"{verdict.counts.get('queue_done', 0)} / {verdict.counts.get('queue_failed', 0)} / "
            f"{verdict.counts.get('queue_cancelled', 0)}"
        ),
        "tracebacks in runner logs": pool.tracebacks(),
        "chaos seconds": round(chaos_seconds, 1),
        "runs left when the chaos stopped": left_after_chaos,
        "drain seconds": round(drain_seconds, 1),
        "shutdown seconds (runners killed after the SIGTERM grace)": (
            f"{shutdown_seconds:.1f} ({', '.join(pool.killed_at_shutdown) or 'none'})"
        ),
        "duration seconds": round(duration, 1),
    }
    print("crash storm measured:", measured)
    oracle.judge(verdict, history)
    return pool, verdict, measured


def test_crash_storm__every_run_ends_once_and_no_stale_write_is_accepted(
    tmp_path: Path, seed: int, soak: bool
) -> None:
    size = SOAK if soak else CI
    pool, verdict, measured = run_storm(tmp_path, size, seed)
    soak_report(
        "Crash storm",
        measured,
        [f"seed {seed}; {size.runners} runners x {size.concurrency} runs each, lease {size.lease_ms} ms."],
    )
    assert pool.kills > 0 and pool.stops > 0
    assert pool.deaths == 0, "a runner process died without being killed"
    assert verdict.counts["takeovers"] > 0, "no run was taken over: the storm did not bite"
    assert measured["rejected after waking from SIGSTOP"] > 0, "no holder woke after a takeover"
    assert verdict.counts["fan_outs_checked"] > 0 and verdict.counts["parallels_checked"] > 0
    assert measured["item and branch calls run again (a crash or takeover ended their try)"] > 0, (
        "no item ran again after a crash: the storm did not bite the fan-outs"
    )
    assert verdict.counts["queue_done"] + verdict.counts.get("queue_failed", 0) == size.runs


def test_runner_start__opening_a_store_while_another_process_writes_needs_no_write_lock(
    tmp_path: Path,
) -> None:
    """A runner that (re)starts during a storm opens the store while others hold the write lock:
    opening must not wait for that lock (past the busy timeout it would die before running)."""
    url = f"sqlite:///{tmp_path}/busy.db?busy_timeout_ms=200"
    open_store(url).close()
    holder = sqlite3.connect(tmp_path / "busy.db", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        store = open_store(url)
        try:
            assert store.list_runs() == []
            with pytest.raises(StoreBusy):
                store.reserve(**reserve_args("run-1"))
        finally:
            store.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store = open_store(url)
    store.reserve(**reserve_args("run-1"))
    oracle.check(store, oracle.History(reserved={"run-1"}, drained=False, min_rejections=0))
    store.close()
