"""Workload 4: event latency, from the commit of an event to a follower of events_after seeing it.

A writer process appends events to a run's journal (``record_event``) at random intervals of 10 to
30 ms and notes the monotonic clock when each commit returned; a follower process runs the client's
``Tether.events(follow=True)`` (woken by the store's change notices: LISTEN/NOTIFY on PostgreSQL, a
``PRAGMA data_version`` poll of 2 ms growing to 20 ms on SQLite) and notes when each event arrives.
Both clocks are the machine's CLOCK_MONOTONIC, shared by processes.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    BenchError,
    child_env,
    latency_summary,
    pg_create,
    pg_drop,
    python,
    run_child,
    summary,
)
from bench.workloads import Config, error_text, store_url

TICK = "bench.tick"


def follower(url: str, count: int, ready: str) -> dict[str, Any]:
    from tether.client import Tether

    client = Tether(url)
    after = client.store.last_event_seq()
    seen: dict[int, float] = {}
    Path(ready).write_text("ready")
    for event in client.events(after, follow=True):
        if event.type == TICK and isinstance(event.payload, dict):
            seen[int(event.payload["i"])] = time.monotonic()
            if len(seen) >= count:
                break
    client.store.close()
    return {"seen": seen}


def writer(url: str, run_id: str, count: int, seed: int) -> dict[str, Any]:
    from tether.client import Tether

    client = Tether(url)
    rng = random.Random(seed)
    committed: list[float] = []
    for i in range(count):
        time.sleep(rng.uniform(0.01, 0.03))
        client.store.record_event(run_id=run_id, workflow_ref="workflow:noop", type=TICK, payload={"i": i})
        committed.append(time.monotonic())
    client.store.close()
    return {"committed": committed}


def _round(url: str, run_id: str, count: int, seed: int, folder: Path) -> list[float]:
    ready = folder / f"ready-{seed}"
    ready.unlink(missing_ok=True)
    args = json.dumps({"url": url, "count": count, "ready": str(ready)})
    follow = subprocess.Popen(
        [python(), "-m", "bench.worker", "call", "bench.workloads.events:follower", args],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if follow.poll() is not None or time.monotonic() > deadline:
                raise BenchError(
                    f"the follower did not start: {follow.stderr.read() if follow.stderr else ''}"
                )
            time.sleep(0.01)
        written = run_child(
            [
                "call",
                "bench.workloads.events:writer",
                json.dumps({"url": url, "run_id": run_id, "count": count, "seed": seed}),
            ],
            timeout=120 + count,
        )
        out, err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    if follow.returncode != 0:
        raise BenchError(f"the follower failed: {err[-2000:]}")
    seen = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])["seen"]
    return [(seen[str(i)] - at) * 1000 for i, at in enumerate(written["committed"])]


def _backend(config: Config, backend: str) -> dict[str, Any]:
    from bench.peers.tether_peer import workflow
    from tether.client import Tether

    folder = Path(config.workdir) / f"events-{backend}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    database = pg_create("events") if backend == "postgres" else None
    where = database if database is not None else str(folder / "events.db")
    url = store_url(backend, where)
    try:
        client = Tether(url, workflows=[workflow()])
        run_id = client.start("noop", run_id="events-run").run_id
        client.store.close()
        rounds = []
        for rep in range(max(1, config.reps)):
            latencies = _round(url, run_id, config.event_samples, rep + 1, folder)
            rounds.append(latency_summary(latencies))
            print(
                f"  events {backend} round {rep + 1}: p50 {rounds[-1]['p50_ms']:.1f} ms  "
                f"p99 {rounds[-1]['p99_ms']:.1f} ms",
                flush=True,
            )
        return {
            "p50_ms": summary([r["p50_ms"] for r in rounds]),
            "p99_ms": summary([r["p99_ms"] for r in rounds]),
            "events_per_round": config.event_samples,
            "rounds": rounds,
        }
    finally:
        if database is not None:
            pg_drop(database)
        shutil.rmtree(folder, ignore_errors=True)


def run(config: Config, pg_reason: str | None) -> dict[str, Any]:
    results: dict[str, Any] = {
        "follower": (
            "Tether.events(follow=True): re-reads events_after when the store's change notices wake it "
            "(PostgreSQL: LISTEN/NOTIFY; SQLite: PRAGMA data_version polled every 2 ms, up to 20 ms idle)"
        ),
        "writer": "record_event every 10-30 ms (random), one transaction each",
    }
    for backend in ("sqlite", "postgres"):
        if backend == "postgres" and pg_reason is not None:
            results[backend] = {"skipped": pg_reason}
            continue
        try:
            results[backend] = _backend(config, backend)
        except Exception as error:
            results[backend] = {"error": error_text(error)}
            print(f"  events {backend}: ERROR {results[backend]['error'][:300]}", flush=True)
    return results
