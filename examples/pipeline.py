"""A composed pipeline: an included fetch stage with retries, a durable sleep, a command, a summary.

Run it with ``tether run pipeline --folder examples``.
"""

from __future__ import annotations

from tether.engine.graph import Exit, Workflow, compute, include, shell, sleep


def fetch_records(ctx):  # type: ignore[no-untyped-def]
    # The first try of every run fails, as a flaky network would; the declared retry recovers.
    if ctx.attempt == 1:
        raise ConnectionError("upstream timed out")
    count = int((ctx.input or {}).get("count", 5))
    return {"records": [{"id": n, "value": n * n} for n in range(1, count + 1)]}


def validate(ctx):  # type: ignore[no-untyped-def]
    records = ctx.outputs["fetch/get"]["records"]
    return Exit("ok" if records else "empty", {"valid": len(records)})


fetch = Workflow(
    "fetch",
    start="get",
    nodes=[compute("get", fetch_records, retries=2, backoff_s=0.2), compute("check", validate)],
    edges={"get": "check"},
)


def summarize(ctx):  # type: ignore[no-untyped-def]
    records = ctx.outputs["fetch/get"]["records"]
    return {
        "records": len(records),
        "total": sum(r["value"] for r in records),
        "checksum": ctx.outputs["checksum"]["stdout"].strip(),
    }


pipeline = Workflow(
    "pipeline",
    description="Fetch with retries, rest durably, run a command, summarize",
    start="fetch",
    nodes=[
        include("fetch", fetch),
        sleep("rest", 0.5),
        # A POSIX command, named, not an interpreter's path: the definition is the same on every
        # machine that loads this file. The fetched records reach it on standard input (as JSON).
        shell("checksum", ["cksum"], stdin=lambda ctx: ctx.outputs["fetch/get"]["records"]),
        compute("summarize", summarize),
    ],
    edges={"fetch.ok": "rest", "rest": "checksum", "checksum": "summarize"},
)
