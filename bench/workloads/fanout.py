"""Workload 7: fan-out, one run mapping a no-op step over many items (``fan_out``).

A child process starts one run of a workflow whose only node is a ``fan_out`` of a no-op function
over ``fanout_items`` items with ``fanout_parallelism`` calls at once, and drains it with one
``Runner``. Each item's try is recorded under the run's claim (an ``each[n]`` attempt; the tries
that end together share one transaction), so items/s measures what recording an item costs. The
clock runs from the start of the drain to the run's completion.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from bench.common import pg_create, pg_drop, run_child, summary
from bench.workloads import Config, error_text, store_url


def noop(ctx: Any, item: Any, *key: str) -> Any:
    return item


def drain(
    url: str, items: int, parallelism: int, runner: dict[str, int], effect: bool = False
) -> dict[str, Any]:
    """One run of the fan-out workflow, drained by one runner in this process (``effect``: each
    item an outbox effect, ``fan_out(..., effect=True)``)."""
    from tether import Runner, RunnerConfig, Tether, Workflow, fan_out

    workflow = Workflow(
        "fanout",
        start="each",
        nodes=[
            fan_out(
                "each", noop, items=lambda ctx: list(range(ctx.input)), parallelism=parallelism, effect=effect
            )
        ],
    )
    client = Tether(url, workflows=[workflow])
    try:
        run_id = client.start("fanout", items).run_id
        worker = Runner(client.store, client.registry, config=RunnerConfig(**runner))
        began = time.perf_counter()
        worker.run(stop_when=worker.idle_for_good)
        seconds = time.perf_counter() - began
        result = client.result(run_id)
        if result.status != "done" or result.output != list(range(items)):
            raise RuntimeError(f"the fan-out run ended {result.status}: {result.error_message}")
        return {"seconds": seconds}
    finally:
        client.store.close()


def _backend(config: Config, backend: str) -> dict[str, Any]:
    folder = Path(config.workdir) / f"fanout-{backend}"
    rounds = []
    for rep in range(max(1, config.reps)):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        database = pg_create("fanout") if backend == "postgres" else None
        where = database if database is not None else str(folder / "fanout.db")
        try:
            args = {
                "url": store_url(backend, where),
                "items": config.fanout_items,
                "parallelism": config.fanout_parallelism,
                "runner": config.runner,
            }
            measured = run_child(
                ["call", "bench.workloads.fanout:drain", json.dumps(args)], timeout=120 + config.fanout_items
            )
        finally:
            if database is not None:
                pg_drop(database)
            shutil.rmtree(folder, ignore_errors=True)
        rate = config.fanout_items / measured["seconds"]
        rounds.append(rate)
        print(f"  fanout {backend} round {rep + 1}: {rate:,.0f} items/s", flush=True)
    return {"items_per_s": summary(rounds)}


def _dbos(config: Config, backend: str) -> dict[str, Any]:
    """The same fan-out through DBOS (``bench.peers.dbos_fanout``), when DBOS is installed."""
    import importlib.util

    if importlib.util.find_spec("dbos") is None:
        return {"skipped": "dbos is not installed"}
    from bench.common import pg_dsn

    folder = Path(config.workdir) / f"fanout-dbos-{backend}"
    rounds = []
    for rep in range(max(1, config.reps)):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        database = pg_create("fanoutdbos") if backend == "postgres" else None
        url = (
            pg_dsn(database).replace("postgresql://", "postgresql+psycopg://", 1)
            if database is not None
            else f"sqlite:///{folder}/dbos.sqlite"
        )
        try:
            args = {"url": url, "items": config.fanout_items, "parallelism": config.fanout_parallelism}
            measured = run_child(
                ["call", "bench.peers.dbos_fanout:drain", json.dumps(args)], timeout=120 + config.fanout_items
            )
        finally:
            if database is not None:
                pg_drop(database)
            shutil.rmtree(folder, ignore_errors=True)
        rate = config.fanout_items / measured["seconds"]
        rounds.append(rate)
        print(f"  fanout dbos {backend} round {rep + 1}: {rate:,.0f} items/s", flush=True)
    return {"items_per_s": summary(rounds)}


def run(config: Config, pg_reason: str | None) -> dict[str, Any]:
    results: dict[str, Any] = {
        "items": config.fanout_items,
        "parallelism": config.fanout_parallelism,
        "step": "fan_out of a no-op function; each item's try recorded as an attempt, the tries "
        "that end together in one transaction",
    }
    for backend in ("sqlite", "postgres"):
        if backend == "postgres" and pg_reason is not None:
            results[backend] = {"skipped": pg_reason}
            continue
        try:
            results[backend] = _backend(config, backend)
        except Exception as error:
            results[backend] = {"error": error_text(error)}
            print(f"  fanout {backend}: ERROR {results[backend]['error'][:300]}", flush=True)
        # The peers' nearest equivalent, measured in the same run.
        try:
            results[f"dbos-{backend}"] = _dbos(config, backend)
        except Exception as error:
            results[f"dbos-{backend}"] = {"error": error_text(error)}
            print(f"  fanout dbos {backend}: ERROR {results[f'dbos-{backend}']['error'][:300]}", flush=True)
    return results
