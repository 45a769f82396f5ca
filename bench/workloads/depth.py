"""Workload 3: claim_next latency against queue depth, and beside a pile of finished runs.

Each queue is populated through the public store API in big transactions (bench/claim_depth.py's
``fill``); the finished pile is claimed and completed through the public API too, many pairs per
transaction. Then ``claim_next`` + ``complete`` pairs are timed (the claim alone) in several
rounds; each round gives a p50 and a p99, and the figures are the median, min and max over rounds.
SQLite with ``synchronous=NORMAL`` (as bench/claim_depth.py), so the commit's fsync does not hide
the claim's own cost.
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
        fill(store, "f", finished)
        finish_all(store)
        fill(store, "q", 1000 + spare)
        cases[name] = {"queued": 1000, "finished": finished, "populate_s": time.perf_counter() - started}
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
