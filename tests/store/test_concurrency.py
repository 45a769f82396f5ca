"""Claims under contention: racing threads, real processes, and takeover of a dead runner's runs.

SPEC §2.2 (BEGIN IMMEDIATE), §3.2 claimNext, §8 (host stop and recovery), §9 invariants 1, 2 and 4,
§11 items 82-83. Each thread or process opens its own store on the same database file.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tether.store import RunRecord, Store
from tether.values import now_ms

from .conftest import LEASE, at, reserve_args, rows, snapshot


def race(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` on ``count`` threads released together by a barrier; their results in order."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def main(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = work(index)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=main, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "a racing thread did not finish"
    assert not errors, errors
    return results


def claim_events(store: Store, run_id: str) -> list[tuple[Any, ...]]:
    return rows(
        store,
        "SELECT e.actor_id, e.lease_generation FROM events e JOIN runs r ON r.resource_id = e.resource_id "
        "WHERE r.run_id = ? AND e.event_type = 'lease.claimed' ORDER BY e.resource_revision",
        run_id,
    )


# -- racing threads ----------------------------------------------------------------------------


def test_race__two_claimers_of_one_run_exactly_one_wins(store: Store, open_at: Callable[..., Store]) -> None:
    runs = [f"run-{n}" for n in range(20)]
    with store.transaction():
        for n, run_id in enumerate(runs):
            store.reserve(**reserve_args(run_id, origin_session_id=f"session-{n}"))
    claimers = [open_at(), open_at()]
    for run_id in runs:

        def claim(i: int, run_id: str = run_id) -> RunRecord | None:
            return claimers[i].claim(
                run_id=run_id, runner_id=f"host-{i}", claim_token=f"tok-{i}", lease_ms=LEASE, now=at(10)
            )

        results = race(2, claim)
        winners = [i for i, record in enumerate(results) if record is not None]
        assert len(winners) == 1, (run_id, results)
        (winner,) = winners
        assert results[winner].claim_generation == 1
        assert results[winner].claim_token == f"tok-{winner}"
        assert store.verify_claim(run_id=run_id, claim_token=f"tok-{winner}", now=at(11))
        assert not store.verify_claim(run_id=run_id, claim_token=f"tok-{1 - winner}", now=at(11))
        assert claim_events(store, run_id) == [(f"host-{winner}", 1)]


def test_race__two_claimers_of_an_expired_run_exactly_one_takes_it_over(
    store: Store, open_at: Callable[..., Store], claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    claimers = [open_at(), open_at()]
    results = race(
        2,
        lambda i: claimers[i].claim(
            run_id="run-1", runner_id=f"host-{i}", claim_token=f"tok-{i}", lease_ms=LEASE, now=at(LEASE)
        ),
    )
    winners = [record for record in results if record is not None]
    assert len(winners) == 1
    assert winners[0].claim_generation == 2
    assert [g for _, g in claim_events(store, "run-1")] == [1, 2]


def test_race__claim_next_hands_each_run_to_one_runner(store: Store, open_at: Callable[..., Store]) -> None:
    runs = {f"run-{n:02d}" for n in range(40)}
    with store.transaction():
        for n, run_id in enumerate(sorted(runs)):
            store.reserve(**reserve_args(run_id, origin_session_id=f"session-{n}", now=at(n)))
    runners = [open_at() for _ in range(4)]

    def drain(index: int) -> list[str]:
        taken: list[str] = []
        while True:
            # A runner may re-claim its own runs; it excludes the ones it already holds.
            record = runners[index].claim_next(
                runner_id=f"host-{index}",
                claim_token=f"tok-{index}-{len(taken)}",
                lease_ms=LEASE,
                now=at(100),
                exclude_run_ids=taken,
            )
            if record is None:
                return taken
            taken.append(record.run_id)

    taken = race(4, drain)
    flat = [run_id for runner in taken for run_id in runner]
    assert sorted(flat) == sorted(runs)
    assert rows(store, "SELECT count(*) FROM leases WHERE generation = 1 AND owner_id IS NOT NULL") == [(40,)]
    assert rows(store, "SELECT count(*) FROM events WHERE event_type = 'lease.claimed'") == [(40,)]


def test_race__cancel_stale_and_a_takeover_claim_exactly_one_wins(
    store: Store, open_at: Callable[..., Store], claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    canceller, claimer = open_at(), open_at()
    results = race(
        2,
        lambda i: (
            canceller.cancel_stale(run_id="run-1", now=at(LEASE + 1))
            if i == 0
            else claimer.claim(
                run_id="run-1", runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(LEASE + 1)
            )
        ),
    )
    cancelled, record = results
    assert bool(cancelled) != (record is not None)
    (status,) = rows(store, "SELECT status FROM run_queue")
    assert status == (("cancelled",) if cancelled else ("starting",))
    (generation,) = rows(
        store, "SELECT generation FROM leases l JOIN runs r ON r.resource_id = l.resource_id"
    )
    assert generation == (2,)


# -- a dead runner's runs are taken over (host stop and recovery) ------------------------------


def test_recovery__a_crashed_hosts_runs_are_claimable_once_its_leases_expire(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    for n in range(3):
        reserve(f"run-{n}", origin_session_id=f"session-{n}", now=at(n))
    held: list[str] = []
    for n in range(3):
        record = store.claim_next(
            runner_id="host-a", claim_token=f"a-{n}", lease_ms=LEASE, now=at(10), exclude_run_ids=held
        )
        assert record is not None and record.run_id == f"run-{n}"
        held.append(record.run_id)
        assert store.mark_running(run_id=record.run_id, claim_token=f"a-{n}", now=at(10))
    # host-a stops heartbeating. Before its leases run out nobody else can take its runs.
    before = snapshot(store)
    assert (
        store.claim_next(runner_id="host-b", claim_token="b", lease_ms=LEASE, now=at(10 + LEASE - 1)) is None
    )
    assert snapshot(store) == before
    taken: list[RunRecord | None] = []
    for n in range(3):
        taken.append(
            store.claim_next(
                runner_id="host-b",
                claim_token=f"b-{n}",
                lease_ms=LEASE,
                now=at(10 + LEASE),
                exclude_run_ids=[r.run_id for r in taken if r is not None],
            )
        )
    assert [(r.run_id, r.status, r.claim_generation, r.runner_id) for r in taken if r is not None] == [
        (f"run-{n}", "starting", 2, "host-b") for n in range(3)
    ]
    # The crashed host's tokens are fenced: nothing it tries is written.
    before = snapshot(store)
    later = at(10 + LEASE + 5)
    for n in range(3):
        run_id, token = f"run-{n}", f"a-{n}"
        assert not store.renew(run_id=run_id, claim_token=token, lease_ms=LEASE, now=later)
        assert not store.mark_running(run_id=run_id, claim_token=token, now=later)
        assert not store.park(run_id=run_id, claim_token=token, now=later)
        assert not store.complete(run_id=run_id, claim_token=token, now=later)
        assert not store.fail(run_id=run_id, claim_token=token, error_code="e", error_message="x", now=later)
        assert not store.cancel(run_id=run_id, claim_token=token, now=later)
        assert not store.delete(run_id=run_id, claim_token=token, now=later)
        assert store.claim_authority(run_id, token) is None
    assert snapshot(store) == before


def test_recovery__a_renewed_claim_is_not_taken_over(store: Store, claimed: Callable[..., RunRecord]) -> None:
    claimed()
    assert store.renew(run_id="run-1", claim_token="tok-run-1", lease_ms=LEASE, now=at(LEASE - 1))
    before = snapshot(store)
    assert store.claim_next(runner_id="host-b", claim_token="b", lease_ms=LEASE, now=at(LEASE + 10)) is None
    assert (
        store.claim(run_id="run-1", runner_id="host-b", claim_token="b", lease_ms=LEASE, now=at(LEASE + 10))
        is None
    )
    assert snapshot(store) == before
    assert (
        store.claim_next(runner_id="host-b", claim_token="b", lease_ms=LEASE, now=at(2 * LEASE - 1))
        is not None
    )


def test_recovery__a_stopping_host_parks_so_another_claims_at_once(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    for n in range(2):
        reserve(f"run-{n}", origin_session_id=f"session-{n}", now=at(n))
        record = store.claim_next(
            runner_id="host-a",
            claim_token=f"a-{n}",
            lease_ms=LEASE,
            now=at(10),
            exclude_run_ids=["run-0"][:n],
        )
        assert record is not None and record.run_id == f"run-{n}"
        assert store.mark_running(run_id=record.run_id, claim_token=f"a-{n}", now=at(10))
    assert store.claim_next(runner_id="host-b", claim_token="b", lease_ms=LEASE, now=at(20)) is None
    for n in range(2):
        assert store.park(run_id=f"run-{n}", claim_token=f"a-{n}", now=at(20))
    first = store.claim_next(runner_id="host-b", claim_token="b-0", lease_ms=LEASE, now=at(20))
    second = store.claim_next(
        runner_id="host-b", claim_token="b-1", lease_ms=LEASE, now=at(20), exclude_run_ids=["run-0"]
    )
    assert first is not None and second is not None
    assert [(r.run_id, r.claim_generation, r.status) for r in (first, second)] == [
        ("run-0", 2, "starting"),
        ("run-1", 2, "starting"),
    ]


# -- real processes ----------------------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import json, random, sys, time, uuid

    from tether import open_store

    url, index, lease_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    stall, start_at = float(sys.argv[4]), float(sys.argv[5])
    store = open_store(url)
    runner = f"host-{index}"
    rng = random.Random(index)
    # Every process starts claiming at the same moment, so that they contend from the first claim.
    time.sleep(max(0.0, start_at - time.time()))
    stop = time.monotonic() + 12
    counts = {"claims": 0, "done": 0, "lost": 0}
    while time.monotonic() < stop:
        token = str(uuid.uuid4())
        record = store.claim_next(runner_id=runner, claim_token=token, lease_ms=lease_ms)
        if record is None:
            if not store.list_runs(statuses=["queued", "starting", "running", "parked"], limit=1):
                break
            time.sleep(0.002)
            continue
        counts["claims"] += 1
        # A stalled runner: its lease runs out and another process may take the run over, before
        # or after this runner reported it running.
        stalled = rng.random() < stall
        if stalled and rng.random() < 0.5:
            time.sleep(lease_ms * 1.5 / 1000)
        if not store.mark_running(run_id=record.run_id, claim_token=token):
            counts["lost"] += 1
            continue
        if stalled:
            time.sleep(lease_ms * 1.5 / 1000)
        if store.complete(run_id=record.run_id, claim_token=token):
            counts["done"] += 1
        else:
            counts["lost"] += 1
    store.close()
    print(json.dumps(counts))
    """
)


def parse_iso(value: str) -> int:
    moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


@pytest.mark.slow
def test_processes__four_runners_complete_every_run_exactly_once(store: Store, store_url: str) -> None:
    total, lease_ms = 200, 250
    start = datetime.fromtimestamp((now_ms() - 1_000) / 1000, UTC)
    with store.transaction():
        for n in range(total):
            store.reserve(**reserve_args(f"run-{n:03d}", origin_session_id=f"session-{n}", now=start))
    first_seq = store.last_event_seq()
    start_at = time.time() + 1.5
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, store_url, str(i), str(lease_ms), "0.03", str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    deadline = time.monotonic() + 20
    outputs = []
    for worker in workers:
        try:
            out, err = worker.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in workers:
                other.kill()
            pytest.fail("a runner process did not finish in time")
        assert worker.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1]))

    # Every run is done, exactly once, by the holder of its last claim.
    assert rows(store, "SELECT status, count(*) FROM run_queue GROUP BY status") == [("done", total)]
    assert sum(o["done"] for o in outputs) == total
    claims = sum(o["claims"] for o in outputs)
    assert rows(store, "SELECT count(*) FROM events WHERE event_type = 'lease.claimed'") == [(claims,)]
    assert sum(o["lost"] for o in outputs) == claims - total

    for (run_id,) in rows(store, "SELECT run_id FROM runs"):
        journal = rows(
            store,
            "SELECT e.event_seq, e.resource_revision, e.event_type, e.actor_id, e.lease_generation, "
            "COALESCE(e.payload, CAST(b.content AS TEXT)), e.recorded_at FROM events e "
            "JOIN runs r ON r.resource_id = e.resource_id LEFT JOIN blobs b ON b.blob_hash = e.payload_hash "
            "WHERE r.run_id = ? ORDER BY e.resource_revision",
            run_id,
        )
        # Commit order and revision order agree, and revisions are 1..current.
        assert [e[0] for e in journal] == sorted(e[0] for e in journal)
        assert [e[1] for e in journal] == list(range(1, len(journal) + 1))
        claimed = [e for e in journal if e[2] == "lease.claimed"]
        # Each claim raises the generation by exactly one.
        assert [e[4] for e in claimed] == list(range(1, len(claimed) + 1)), run_id
        (generation,) = rows(
            store,
            "SELECT l.generation FROM leases l JOIN runs r ON r.resource_id = l.resource_id "
            "WHERE r.run_id = ?",
            run_id,
        )[0]
        assert generation == len(claimed)
        # A claim is taken only once the previous one expired (no release happens before done).
        for previous, following in itertools.pairwise(claimed):
            assert following[6] >= parse_iso(json.loads(previous[5])["expiresAt"]), run_id
        # Every write under a claim carries the generation of the newest claim before it: a
        # superseded runner never wrote.
        holder = None
        for event in journal:
            if event[2] == "lease.claimed":
                holder = event[4]
            elif event[2] in ("run.queue_running", "run.queue_done"):
                assert event[4] == holder, (run_id, event)
        done = [e for e in journal if e[2] == "run.queue_done"]
        assert len(done) == 1 and done[0][4] == len(claimed), run_id
        assert journal[-1][2] == "run.queue_done"

    seqs = [
        s
        for (s,) in rows(store, "SELECT event_seq FROM events WHERE event_seq > ? ORDER BY rowid", first_seq)
    ]
    assert seqs == sorted(set(seqs))


def test_threads__a_writer_waits_for_another_threads_write_and_is_busy_past_the_timeout(
    tmp_path: Any,
) -> None:
    """Writers of one process take turns: a waiting write goes ahead once the other commits, and
    one kept waiting past the busy timeout is refused (StoreBusy) with nothing written."""
    from tether import open_store
    from tether.errors import StoreBusy

    store = open_store(f"sqlite:///{tmp_path}/threads.db?busy_timeout_ms=300")
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.transaction():
            store.reserve(**reserve_args("run-held", origin_session_id="s-held", now=at(0)))
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    before = snapshot(store)
    with pytest.raises(StoreBusy):
        store.reserve(**reserve_args("run-busy", origin_session_id="s-busy", now=at(1)))
    assert snapshot(store) == before
    waiter_done: list[RunRecord] = []
    waiter = threading.Thread(
        target=lambda: waiter_done.append(
            store.reserve(**reserve_args("run-after", origin_session_id="s-after", now=at(2)))
        )
    )
    waiter.start()
    release.set()
    holder.join(10)
    waiter.join(10)
    assert [r.run_id for r in waiter_done] == ["run-after"]
    assert store.get_run("run-held") is not None and store.get_run("run-busy") is None
    store.close()


def test_threads__a_first_transaction_goes_before_writers_that_waited_longer(tmp_path: Any) -> None:
    """A transaction opened with first=True (a runner's claims) goes ahead of the writers of the
    process already waiting; they still get their turns after it. (SQLite only: the writers of
    a PostgreSQL store do not take turns; they commit in parallel.)"""
    from tether import open_store

    from ..waiting import wait_until

    store = open_store(f"sqlite:///{tmp_path}/first.db")
    turns = store.db._writer  # type: ignore[attr-defined]
    holding, release = threading.Event(), threading.Event()
    order: list[str] = []

    def hold() -> None:
        with store.transaction():
            store.reserve(**reserve_args("run-held", origin_session_id="s-held", now=at(0)))
            holding.set()
            release.wait(10)

    def write(name: str, first: bool) -> None:
        with store.transaction(first=first):
            store.reserve(**reserve_args(f"run-{name}", origin_session_id=f"s-{name}", now=at(1)))
            order.append(name)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    writers = [threading.Thread(target=write, args=(f"other-{i}", False)) for i in range(2)]
    for writer in writers:
        writer.start()
    wait_until(lambda: turns.waiting == 2, what="two writers waiting")
    writers.append(threading.Thread(target=write, args=("claims", True)))
    writers[-1].start()
    wait_until(lambda: turns.waiting == 3, what="the first writer waiting too")
    release.set()
    for thread in [holder, *writers]:
        thread.join(10)
    assert order[0] == "claims" and sorted(order[1:]) == ["other-0", "other-1"]
    assert {r.run_id for r in store.list_runs()} == {"run-held", "run-claims", "run-other-0", "run-other-1"}
    store.close()


def test_threads__transaction_first_must_be_a_bool(store: Store) -> None:
    from tether.errors import InvalidInput

    before = snapshot(store)
    with pytest.raises(InvalidInput, match="first"), store.transaction(first="yes"):  # type: ignore[arg-type]
        store.reserve(**reserve_args("run-never"))
    assert snapshot(store) == before
