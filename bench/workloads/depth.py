"""Workload 3: claim_next latency against queue depth, and beside a pile of finished runs.

Each queue is populated through the public store API in big transactions (bench/claim_depth.py's
``fill``). The finished pile: ``FINISHED_SEED`` runs reserved, claimed and completed through the
public API (many pairs per transaction), then copied in plain SQL, doubling, until it is at least
as large as asked. A copy is every row those runs have in every table (run, queue, lease,
resource, bindings, sources, journal events, viewer rows and deltas) under new run ids, with the
resource ids Tether derives from them: the same rows the API would have written, in minutes
instead of the hours that claiming and completing a million runs one by one takes. Then
``claim_next`` + ``complete`` pairs are timed (the claim alone) in several rounds; each round
gives a p50 and a p99, and the figures are the median, min and max over rounds. SQLite with
``synchronous=NORMAL`` (as bench/claim_depth.py), so the commit's fsync does not hide the claim's
own cost.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from bench.claim_depth import fill, measure
from bench.common import summary
from bench.workloads import Config, error_text


def finish_all(store: Any, batch: int = 2000) -> None:
    """Claim and complete every queued run, ``batch`` pairs per transaction."""
    while True:
        with store.transaction():
            for _ in range(batch):
                token = str(uuid.uuid4())
                record = store.claim_next(runner_id="host-bench", claim_token=token, lease_ms=60_000)
                if record is None:
                    return
                store.complete(run_id=record.run_id, claim_token=token)


#: Finished runs made through the public API before they are copied (see the module text).
FINISHED_SEED = 1000
#: Tables with one row per run, or several, keyed by ``run_id``.
_BY_RUN = ("run_sources", "run_bindings", "run_queue", "viewer_runs", "viewer_revisions")
#: Tables keyed by a run's resource id.
_BY_RESOURCE = ("resources", "leases", "events")


def copy_finished(path: Path, at_least: int) -> int:
    """Double the finished runs in the SQLite file at ``path`` until there are ``at_least``; how
    many there are then. Every run there must be finished (nothing else is in the file yet)."""
    import sqlite3

    from tether.store.journal import resource_id_for

    connection = sqlite3.connect(path, isolation_level=None)
    connection.create_function(
        "run_resource", 1, lambda run_id: resource_id_for("run", run_id), deterministic=True
    )
    columns = {
        table: [row[1] for row in connection.execute(f"PRAGMA table_info({table})")]
        for table in (*_BY_RUN, *_BY_RESOURCE, "runs")
    }
    renamed = {
        "run_id": "x.run_id || :suffix",
        "root_run_id": "x.root_run_id || :suffix",
        "parent_run_id": "x.parent_run_id || :suffix",
        "aggregate_key": "x.aggregate_key || :suffix",
        "event_id": "x.event_id || :suffix",
    }
    statements = []
    for table in _BY_RUN:
        listed = columns[table]
        chosen = ", ".join(renamed.get(c, f"x.{c}") for c in listed)
        statements.append(f"INSERT INTO {table}({', '.join(listed)}) SELECT {chosen} FROM {table} x")
    for table in _BY_RESOURCE:
        listed = [c for c in columns[table] if c != "event_seq"]  # a copied event is appended
        chosen = ", ".join(
            "run_resource(r.run_id || :suffix)" if c == "resource_id" else renamed.get(c, f"x.{c}")
            for c in listed
        )
        order = " ORDER BY x.event_seq" if table == "events" else ""
        statements.append(
            f"INSERT INTO {table}({', '.join(listed)}) SELECT {chosen} FROM {table} x "
            f"JOIN runs r ON r.resource_id = x.resource_id{order}"
        )
    listed = columns["runs"]
    chosen = ", ".join(
        "run_resource(x.run_id || :suffix)" if c == "resource_id" else renamed.get(c, f"x.{c}")
        for c in listed
    )
    # The runs themselves last: every statement above copies the rows of the runs there before
    # (this connection leaves foreign keys unchecked, as SQLite does unless told otherwise).
    statements.append(f"INSERT INTO runs({', '.join(listed)}) SELECT {chosen} FROM runs x")
    count = int(connection.execute("SELECT count(*) FROM run_queue").fetchone()[0])
    unfinished = connection.execute(
        "SELECT count(*) FROM run_queue WHERE status NOT IN ('done', 'failed', 'cancelled')"
    ).fetchone()[0]
    if unfinished:
        raise RuntimeError(f"{unfinished} runs are not finished: only finished runs are copied")
    for table in ("node_attempts", "attempt_active_intervals", "workflow_messages", "effects"):
        if connection.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone():
            raise RuntimeError(f"{table} has rows, which this copy does not copy")
    round_number = 0
    while count < at_least:
        round_number += 1
        connection.execute("BEGIN IMMEDIATE")
        for statement in statements:
            connection.execute(statement, {"suffix": f"~{round_number}"})
        connection.execute("COMMIT")
        count *= 2
    connection.close()
    return count


def _rounds(store: Any, samples: int, reps: int) -> dict[str, Any]:
    rounds = [measure(store, samples) for _ in range(reps)]
    return {
        "p50_ms": summary([r["p50_ms"] for r in rounds]),
        "p99_ms": summary([r["p99_ms"] for r in rounds]),
        "samples_per_round": samples,
    }


def run(config: Config) -> dict[str, Any]:
    from tether import open_store

    folder = Path(config.workdir) / "depth"
    folder.mkdir(parents=True, exist_ok=True)
    reps = max(1, config.reps)
    spare = config.depth_samples * reps
    cases: dict[str, Any] = {}
    skipped: list[str] = []
    for size in config.depth_sizes:
        name = f"queued_{size}"
        if size > config.depth_max:
            skipped.append(f"{name} (above --depth-max {config.depth_max})")
            continue
        path = folder / f"queued-{size}.db"
        try:
            store = open_store(f"sqlite:///{path}?synchronous=NORMAL")
            started = time.perf_counter()
            fill(store, "q", size + spare)
            populated = time.perf_counter() - started
            cases[name] = {"queued": size, "finished": 0, "populate_s": populated}
            cases[name].update(_rounds(store, config.depth_samples, reps))
            store.close()
        except Exception as error:
            cases[name] = {"error": error_text(error)}
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        print(f"  depth {name}: {_line(cases[name])}", flush=True)
    finished = min(config.depth_finished, config.depth_max)
    if finished < config.depth_finished:
        skipped.append(f"finished_{config.depth_finished} (above --depth-max; measured {finished})")
    name = f"finished_{finished}_queued_1000"
    path = folder / "finished.db"
    try:
        store = open_store(f"sqlite:///{path}?synchronous=NORMAL")
        started = time.perf_counter()
        fill(store, "f", min(finished, FINISHED_SEED))
        finish_all(store)
        made = copy_finished(path, finished)
        fill(store, "q", 1000 + spare)
        cases[name] = {"queued": 1000, "finished": made, "populate_s": time.perf_counter() - started}
        cases[name].update(_rounds(store, config.depth_samples, reps))
        store.close()
    except Exception as error:
        cases[name] = {"error": error_text(error)}
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    print(f"  depth {name}: {_line(cases[name])}", flush=True)
    base = next((c for c in cases.values() if "p99_ms" in c), None)
    for case in cases.values():
        if base is not None and "p99_ms" in case:
            case["p99_ratio_to_smallest"] = case["p99_ms"]["median"] / base["p99_ms"]["median"]
            case["p50_ratio_to_smallest"] = case["p50_ms"]["median"] / base["p50_ms"]["median"]
    return {"store": "sqlite synchronous=NORMAL", "cases": cases, "skipped": skipped}


def _line(case: dict[str, Any]) -> str:
    if "error" in case:
        return "ERROR " + case["error"][:300]
    return (
        f"p50 {case['p50_ms']['median']:.3f} ms  p99 {case['p99_ms']['median']:.3f} ms  "
        f"(populated in {case['populate_s']:.1f} s)"
    )
