"""Where a Tether drain spends its time: transactions and statements per run, and a cProfile.

A child process starts ``runs`` no-op runs, then drains them with one Runner (the throughput
settings) in-process, with the store's connection layer counted (outermost write transactions =
commits, read transactions, statements by query name) and every runner thread under cProfile.
The profiler slows Python down, so its rate is not a throughput figure; the shares are the point.
"""

from __future__ import annotations

import collections
import cProfile
import json
import pstats
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import pg_create, pg_drop, run_child
from bench.workloads import Config, error_text, fill_runs, store_url


def _count(
    db: Any,
    counts: collections.Counter[str],
    timings: collections.Counter[str],
    calls: collections.Counter[str],
) -> None:
    """Wrap the connection layer's entry points on this instance to count what the store does:
    statements by query name (``counts``), and time and calls by call (``timings``, ``calls``;
    a call of several queries in one round trip under their names joined with ``+``)."""
    transaction = db.transaction

    @contextmanager
    def counted(*, write: bool = True, first: bool = False) -> Iterator[None]:
        outer = not db.in_transaction
        if outer:
            counts["write transactions (commits)" if write else "read transactions"] += 1
        started = time.perf_counter()
        with transaction(write=write, first=first):
            yield
        if outer:
            timings["write transactions" if write else "read transactions"] += time.perf_counter() - started

    db.transaction = counted
    # Only the outermost call counts (SQLite's queue and each call its run and all).
    inside = threading.local()
    for name in ("one", "all", "run", "queue", "expect", "run_many", "each"):
        original = getattr(db, name)

        def wrapper(*args: Any, _original: Any = original, _name: str = name, **params: Any) -> Any:
            if getattr(inside, "depth", 0):
                return _original(*args, **params)
            queries = [query for query, _ in args[0]] if _name == "each" else [args[0]]
            counts["statements"] += len(queries)
            for query in queries:
                counts["query " + query] += 1
            key = "+".join(queries)
            calls[key] += 1
            inside.depth = 1
            started = time.perf_counter()
            try:
                return _original(*args, **params)
            finally:
                inside.depth = 0
                timings["query " + key] += time.perf_counter() - started

        setattr(db, name, wrapper)
    if db.backend == "postgres":
        # Every exchange with the server (a BEGIN, a round trip of statements, a COMMIT) goes
        # through _pipeline; the profile runs in a child process of its own, so the class is
        # patched (BEGIN reaches it through the class).
        backend = type(db)
        send = backend._pipeline

        def counted_pipeline(*args: Any, **kwargs: Any) -> Any:
            counts["round trips"] += 1
            return send(*args, **kwargs)

        backend._pipeline = staticmethod(counted_pipeline)


#: The repository's folder: a file of the benchmark itself is named relative to it.
ROOT = str(Path(__file__).resolve().parents[2]) + "/"


def _label(key: tuple[str, int, str]) -> str:
    filename, line, function = key
    if filename == "~":
        return function
    if filename.startswith(ROOT + "bench/"):
        filename = filename[len(ROOT) :]
    for marker in ("/tether/", "/site-packages/", "/lib/python3"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{filename}:{line} {function}"


WAITING = "waiting (the claim loop idles while the run thread works; lock and sleep waits)"


def _area(key: tuple[str, int, str]) -> str:
    filename, _, function = key
    if "sqlite3.Connection" in function or "sqlite3.Cursor" in function:
        return "SQLite (C: statements, commits, fsync)"
    if "psycopg" in filename or "psycopg" in function:
        return "psycopg (PostgreSQL round trips)"
    if "/bench/workloads/" in filename or "/bench/peers/" in filename:
        return "the benchmark's own counting wrappers"
    if function in ("_complete_together", "_commit_group"):
        # Their own time is waiting, for another thread's group commit or for a claim under way:
        # cProfile does not see a lock taken by a ``with`` statement as a call of its own.
        return WAITING
    if "/tether/store/" in filename:
        return "tether.store (Python)"
    if "/tether/engine/" in filename:
        return "tether.engine (Python)"
    if "acquire" in function or "sleep" in function or "wait" in function:
        return WAITING
    if "json" in filename or "hashlib" in function or "sha256" in function:
        return "JSON and hashing"
    return "other Python"


class _Finished:
    """Counts node executions; stops the runner once ``target`` runs have executed."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.runner: Any = None
        self.lock = threading.Lock()

    def bump(self) -> None:
        with self.lock:
            self.count += 1
            if self.count >= self.target and self.runner is not None:
                self.runner.stop()


def profile_drain(url: str, runs: int, concurrency: int, poll_ms: int, backlog: int = 0) -> dict[str, Any]:
    """Drain ``runs`` runs; with a ``backlog``, that many more runs stay queued behind them (the
    runner stops after ``runs``), to show which costs grow with the size of the store."""
    from bench.peers import tether_peer
    from bench.peers.tether_peer import workflow
    from tether.client import Tether
    from tether.engine.runner import Runner, RunnerConfig

    client = Tether(url, workflows=[workflow()])
    fill_runs(client, "noop", runs + backlog, "prof")
    finished = _Finished(runs)
    tether_peer.COUNTER = finished  # type: ignore[assignment]
    counts: collections.Counter[str] = collections.Counter()
    timings: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    _count(client.store.db, counts, timings, calls)
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    class ProfiledRunner(Runner):
        def _execute(self, active: Any) -> None:
            profile = cProfile.Profile()
            profile.enable()
            try:
                super()._execute(active)
            finally:
                profile.disable()
                with lock:
                    profiles.append(profile)

    runner = ProfiledRunner(
        client.store, client.registry, config=RunnerConfig(concurrency=concurrency, poll_ms=poll_ms)
    )
    finished.runner = runner
    main = cProfile.Profile()
    started = time.perf_counter()
    main.enable()
    runner.run(stop_when=lambda: True)
    main.disable()
    seconds = time.perf_counter() - started
    stats = pstats.Stats(main)
    for profile in profiles:
        stats.add(profile)
    table: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    areas: collections.Counter[str] = collections.Counter()
    for key, row in table.items():
        areas[_area(key)] += row[2]
    # Shares of the work itself: time spent waiting is reported apart, not as a cost.
    waiting = areas.pop(WAITING, 0.0)
    own_total = sum(areas.values()) or 1.0
    working = [(key, row) for key, row in table.items() if _area(key) != WAITING]
    top = sorted(working, key=lambda item: item[1][2], reverse=True)[:15]
    connects = sum(row[1] for key, row in table.items() if "connect" in key[2] and "sqlite3" in key[2])
    client.store.close()
    queries = {k[6:]: v / runs for k, v in counts.most_common() if k.startswith("query ")}
    slowest = [(k[6:], v) for k, v in timings.most_common() if k.startswith("query ")][:8]
    return {
        "runs": runs,
        "backlog": backlog,
        "seconds_under_profiler": seconds,
        "per_run": {k: v / runs for k, v in counts.items() if not k.startswith("query ")},
        "ms_per_run_in_transactions": {
            k: v * 1000 / runs for k, v in timings.items() if not k.startswith("query ")
        },
        "top_queries_per_run": dict(list(queries.items())[:12]),
        "slowest_queries_ms_per_run": {
            name: {"ms_per_run": total * 1000 / runs, "calls_per_run": calls[name] / runs}
            for name, total in slowest
        },
        "own_time_share_by_area": {k: v / own_total for k, v in areas.most_common()},
        "waiting_seconds_per_run": waiting / runs,
        "sqlite_connections_opened_per_run": connects / runs,
        "top_functions_by_own_time": [
            {"function": _label(key), "calls_per_run": row[1] / runs, "share": row[2] / own_total}
            for key, row in top
        ],
    }


def run(config: Config, pg_reason: str | None) -> dict[str, Any]:
    results: dict[str, Any] = {"runner": config.runner}
    runs, backlog = config.profile_runs, config.profile_backlog
    cases = [
        ("sqlite FULL", "sqlite", "FULL", runs, 0),
        ("sqlite NORMAL", "sqlite", "NORMAL", runs, 0),
        (f"sqlite NORMAL, {backlog:,} more runs queued", "sqlite", "NORMAL", runs, backlog),
    ]
    if pg_reason is None:
        cases.append(("postgres", "postgres", "", max(10, runs // 5), 0))
    else:
        results["postgres"] = {"skipped": pg_reason}
    for name, backend, synchronous, count, behind in cases:
        folder = Path(config.workdir) / f"profile-{backend}-{synchronous}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        database = pg_create("profile") if backend == "postgres" else None
        where = database if database is not None else str(folder / "profile.db")
        try:
            args = {
                "url": store_url(backend, where, synchronous or "FULL"),
                "runs": count,
                "backlog": behind,
                "concurrency": config.runner["concurrency"],
                "poll_ms": config.runner["poll_ms"],
            }
            results[name] = run_child(
                ["call", "bench.workloads.profile:profile_drain", json.dumps(args)],
                timeout=600 + count + behind // 100,
            )
            per_run = results[name]["per_run"]
            slowest = next(
                iter(results[name]["slowest_queries_ms_per_run"].items()), ("-", {"ms_per_run": 0})
            )
            trips = f"{per_run['round trips']:.1f} round trips, " if "round trips" in per_run else ""
            print(
                f"  profile {name}: {per_run.get('write transactions (commits)', 0):.1f} commits, "
                f"{per_run.get('read transactions', 0):.1f} read transactions, {trips}"
                f"{per_run.get('statements', 0):.0f} statements per run; slowest query {slowest[0]} "
                f"{slowest[1]['ms_per_run']:.2f} ms per run",
                flush=True,
            )
        except Exception as error:
            results[name] = {"error": error_text(error)}
            print(f"  profile {name}: ERROR {results[name]['error'][:300]}", flush=True)
        finally:
            if database is not None:
                pg_drop(database)
            shutil.rmtree(folder, ignore_errors=True)
    return results
