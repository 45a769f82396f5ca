"""Concurrency limits with real ``tether worker`` processes on each backend: a workflow-wide cap
across two workers, a per-key cap (other keys alongside, one key one at a time), a slot freed when
its worker is killed mid-step, the waiting reason in ``tether runs`` and ``show``, and a start
without the key refused by the CLI."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from tests.integration.support import Lab, wait_for

LIMITED = r'''
"""Workflows under concurrency limits; every step logs when it starts and ends."""

import json
import os
import time
from pathlib import Path

from tether import Limit, Workflow, compute

BASE = Path(__BASE__)
LOG = BASE / "limited.jsonl"


def note(ctx, phase, **extra):
    line = {"run": ctx.run_id, "phase": phase, "t": time.time(), "pid": os.getpid(), **extra}
    with open(LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps(line) + "\n")


def started(run_id):
    if not LOG.exists():
        return False
    return any(json.loads(line)["run"] == run_id for line in LOG.read_text().splitlines() if line)


def work(ctx):
    note(ctx, "start")
    given = ctx.input or {}
    deadline = time.monotonic() + 30
    if "latch" in given:  # hold until the test drops the latch file
        while not (BASE / given["latch"]).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    met = None
    if "meet" in given:  # hold until the named run has started too (or give up after 5 s)
        deadline = time.monotonic() + 5
        while not (met := started(given["meet"])) and time.monotonic() < deadline:
            time.sleep(0.02)
    time.sleep(given.get("seconds", 0))
    note(ctx, "end", met=met)
    return {"met": met}


capped = Workflow("capped", start="work", nodes=[compute("work", work)], concurrency=Limit(max=2))

per_customer = Workflow(
    "per-customer",
    start="work",
    nodes=[compute("work", work)],
    concurrency=Limit(max=1, key="customer_id"),
)
'''


def limited_lab(lab: Lab) -> Lab:
    (lab.folder / "limited.py").write_text(LIMITED.replace("__BASE__", repr(str(lab.base))))
    return lab


def log_lines(lab: Lab) -> list[dict[str, Any]]:
    path = lab.base / "limited.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def intervals(lab: Lab, pids: set[int] | None = None) -> dict[str, tuple[float, float]]:
    """Each finished execution's (start, end), by run id (``pids``: only those processes')."""
    starts: dict[tuple[str, int], float] = {}
    found: dict[str, tuple[float, float]] = {}
    for line in log_lines(lab):
        if pids is not None and line["pid"] not in pids:
            continue
        if line["phase"] == "start":
            starts[(line["run"], line["pid"])] = line["t"]
        else:
            found[line["run"]] = (starts[(line["run"], line["pid"])], line["t"])
    return found


def most_at_once(spans: list[tuple[float, float]]) -> int:
    moments = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = running = 0
    for _, change in moments:  # an end sorts before a start at the same instant
        running += change
        most = max(most, running)
    return most


def test_workflow_cap__two_workers_never_run_more_than_the_cap(any_lab: Lab) -> None:
    lab = limited_lab(any_lab)
    runs = [lab.start("capped", {"seconds": 0.6}) for _ in range(4)]
    first = lab.worker("w1", "--concurrency", "4")
    second = lab.worker("w2", "--concurrency", "4")
    for run_id in runs:
        assert lab.wait_finished(run_id, timeout=60).status == "done"
    spans = intervals(lab)
    assert sorted(spans) == sorted(runs)
    # Without the cap the two workers' eight slots would run all four at once.
    assert most_at_once(list(spans.values())) <= 2
    pids = {line["pid"] for line in log_lines(lab)}
    assert pids <= {first.pid, second.pid}


def test_key_cap__other_keys_run_alongside_and_one_key_one_at_a_time(any_lab: Lab) -> None:
    lab = limited_lab(any_lab)
    acme = [lab.start("per-customer", {"customer_id": "acme", "seconds": 0.3}) for _ in range(3)]
    # globex's run waits until acme's first has started: it can only meet it when both run at once.
    globex = lab.start("per-customer", {"customer_id": "globex", "meet": acme[0]})
    lab.worker("w1", "--concurrency", "4")
    lab.worker("w2", "--concurrency", "4")
    for run_id in [*acme, globex]:
        assert lab.wait_finished(run_id, timeout=60).status == "done"
    assert lab.client.result(globex).output == {"met": True}
    spans = intervals(lab)
    assert most_at_once([spans[r] for r in acme]) == 1


def test_key_cap__a_killed_workers_slot_is_freed_and_the_next_run_proceeds(any_lab: Lab) -> None:
    lab = limited_lab(any_lab)
    held = lab.start("per-customer", {"customer_id": "acme", "latch": "latch-held"})
    waiting = lab.start("per-customer", {"customer_id": "acme"})
    doomed = lab.worker("doomed", "--concurrency", "4")
    wait_for(lambda: intervals_started(lab, held), what="the first run's step to start")
    assert lab.view(waiting).status == "queued"
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    killed_at = time.time()
    lab.release("latch-held")  # the step runs to its end when it is taken over
    survivor = lab.worker("survivor", "--concurrency", "4")
    assert lab.wait_finished(held, timeout=60).status == "done"
    assert lab.wait_finished(waiting, timeout=60).status == "done"
    spans = intervals(lab, {survivor.pid})
    assert set(spans) == {held, waiting}
    assert spans[waiting][0] > killed_at
    assert most_at_once(list(spans.values())) == 1


def intervals_started(lab: Lab, run_id: str) -> bool:
    return any(line["run"] == run_id and line["phase"] == "start" for line in log_lines(lab))


def test_runs_and_show__say_a_run_waits_for_a_slot(any_lab: Lab) -> None:
    lab = limited_lab(any_lab)
    held = lab.start("per-customer", {"customer_id": "acme", "latch": "latch-show"})
    waiting = lab.start("per-customer", {"customer_id": "acme"})
    lab.worker("w1", "--concurrency", "4")
    wait_for(lambda: intervals_started(lab, held), what="the first run's step to start")
    reason = "waiting for a slot of customer_id=acme (1 of 1 in use)"
    listed = lab.cli("runs")
    assert listed.returncode == 0, listed.stderr
    assert reason in listed.stdout
    as_json = json.loads(lab.cli("runs", "--json").stdout)
    summaries = {run["run_id"]: run["summary"] for run in as_json["runs"]}
    assert summaries == {held: "running", waiting: reason}
    shown = lab.cli("show", waiting)
    assert f"waiting: {reason}" in shown.stdout
    lab.release("latch-show")
    assert lab.wait_finished(waiting, timeout=60).status == "done"


def test_start__without_the_key_is_refused_and_writes_nothing(lab: Lab) -> None:
    limited_lab(lab)
    assert lab.cli("start", "per-customer", "--input", '{"customer_id": "acme"}').returncode == 0
    before = lab.fingerprint()
    refused = lab.cli("start", "per-customer", "--input", '{"customer": "acme"}')
    assert refused.returncode != 0
    assert "Traceback" not in refused.stderr
    assert (
        "Workflow per-customer limits its runs per customer_id: the input has no field 'customer_id'"
        in refused.stderr
    )
    assert lab.changes_since(before) == {}
