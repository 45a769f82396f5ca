"""Workflows the reliability harnesses run, in worker processes and in-process runners alike.

Every step appends one record to this process's sink, keyed by (run id, lease generation): what
executed, under which claim. Effects record ``begin`` before and ``end`` after applying, so a
harness can tell an effect that was applied in the world from one that only began. The items of a
fan-out and the branches of a parallel node record the same way, under their own node ids
(``each[3]``, ``both[left]``).
"""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

from tests.reliability.support import CURRENT, append_line, process_file, sink_dir
from tether.engine.graph import Workflow, compute, effect, fan_out, parallel
from tether.engine.runner import Context


def _record(ctx: Context, phase: str, **extra: Any) -> dict[str, Any]:
    record = {
        "run_id": ctx.run_id,
        "generation": getattr(CURRENT, "generation", None),
        "node_id": ctx.node_id,
        "phase": phase,
        "pid": os.getpid(),
        "t": time.time(),
        **extra,
    }
    folder = sink_dir()
    if folder is not None:
        append_line(process_file("sink", folder), record)
    return record


def _pause(ctx: Context) -> None:
    """A few milliseconds of work, so that kills land inside nodes as well as between them."""
    delay = (ctx.input or {}).get("work_ms", 0) if isinstance(ctx.input, dict) else 0
    if delay:
        time.sleep(random.uniform(0, delay) / 1000)


def step(ctx: Context) -> dict[str, Any]:
    _pause(ctx)
    record = _record(ctx, "step")
    return {"node": ctx.node_id, "generation": record["generation"], "pid": record["pid"]}


def publish(ctx: Context, key: str) -> dict[str, Any]:
    record = _record(ctx, "begin", key=key)
    _pause(ctx)
    _record(ctx, "end", key=key)
    return {"key": key, "generation": record["generation"], "pid": record["pid"]}


#: How many items the fan-out workflows map over.
FAN_ITEMS = 8


def items(ctx: Context) -> list[int]:
    return list(range(FAN_ITEMS))


def item_step(ctx: Context, item: int) -> dict[str, Any]:
    """An item of a fan-out, recorded as a step is."""
    _pause(ctx)
    record = _record(ctx, "step", item=item)
    return {"node": ctx.node_id, "item": item, "generation": record["generation"], "pid": record["pid"]}


def item_publish(ctx: Context, item: int) -> dict[str, Any]:
    """An item that publishes under a key of its run and item: idempotent in the world (a repeat
    after a crash publishes the same key again, which the receiver deduplicates)."""
    return {"item": item, **publish(ctx, f"{ctx.run_id}:{ctx.node_id}")}


def item_effect(ctx: Context, item: int, key: str) -> dict[str, Any]:
    """An item of an effect fan-out: applied through the outbox under the key it is given."""
    return {"item": item, **publish(ctx, key)}


def crash(ctx: Context) -> None:
    """A node that kills its own process on every attempt (a poison run)."""
    _record(ctx, "crash")
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def crash_while_applying(ctx: Context, key: str) -> None:
    """An effect whose process dies while it applies, on every attempt."""
    _record(ctx, "begin", key=key)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


steps = Workflow(
    "steps",
    description="Three steps",
    start="a",
    nodes=[compute("a", step), compute("b", step), compute("c", step)],
    edges={"a": "b", "b": "c"},
)

effectful = Workflow(
    "effectful",
    description="A step, an effect, a step",
    start="a",
    nodes=[compute("a", step), effect("pub", publish), compute("c", step)],
    edges={"a": "pub", "pub": "c"},
)

poison = Workflow(
    "poison",
    description="A step, then a node that kills its runner",
    start="a",
    nodes=[compute("a", step), compute("boom", crash)],
    edges={"a": "boom"},
)

poison_effect = Workflow(
    "poison_effect",
    description="A step, then an effect that kills its runner while it applies",
    start="a",
    nodes=[compute("a", step), effect("boom", crash_while_applying)],
    edges={"a": "boom"},
)

healthy = Workflow(
    "healthy",
    description="Two quick steps",
    start="one",
    nodes=[compute("one", step), compute("two", step)],
    edges={"one": "two"},
)

fanned = Workflow(
    "fanned",
    description="A step, a fan-out of steps, two parallel branches, a step",
    start="a",
    nodes=[
        compute("a", step),
        fan_out("each", item_step, items=items, parallelism=4),
        parallel("both", [compute("left", step), compute("right", step)]),
        compute("c", step),
    ],
    edges={"a": "each", "each": "both", "both": "c"},
)

fanned_publish = Workflow(
    "fanned_publish",
    description="A step, a fan-out of idempotent publishes, a step",
    start="a",
    nodes=[compute("a", step), fan_out("each", item_publish, items=items, parallelism=4), compute("c", step)],
    edges={"a": "each", "each": "c"},
)

fanned_effects = Workflow(
    "fanned_effects",
    description="A step, a fan-out of outbox effects, a step",
    start="a",
    nodes=[
        compute("a", step),
        fan_out("each", item_effect, items=items, parallelism=4, effect=True),
        compute("c", step),
    ],
    edges={"a": "each", "each": "c"},
)

#: The fan-out nodes of the suite's workflows and how many items each maps over (the oracle
#: checks that a finished run completed every one).
FAN_OUT_ITEMS = {
    ("fanned", "each"): FAN_ITEMS,
    ("fanned_publish", "each"): FAN_ITEMS,
    ("fanned_effects", "each"): FAN_ITEMS,
}

ALL = (steps, effectful, poison, poison_effect, healthy, fanned, fanned_publish, fanned_effects)
