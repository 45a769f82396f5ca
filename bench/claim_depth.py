"""claim_next latency against queue depth and against a pile of finished runs.

    python bench/claim_depth.py --sizes 1000 100000 --finished 100000

For each size: reserve that many queued runs (in one transaction, through the public API), then
time ``claim_next`` + ``complete`` pairs and report p50/p99 of the claim alone. A second scenario
puts ``--finished`` finished runs beside 1,000 queued ones. The claim walks a partial index that
holds only claimable runs, so the ratios printed at the end should stay near 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tether import open_store
from tether.store import Store
from tether.values import definition_digest

SNAPSHOT = {"name": "noop", "nodes": ["a"]}
COMMON = {
    "workflow_name": "noop",
    "workflow_source_ref": "builtin:noop",
    "workflow_source": {"kind": "builtin", "id": "noop", "revision": "1"},
    "definition_digest": definition_digest(SNAPSHOT),
    "definition_snapshot": SNAPSHOT,
    "execution_mode": "headless",
    "origin_session_id": "bench",
}


def fill(store: Store, prefix: str, count: int, batch: int = 5000) -> None:
    for start in range(0, count, batch):
        with store.transaction():
            for n in range(start, min(count, start + batch)):
                store.reserve(run_id=f"{prefix}-{n}", **COMMON)


def finish_all(store: Store) -> None:
    while True:
        token = str(uuid.uuid4())
        with store.transaction():
            record = store.claim_next(runner_id="host-bench", claim_token=token, lease_ms=60_000)
            if record is None:
                return
            store.complete(run_id=record.run_id, claim_token=token)


def measure(store: Store, samples: int) -> dict[str, float]:
    timings = []
    for _ in range(samples):
        token = str(uuid.uuid4())
        started = time.perf_counter()
        record = store.claim_next(runner_id="host-bench", claim_token=token, lease_ms=60_000)
        timings.append((time.perf_counter() - started) * 1000)
        assert record is not None
        store.complete(run_id=record.run_id, claim_token=token)
    timings.sort()
    return {
        "p50_ms": statistics.median(timings),
        "p99_ms": timings[int(len(timings) * 0.99) - 1],
        "min_ms": timings[0],
        "max_ms": timings[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 20000])
    parser.add_argument("--finished", type=int, default=20000)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="tether-bench-"))
    results: dict[str, dict[str, float]] = {}
    for size in args.sizes:
        store = open_store(f"sqlite:///{folder}/queued-{size}.db?synchronous=NORMAL")
        fill(store, "q", size + args.samples)
        results[f"queued_{size}"] = measure(store, args.samples)
        store.close()
    store = open_store(f"sqlite:///{folder}/finished.db?synchronous=NORMAL")
    fill(store, "f", args.finished)
    finish_all(store)
    fill(store, "q", 1000 + args.samples)
    results[f"finished_{args.finished}_queued_1000"] = measure(store, args.samples)
    store.close()
    smallest = results[f"queued_{args.sizes[0]}"]["p99_ms"]
    for name, figures in results.items():
        figures["p99_ratio_to_smallest"] = figures["p99_ms"] / smallest
        print(
            f"{name:<32} p50 {figures['p50_ms']:.3f} ms  p99 {figures['p99_ms']:.3f} ms  "
            f"p99 ratio {figures['p99_ratio_to_smallest']:.2f}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
