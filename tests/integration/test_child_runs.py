"""Child runs driven as a user does: real ``tether worker`` processes on both backends, the CLI's
``show`` and ``cancel``."""

from __future__ import annotations

import json
import os
import signal

from tests.integration.support import Lab, wait_for

FAMILY = r'''
"""A parent that starts a child run and uses its result."""

import json
import os
import signal
from pathlib import Path

from tether.engine.graph import Workflow, child, compute, decision

BASE = Path(__BASE__)


def note(ctx, phase="run"):
    with open(BASE / "family.jsonl", "a", encoding="utf-8") as sink:
        line = {"run_id": ctx.run_id, "node_id": ctx.node_id, "pid": os.getpid(), "phase": phase}
        sink.write(json.dumps(line) + "\n")


def double(ctx):
    note(ctx)
    return {"doubled": ctx.input["n"] * 2}


def double_after_dying_once(ctx):
    # The first time, the worker process dies right here: after its parent started this child.
    note(ctx)
    died = BASE / "died"
    if not died.exists():
        died.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return {"doubled": ctx.input["n"] * 2}


def use(ctx):
    note(ctx)
    return {"child said": ctx.outputs["spawn"]}


doubler = Workflow("doubler", start="double", nodes=[compute("double", double)])
fragile = Workflow("fragile", start="double", nodes=[compute("double", double_after_dying_once)])
asker = Workflow("asker", start="ask", nodes=[decision("ask", "Go on?", options=["yes", "no"])])

family = Workflow(
    "family",
    start="spawn",
    nodes=[child("spawn", doubler, input=lambda ctx: {"n": ctx.input["n"]}), compute("use", use)],
    edges={"spawn": "use"},
)
fragile_family = Workflow(
    "fragile-family",
    start="spawn",
    nodes=[child("spawn", fragile, input=lambda ctx: {"n": ctx.input["n"]}), compute("use", use)],
    edges={"spawn": "use"},
)
asking_family = Workflow(
    "asking-family",
    start="spawn",
    nodes=[child("spawn", asker), compute("use", use)],
    edges={"spawn": "use"},
)
'''


def with_family(lab: Lab) -> Lab:
    (lab.folder / "family.py").write_text(FAMILY.replace("__BASE__", repr(str(lab.base))))
    return lab


def runs_of(lab: Lab, workflow: str) -> list[str]:
    return [r.run_id for r in lab.client.runs(workflow=workflow, limit=None)]


def test_child__workers_run_the_child_and_the_parent_continues_with_its_result(any_lab: Lab) -> None:
    lab = with_family(any_lab)
    run_id = lab.start("family", {"n": 21})
    lab.worker("worker-a")
    lab.worker("worker-b")
    result = lab.wait_finished(run_id)
    assert (result.status, result.output) == ("done", {"child said": {"doubled": 42}})
    assert runs_of(lab, "doubler") == [f"{run_id}.spawn"]
    assert lab.wait_finished(f"{run_id}.spawn").output == {"doubled": 42}


def test_child__a_worker_killed_after_starting_the_child_leaves_exactly_one_child(any_lab: Lab) -> None:
    lab = with_family(any_lab)
    run_id = lab.start("fragile-family", {"n": 4})
    first = lab.worker("worker-first")
    assert first.wait(timeout=30) == -signal.SIGKILL  # died in the child's step
    assert runs_of(lab, "fragile") == [f"{run_id}.spawn"]
    second = lab.worker("worker-second")
    result = lab.wait_finished(run_id)
    assert (result.status, result.output) == ("done", {"child said": {"doubled": 8}})
    assert runs_of(lab, "fragile") == [f"{run_id}.spawn"]
    spawned = [a.status for a in lab.client.store.attempts(run_id) if a.node_id == "spawn"]
    assert spawned == ["completed"]
    steps = [json.loads(line) for line in (lab.base / "family.jsonl").read_text().splitlines()]
    assert [s["pid"] for s in steps if s["node_id"] == "double"] == [first.pid, second.pid]
    assert [s["pid"] for s in steps if s["node_id"] == "use"] == [second.pid]


def test_child__show_links_both_ways_and_cancel_reaches_the_child(any_lab: Lab) -> None:
    lab = with_family(any_lab)
    run_id = lab.start("asking-family")
    kid = f"{run_id}.spawn"
    lab.worker("worker-a")
    wait_for(lambda: kid in runs_of(lab, "asker"), what="the child run")
    wait_for(lambda: lab.view(kid).run_state_status == "waiting", what="the child to wait for its person")
    wait_for(lambda: lab.view(run_id).status == "parked", what="the parent to park")

    parent_shown = lab.cli("show", run_id)
    assert parent_shown.returncode == 0, parent_shown.stderr
    assert "children:" in parent_shown.stdout
    assert f"{kid}  asker  parked  (node spawn, waited for)" in parent_shown.stdout
    assert f"waiting for child run {kid}" in parent_shown.stdout
    child_shown = lab.cli("show", kid)
    assert child_shown.returncode == 0, child_shown.stderr
    assert f"child of {run_id} at node spawn" in child_shown.stdout
    as_json = json.loads(lab.cli("show", run_id, "--json").stdout)
    assert [c["run_id"] for c in as_json["children"]] == [kid]

    cancelled = lab.cli("cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert (lab.view(run_id).status, lab.view(kid).status) == ("cancelled", "cancelled")
    assert f"{kid}  asker  cancelled" in lab.cli("show", run_id).stdout
    assert os.path.exists(lab.base / "family.jsonl") is False  # neither ran a step of its own


def test_child__tether_run_executes_the_child_too_and_names_a_wait_inside_it(any_lab: Lab) -> None:
    lab = with_family(any_lab)
    done = lab.cli("run", "family", "--input", '{"n": 21}', "--run-id", "fam-1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == {"child said": {"doubled": 42}}
    assert lab.view("fam-1.spawn").status == "done"

    waiting = lab.cli("run", "asking-family", "--run-id", "fam-2")
    assert waiting.returncode == 0, waiting.stderr
    assert "run fam-2 is waiting for a person:" in waiting.stdout
    assert "child run fam-2.spawn waits:" in waiting.stdout
    (question,) = lab.client.decisions("fam-2.spawn")
    assert f"answer: tether answer {question.decision_id} yes|no" in waiting.stdout
