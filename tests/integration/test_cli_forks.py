"""``tether restart RUN --from NODE`` as a user runs it: a run fails at its third step, the step is
fixed, the fork reuses the first two steps' outputs and a real ``tether worker`` finishes it; on
each backend."""

from __future__ import annotations

import json

from tests.integration.support import Lab
from tests.store.conftest import snapshot

#: Four steps; the first two record each call in the sink. ``__FIXED__`` chooses the third step's
#: code: failing (the prompt is wrong) or fixed.
PIPELINE = r"""
import json
from pathlib import Path

from tether.engine.graph import Workflow, compute

SINK = Path(__file__).resolve().parent.parent / "sink.jsonl"
FIXED = __FIXED__


def mark(ctx):
    with open(SINK, "a", encoding="utf-8") as sink:
        sink.write(json.dumps({"run_id": ctx.run_id, "node_id": ctx.node_id, "fixed": FIXED}) + "\n")


def fetch(ctx):
    mark(ctx)
    return {"doc": "doc-%s" % (ctx.input or {}).get("n")}


def enrich(ctx):
    mark(ctx)
    return {"words": 3}


def write(ctx):
    mark(ctx)
    if not FIXED:
        raise ValueError("the prompt is wrong")
    return {"summary": [ctx.outputs["fetch"], ctx.outputs["enrich"]]}


def publish(ctx):
    mark(ctx)
    return {"published": ctx.outputs["write"]["summary"]}


pipeline = Workflow(
    "pipeline4",
    start="fetch",
    nodes=[compute(f.__name__, f) for f in (fetch, enrich, write, publish)],
    edges={"fetch": "enrich", "enrich": "write", "write": "publish"},
)
"""


def ok(result: object) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"  # type: ignore[attr-defined]
    assert "Traceback" not in result.stderr  # type: ignore[attr-defined]
    return str(result.stdout)  # type: ignore[attr-defined]


def refused(lab: Lab, code: int, message: str, *argv: str) -> None:
    before = snapshot(lab.client.store)
    result = lab.cli(*argv)
    assert result.returncode == code, f"stdout={result.stdout!r} stderr={result.stderr!r}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tether: {message}"), result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(lab.client.store) == before, "a refused fork changed the database"


def test_restart_from_a_node_reuses_the_earlier_outputs_and_a_worker_finishes_it(any_lab: Lab) -> None:
    lab = any_lab
    source = lab.folder / "pipeline4.py"
    source.write_text(PIPELINE.replace("__FIXED__", "False"))
    parent = lab.start("pipeline4", {"n": 5}, run_id="run-summary")
    ok(lab.cli("worker", "--until-idle", "--lease-ms", "1500", "--poll-ms", "50"))
    assert lab.client.result(parent).status == "failed"
    assert [x["node_id"] for x in lab.sink_lines(parent)] == ["fetch", "enrich", "write"]

    source.write_text(PIPELINE.replace("__FIXED__", "True"))  # the third step is fixed
    refused(
        lab,
        4,
        "Workflow pipeline4 has no node nope (its nodes: fetch, enrich, write, publish)",
        "restart",
        parent,
        "--from",
        "nope",
    )
    refused(
        lab,
        5,
        f"Workflow run {parent} never reached node publish: nothing to fork from there",
        "restart",
        parent,
        "--from",
        "publish",
    )
    live = lab.start("pipeline4", run_id="run-live")
    refused(
        lab,
        5,
        "Workflow run run-live is queued: only a finished run can be restarted",
        "restart",
        live,
        "--from",
        "write",
    )
    lab.client.cancel(live)

    child = json.loads(ok(lab.cli("restart", parent, "--from", "write", "--json")))
    assert (child["run_id"], child["parent_run_id"], child["input"]) == ("run-summary-r1", parent, {"n": 5})
    worker = lab.worker("fork-worker")
    result = lab.wait_finished(child["run_id"])
    assert result.status == "done", result.error_message
    assert result.output == {"published": [{"doc": "doc-5"}, {"words": 3}]}
    # The first two steps ran once, for the parent; the fixed step ran in the fork.
    ran = [(x["node_id"], x["fixed"]) for x in lab.sink_lines(child["run_id"])]
    assert ran == [("write", True), ("publish", True)]
    assert [x["node_id"] for x in lab.sink_lines(parent)] == ["fetch", "enrich", "write"]
    worker.terminate()
    worker.wait(timeout=30)

    shown = ok(lab.cli("show", child["run_id"]))
    assert f"forked from {parent} at write (reused: fetch, enrich)" in shown
    steps = [line.split() for line in shown.splitlines() if line.split()[:1] in (["fetch"], ["enrich"])]
    assert [s[:4] for s in steps] == [
        ["fetch", "completed", "#1", "reused"],
        ["enrich", "completed", "#1", "reused"],
    ]
    assert f"forked as {child['run_id']} at write" in ok(lab.cli("show", parent))
    lineage = json.loads(ok(lab.cli("show", child["run_id"], "--json")))["lineage"]
    assert (lineage["parent_run_id"], lineage["from_node"], lineage["copied"]) == (
        parent,
        "write",
        ["fetch", "enrich"],
    )
    events = ok(lab.cli("events", "--run-id", child["run_id"], "--json")).splitlines()
    assert [json.loads(line)["type"] for line in events][:2] == ["run.queued", "run.forked"]
