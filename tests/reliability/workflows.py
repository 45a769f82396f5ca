"""Workflows the reliability harnesses run, in worker processes and in-process runners alike.

Every step appends one record to this process's sink, keyed by (run id, lease generation): what
executed, under which claim. Effects record ``begin`` before and ``end`` after applying, so a
harness can tell an effect that was applied in the world from one that only began.
"""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

from tests.reliability.support import CURRENT, append_line, process_file, sink_dir
from tether.engine.graph import Workflow, compute, effect
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

ALL = (steps, effectful, poison, poison_effect, healthy)
