"""DBOS's nearest equivalent of a Tether fan-out: one workflow that enqueues a no-op workflow per
item on a queue with a worker concurrency limit, then waits for every handle's result in item
order (DBOS enqueues each item as a workflow of its own: its durable unit, as an item's attempt is
Tether's). Run in a child process by ``bench.workloads.fanout``; the queue polls every 0.1 s."""

from __future__ import annotations

import logging
import time
from typing import Any

QUEUE = "fanout"
_DEFINED: dict[str, Any] = {}


def _define() -> Any:
    """The parent workflow (defined once per process: DBOS registers workflows by name)."""
    from dbos import DBOS

    if not _DEFINED:

        @DBOS.workflow(name="fanout_item")
        def item(n: int) -> int:
            return n

        @DBOS.workflow(name="fanout_parent")
        def parent(items: int) -> list[int]:
            queue = DBOS.retrieve_queue(QUEUE)
            assert queue is not None
            handles = [queue.enqueue(item, n) for n in range(items)]
            return [handle.get_result() for handle in handles]

        _DEFINED["parent"] = parent
    return _DEFINED["parent"]


def drain(url: str, items: int, parallelism: int) -> dict[str, Any]:
    """One parent workflow over ``items`` items, ``parallelism`` at once, in this process."""
    from dbos import DBOS

    logging.getLogger("dbos").setLevel(logging.WARNING)
    parent = _define()
    DBOS(
        config={
            "name": "tetherbench-fanout",
            "system_database_url": url,
            "executor_id": "fanout",
            "application_version": "bench",
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    try:
        DBOS.register_queue(QUEUE, worker_concurrency=parallelism, polling_interval_sec=0.1)
        began = time.perf_counter()
        result = parent(items)
        seconds = time.perf_counter() - began
    finally:
        DBOS.destroy()
    if result != list(range(items)):
        raise RuntimeError("the DBOS fan-out returned the wrong results")
    return {"seconds": seconds}
