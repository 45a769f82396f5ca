"""Workload 5: crash recovery. A worker holding ``recovery_runs`` runs is killed with kill -9; a
second worker, already running and idle, takes them over once their leases expire.

Reported: seconds from the kill until every run is done, against the configured lease; the lease
time that was left at the kill (the victim renews every lease/3, so between 2/3 and all of it);
the time from the last lease's expiry to the last run done (the takeover's own cost); and, run by
run, how late after its own lease expired the rescuer claimed it (the target: within one poll
interval for every run).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import BenchError, Worker, pg_create, pg_drop, summary
from bench.workloads import Config, Probe, error_text, fill_runs, store_url

VICTIM = False


def hold(ctx: Any) -> None:
    """The node: the victim's copy never returns (it is killed); the rescuer's returns at once."""
    while VICTIM:
        time.sleep(3600)


def workflow() -> Any:
    from tether.engine.graph import Workflow, compute

    return Workflow("hold", start="a", nodes=[compute("a", hold)])


def serve(
    url: str, runner_id: str, victim: bool, concurrency: int, lease_ms: int, poll_ms: int
) -> dict[str, Any]:
    """A worker process: prints ``ready``, waits for ``go``, runs a Runner until SIGTERM."""
    global VICTIM
    VICTIM = victim
    from tether.client import Tether
    from tether.engine.runner import Runner, RunnerConfig

    client = Tether(url, workflows=[workflow()])
    runner = Runner(
        client.store,
        client.registry,
        runner_id=runner_id,
        config=RunnerConfig(lease_ms=lease_ms, poll_ms=poll_ms, concurrency=concurrency),
    )
    runner.install_signal_handlers()
    print("ready", flush=True)
    if sys.stdin.readline().strip() == "go":
        runner.run()
    client.store.close()
    return {}


def _worker(url: str, runner_id: str, victim: bool, config: Config) -> Worker:
    args = {
        "url": url,
        "runner_id": runner_id,
        "victim": victim,
        "concurrency": config.recovery_runs,
        "lease_ms": config.recovery_lease_ms,
        "poll_ms": 50,
    }
    worker = Worker(["call", "bench.workloads.recovery:serve", json.dumps(args)])
    worker.wait_ready(120)
    worker.go()
    return worker


def _wait(probe: Probe, sql: str, target: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while probe.value(sql) < target:
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: only {probe.value(sql)} of {target} after {timeout:.0f} s")
        time.sleep(0.01)


def _once(config: Config, backend: str, rep: int) -> dict[str, Any]:
    from tether.client import Tether

    folder = Path(config.workdir) / f"recovery-{backend}-{rep}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    database = pg_create("recovery") if backend == "postgres" else None
    where = database if database is not None else str(folder / "recovery.db")
    url = store_url(backend, where)
    probe = Probe(backend, where)
    n = config.recovery_runs
    workers: list[Worker] = []
    try:
        client = Tether(url, workflows=[workflow()])
        fill_runs(client, "hold", n, "held")
        client.store.close()
        victim = _worker(url, "host-bench-victim", True, config)
        workers.append(victim)
        _wait(probe, "SELECT count(*) FROM run_queue WHERE status = 'running'", n, 120, "victim claims")
        rescuer = _worker(url, "host-bench-rescuer", False, config)
        workers.append(rescuer)
        time.sleep(0.2)
        expiry = probe.value("SELECT max(expires_at) FROM leases WHERE owner_id LIKE 'host-bench-victim#%'")
        killed_wall = time.time() * 1000
        started = time.perf_counter()
        victim.kill9()
        # The victim renews no more: these are the expiries the rescuer waits for, run by run.
        expiries = probe.pairs(
            "SELECT resource_id, expires_at FROM leases WHERE owner_id LIKE 'host-bench-victim#%'"
        )
        first_takeover = None
        deadline = started + config.recovery_lease_ms / 1000 * 4 + 120
        done_sql = "SELECT count(*) FROM run_queue WHERE status = 'done'"
        while True:
            done = probe.value(done_sql)
            if first_takeover is None and probe.value(
                "SELECT count(*) FROM leases WHERE owner_id LIKE 'host-bench-rescuer#%'"
            ):
                first_takeover = time.perf_counter() - started
            if done >= n:
                break
            if time.perf_counter() > deadline or not rescuer.alive():
                raise BenchError(
                    f"takeover incomplete: {done} of {n} done; rescuer exit status "
                    f"{rescuer.process.poll()}; {rescuer.stderr_tail()}"
                )
            time.sleep(0.01)
        seconds = time.perf_counter() - started
        done_wall = time.time() * 1000
        claimed = probe.pairs(
            "SELECT resource_id, min(recorded_at) FROM events WHERE event_type = 'lease.claimed' "
            "AND actor_id LIKE 'host-bench-rescuer#%' GROUP BY resource_id"
        )
        late = sorted(claimed[r] - expiry for r, expiry in expiries.items() if r in claimed)
        if len(late) < n:
            raise BenchError(f"only {len(late)} of {n} runs' takeovers were found in the journal")
        return {
            "claimed_after_expiry_ms": {"max": late[-1], "p50": late[len(late) // 2]},
            "seconds": seconds,
            "first_takeover_s": first_takeover if first_takeover is not None else seconds,
            "lease_left_at_kill_ms": expiry - killed_wall,
            "after_last_expiry_ms": done_wall - expiry,
        }
    finally:
        for worker in workers:
            if worker.alive():
                worker.stop()
        if database is not None:
            pg_drop(database)
        shutil.rmtree(folder, ignore_errors=True)


def run(config: Config, pg_reason: str | None) -> dict[str, Any]:
    results: dict[str, Any] = {
        "runs": config.recovery_runs,
        "lease_ms": config.recovery_lease_ms,
        "runner": {"concurrency": config.recovery_runs, "poll_ms": 50, "renew": "lease/3"},
    }
    for backend in ("sqlite", "postgres"):
        if backend == "postgres" and pg_reason is not None:
            results[backend] = {"skipped": pg_reason}
            continue
        rounds = []
        try:
            for rep in range(max(1, config.reps)):
                rounds.append(_once(config, backend, rep))
                print(
                    f"  recovery {backend} rep {rep + 1}: all {config.recovery_runs} done "
                    f"{rounds[-1]['seconds']:.2f} s after kill -9 (lease {config.recovery_lease_ms} ms, "
                    f"{rounds[-1]['after_last_expiry_ms']:.0f} ms after the last lease expired)",
                    flush=True,
                )
        except Exception as error:
            results[backend] = {"error": error_text(error)}
            print(f"  recovery {backend}: ERROR {results[backend]['error'][:300]}", flush=True)
            continue
        results[backend] = {
            "seconds": summary([r["seconds"] for r in rounds]),
            "ratio_to_lease": summary([r["seconds"] * 1000 / config.recovery_lease_ms for r in rounds]),
            "first_takeover_s": summary([r["first_takeover_s"] for r in rounds]),
            "lease_left_at_kill_ms": summary([r["lease_left_at_kill_ms"] for r in rounds]),
            "after_last_expiry_ms": summary([r["after_last_expiry_ms"] for r in rounds]),
            "claimed_after_expiry_max_ms": summary([r["claimed_after_expiry_ms"]["max"] for r in rounds]),
            "claimed_after_expiry_p50_ms": summary([r["claimed_after_expiry_ms"]["p50"] for r in rounds]),
        }
    return results
