"""A fan-out in real ``tether worker`` processes: a worker killed (SIGKILL) in the middle of one,
then another worker: only the unfinished items run again, and each item's effect lands once."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

from tests.integration.support import Lab
from tests.waiting import wait_until as wait_for
from tether.client import RunResult, Tether

FAN_FLOWS = r'''
"""A fan-out whose later items wait for a latch file."""

import json
import os
import time
from pathlib import Path

from tether import Workflow, compute, fan_out

BASE = Path(__BASE__)


def note(ctx, item, phase):
    line = {"run_id": ctx.run_id, "node_id": ctx.node_id, "item": item, "pid": os.getpid(), "phase": phase}
    with open(BASE / "sink.jsonl", "a", encoding="utf-8") as sink:
        sink.write(json.dumps(line) + "\n")


def work(ctx, item):
    note(ctx, item, "run")
    if item >= 6:
        deadline = time.monotonic() + 60
        while not (BASE / "latch").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the latch never appeared")
            time.sleep(0.02)
    note(ctx, item, "effect")  # the item's effect: once per item, whoever ran it
    return {"item": item, "pid": os.getpid()}


fanning = Workflow(
    "fanning",
    start="list",
    nodes=[
        compute("list", lambda ctx: list(range(12))),
        fan_out("each", work, items=lambda ctx: ctx.outputs["list"], parallelism=3),
    ],
    edges={"list": "each"},
)
'''


def test_fan_out__a_worker_killed_mid_fan_out_leaves_only_unfinished_items_to_the_next(
    any_lab: Lab, tmp_path: Path
) -> None:
    lab = any_lab
    folder = tmp_path / "fan"
    folder.mkdir()
    (folder / "fan_flows.py").write_text(FAN_FLOWS.replace("__BASE__", repr(str(tmp_path))))
    client = Tether(lab.url, folder=folder)
    try:
        drive(lab, client, folder)
    finally:
        client.store.close()


def drive(lab: Lab, client: Tether, folder: Path) -> None:
    run_id = client.start("fanning").run_id
    first = lab.worker("fan-first", folder=folder)

    def runs() -> list[dict[str, object]]:
        return [line for line in lab.sink_lines(run_id) if line["phase"] == "run"]

    # Items 0-5 finish; three of items 6-11 wait for the latch.
    wait_for(lambda: len(runs()) == 9, what="nine items to start")
    items = [a for a in client.store.attempts(run_id) if a.node_id.startswith("each[")]
    assert sorted(a.node_id for a in items) == sorted(f"each[{n}]" for n in range(6))
    os.kill(first.pid, signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL

    lab.release("latch")
    second = lab.worker("fan-second", folder=folder)
    result = wait_for(
        lambda: (r := client.result(run_id)).finished and r, timeout=30, what="the run to finish"
    )

    assert isinstance(result, RunResult)
    assert result.status == "done", result.error_message
    ran = [(line["item"], line["pid"]) for line in runs()]
    effects = Counter(line["item"] for line in lab.sink_lines(run_id) if line["phase"] == "effect")
    assert effects == Counter(range(12)), "each item's effect landed once"
    by_item = {item: [pid for n, pid in ran if n == item] for item in range(12)}
    for item in range(6):
        assert by_item[item] == [first.pid], f"item {item} finished before the crash: never again"
    caught = [item for item in range(6, 12) if by_item[item][0] == first.pid]
    assert len(caught) == 3
    for item in caught:
        assert by_item[item] == [first.pid, second.pid]
    for item in set(range(6, 12)) - set(caught):
        assert by_item[item] == [second.pid]
    assert result.output == [{"item": n, "pid": first.pid if n < 6 else second.pid} for n in range(12)]
    completed = Counter(a.node_id for a in client.store.attempts(run_id) if a.status == "completed")
    assert completed == Counter(["list", "each", *(f"each[{n}]" for n in range(12))])
