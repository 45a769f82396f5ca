"""Journal tailing under concurrency: appender threads and an appender process commit events with
random delays inside their transactions (a commit that lands late), while readers follow
``events_after`` from their last sequence number. No reader misses an event or sees one twice,
and each run's events arrive in revision order. Runs on every backend of the contract suite.
"""

from __future__ import annotations

import random
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.reliability import oracle
from tests.reliability.support import PYTHON, REPO, soak_report
from tests.store.conftest import LEASE, at, reserve_args, rows
from tether import open_store
from tether.errors import StoreBusy

PROCESS_APPENDER = """
import random, sys, time
from tether import open_store
url, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
store = open_store(url)
from tether.errors import StoreBusy
for i in range(count):
    run_id, delay = f"tail-{rng.randrange(6)}", rng.uniform(0, 0.004)
    while True:
        try:
            with store.transaction():
                store.record_event(run_id=run_id, workflow_ref="builtin:demo",
                                   type="tail.process", payload={"writer": "process", "i": i})
                time.sleep(delay)
            break
        except StoreBusy:  # nothing was written: retry, as the error says
            print("busy", flush=True)
    time.sleep(rng.uniform(0, 0.002))
store.close()
"""


@pytest.mark.slow
def test_journal_tail__concurrent_appenders_no_event_missed_or_seen_twice(
    store_url: str, seed: int, soak: bool, tmp_path: Path
) -> None:
    rng = random.Random(seed)
    # PostgreSQL resolves each deadlock between appenders after deadlock_timeout (1 s by default).
    per_writer = 600 if soak else (120 if store_url.startswith("sqlite") else 40)
    store = open_store(store_url)
    runs = [f"tail-{n}" for n in range(6)]
    with store.transaction():
        for n, run_id in enumerate(runs):
            store.reserve(**reserve_args(run_id, origin_session_id=f"session-{n}", now=at(n)))
    store.reserve(**reserve_args("fenced", origin_session_id="session-f", now=at(0)))
    history = oracle.History(seed=seed, reserved={*runs, "fenced"})
    done = threading.Event()
    errors: list[BaseException] = []
    busy: list[int] = []

    def appender(index: int) -> None:
        local = random.Random(seed * 31 + index)
        own = open_store(store_url)
        try:
            for i in range(per_writer):
                targets = [local.choice(runs) for _ in range(local.choice((1, 1, 2)))]
                delay = local.uniform(0, 0.003)
                while True:
                    try:
                        with own.transaction():
                            for run_id in targets:
                                own.record_event(
                                    run_id=run_id,
                                    workflow_ref="builtin:demo",
                                    type="tail.thread",
                                    payload={"writer": index, "i": i},
                                )
                            # Hold the transaction open a little: this commit lands late.
                            time.sleep(delay)
                        break
                    except StoreBusy:  # nothing was written: retry, as the error says
                        busy.append(index)
                time.sleep(local.uniform(0, 0.002))
        except BaseException as error:
            errors.append(error)
        finally:
            own.close()

    def fencer() -> None:
        """Claims and takeovers on one run, with writes from superseded holders in between."""
        own = open_store(store_url)
        try:
            for i in range(per_writer // 10):
                old, new = f"tok-f-{i}-a", f"tok-f-{i}-b"
                base = i * 3 * LEASE
                assert own.claim(
                    run_id="fenced", runner_id="host-a", claim_token=old, lease_ms=LEASE, now=at(base)
                )
                assert own.mark_running(run_id="fenced", claim_token=old, now=at(base + 1))
                taken = own.claim(
                    run_id="fenced", runner_id="host-b", claim_token=new, lease_ms=LEASE, now=at(base + LEASE)
                )
                assert taken is not None
                history.tokens |= {old, new}
                # An effect caught applying: its entries go to the same feed, under the run.
                effect = own.effect_enqueue(
                    run_id="fenced",
                    claim_token=new,
                    effect_type="mail",
                    idempotency_key=f"k-{i}",
                    now=at(base + LEASE),
                )
                for move in (own.effect_begin, own.effect_mark_ambiguous):
                    move(run_id="fenced", claim_token=new, effect_id=effect.effect_id, now=at(base + LEASE))
                # The superseded holder wakes up and tries to write.
                accepted = own.mark_running(run_id="fenced", claim_token=old, now=at(base + LEASE + 1))
                history.rejections.append(
                    {
                        "op": "mark_running",
                        "run_id": "fenced",
                        "generation": taken.claim_generation - 1,
                        "current_generation": taken.claim_generation,
                        "current_status": "starting",
                        "expired": True,
                        "still_live": False,
                        "accepted_stale": accepted,
                    }
                )
                assert own.park(run_id="fenced", claim_token=new, now=at(base + LEASE + 2))
                time.sleep(local_delay())
        except BaseException as error:
            errors.append(error)
        finally:
            own.close()

    def local_delay() -> float:
        return rng.uniform(0, 0.005)

    seen: list[Any] = []
    per_run_seen: list[Any] = []

    def reader(limits: tuple[int, ...]) -> None:
        own = open_store(store_url)
        after, calm = 0, 0
        try:
            while True:
                batch = own.events_after(after, limit=rng.choice(limits))
                for event in batch:
                    seen.append((event.seq, event.run_id, event.type, event.payload))
                    after = event.seq
                if batch:
                    calm = 0
                    continue
                if done.is_set():
                    calm += 1
                    if calm > 3:
                        return
                time.sleep(0.001)
        except BaseException as error:
            errors.append(error)
        finally:
            own.close()

    def run_reader() -> None:
        own = open_store(store_url)
        after = 0
        try:
            while True:
                batch = own.events_after(after, limit=5, run_id="tail-0")
                per_run_seen.extend((e.seq, e.type) for e in batch)
                after = batch[-1].seq if batch else after
                if not batch and done.is_set():
                    return
                time.sleep(0.001)
        except BaseException as error:
            errors.append(error)
        finally:
            own.close()

    process = subprocess.Popen(
        [str(PYTHON), "-c", PROCESS_APPENDER, store_url, str(per_writer), str(seed)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    writers = [threading.Thread(target=appender, args=(i,)) for i in range(3)]
    writers.append(threading.Thread(target=fencer))
    readers = [threading.Thread(target=reader, args=((1, 3, 100),)), threading.Thread(target=run_reader)]
    for thread in [*writers, *readers]:
        thread.start()
    for thread in writers:
        thread.join(120)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0
    busy.extend([-1] * output.split().count("busy"))
    done.set()
    for thread in readers:
        thread.join(60)
    assert not errors, errors
    assert not any(t.is_alive() for t in [*writers, *readers])

    journal = store.events_after(0, limit=1_000_000)
    seqs = [s for s, *_ in seen]
    assert seqs == sorted(set(seqs)), "the reader saw an event twice or out of order"
    assert seqs == [e.seq for e in journal], "the reader missed events"
    expected = {("thread", w, i) for w in range(3) for i in range(per_writer)} | {
        ("process", "process", i) for i in range(per_writer)
    }
    appended = [
        ("thread" if t == "tail.thread" else "process", p["writer"], p["i"])
        for _, _, t, p in seen
        if t.startswith("tail.")
    ]
    assert expected <= set(appended)
    assert per_run_seen == [(e.seq, e.type) for e in journal if e.run_id == "tail-0"]
    # The feed is the whole journal, effects' entries included.
    assert seqs == [s for (s,) in rows(store, "SELECT event_seq FROM events ORDER BY event_seq")]
    ambiguous = [p["effectId"] for _, r, t, p in seen if t == "effect.ambiguous" and r == "fenced"]
    assert len(set(ambiguous)) == len(ambiguous) == per_writer // 10

    # The drain: every run ends (the fenced run's last holder parked it, its lease is free).
    for run_id in [*runs, "fenced"]:
        assert store.cancel(run_id=run_id)
    history.accepted_terminals.update([*runs, "fenced"])
    verdict = oracle.check(store, history)
    counts = {
        "events": verdict.counts["events"],
        "events seen by the follower": len(seen),
        "rejected stale attempts": verdict.counts.get("rejected_stale", 0),
        "transactions retried after StoreBusy": len(busy),
    }
    print("journal tail:", counts)
    soak_report("Journal tailing", counts, [f"seed {seed}; backend {store.db.backend}."])
    store.close()
