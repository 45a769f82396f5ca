"""A fan-out in real ``tether worker`` processes: a worker killed (SIGKILL) in the middle of one,
then another worker: only the unfinished items run again, and each item's effect lands once; in
a fan-out of outbox effects, the items caught applying wait for a person (ambiguous), never
applied twice."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

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


EFFECT_FLOWS = r'''
"""A fan-out of effects whose later items wait for a latch file (item 6 lands before it waits)."""

import json
import os
import time
from pathlib import Path

from tether import Workflow, compute, fan_out

BASE = Path(__BASE__)


def note(ctx, item, key, phase):
    line = {"run_id": ctx.run_id, "item": item, "key": key, "pid": os.getpid(), "phase": phase}
    with open(BASE / "sink.jsonl", "a", encoding="utf-8") as sink:
        sink.write(json.dumps(line) + "\n")


def send(ctx, item, key):
    note(ctx, item, key, "begin")
    if item == 6:
        note(ctx, item, key, "effect")  # it lands; the worker dies before recording it
    if item >= 6:
        deadline = time.monotonic() + 60
        while not (BASE / "latch").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the latch never appeared")
            time.sleep(0.02)
    if item != 6:
        note(ctx, item, key, "effect")
    return {"item": item, "pid": os.getpid()}


mailing = Workflow(
    "mailing",
    start="list",
    nodes=[
        compute("list", lambda ctx: list(range(12))),
        fan_out("each", send, items=lambda ctx: ctx.outputs["list"], parallelism=3, effect=True),
    ],
    edges={"list": "each"},
)
'''


def test_fan_out_effect__a_worker_killed_mid_fan_out_leaves_the_caught_items_ambiguous_never_applied_twice(
    any_lab: Lab, tmp_path: Path
) -> None:
    lab = any_lab
    folder = tmp_path / "mail"
    folder.mkdir()
    (folder / "mail_flows.py").write_text(EFFECT_FLOWS.replace("__BASE__", repr(str(tmp_path))))
    client = Tether(lab.url, folder=folder)
    try:
        drive_effects(lab, client, folder)
    finally:
        client.store.close()


def drive_effects(lab: Lab, client: Tether, folder: Path) -> None:
    run_id = client.start("mailing").run_id
    first = lab.worker("mail-first", folder=folder)

    def lines(phase: str) -> list[dict[str, Any]]:
        return [line for line in lab.sink_lines(run_id) if line["phase"] == phase]

    # Items 0-5 apply their effects; items 6-8 begin theirs and wait (item 6's has landed).
    wait_for(lambda: len(lines("begin")) == 9 and len(lines("effect")) == 7, what="nine items to begin")
    os.kill(first.pid, signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL

    second = lab.worker("mail-second", folder=folder)
    wait_for(
        lambda: (
            (view := client.store.get_run_view(run_id)) is not None and view.error_code == "effectAmbiguous"
        ),
        timeout=30,
        what="the run to wait for a person",
    )
    listed = lab.cli("effects", "--run-id", run_id, "--status", "ambiguous", "--json", folder=folder)
    assert listed.returncode == 0, listed.stderr
    ambiguous = {row["idempotency_key"]: row["effect_id"] for row in json.loads(listed.stdout)}
    caught = {f"{run_id}:each[{n}]:1" for n in (6, 7, 8)}
    assert set(ambiguous) == caught, "the items caught applying, and only they, are ambiguous"
    assert all(line["pid"] == first.pid for line in lab.sink_lines(run_id)), "nothing ran meanwhile"

    # A person looks: item 6's effect landed, items 7 and 8's did not.
    for key, effect_id in sorted(ambiguous.items()):
        outcome = "applied" if key.endswith("each[6]:1") else "retry"
        resolved = lab.cli("effects", "--resolve", effect_id, outcome, folder=folder)
        assert resolved.returncode == 0, resolved.stderr
    lab.release("latch")
    result = wait_for(
        lambda: (r := client.result(run_id)).finished and r, timeout=30, what="the run to finish"
    )

    assert isinstance(result, RunResult)
    assert result.status == "done", result.error_message
    effects = Counter(line["item"] for line in lines("effect"))
    assert effects == Counter(range(12)), "each item's effect applied once"
    began = {item: [line["pid"] for line in lines("begin") if line["item"] == item] for item in range(12)}
    for item in range(6):
        assert began[item] == [first.pid], f"item {item} applied before the crash: never again"
    assert began[6] == [first.pid], "the item a person said applied is not called again"
    for item in (7, 8):
        assert began[item] == [first.pid, second.pid], f"item {item}, retried by a person, once more"
    for item in range(9, 12):
        assert began[item] == [second.pid]
    keys = {line["key"] for line in lines("begin")}
    assert keys == {f"{run_id}:each[{n}]:1" for n in range(12)}, "one key per item, across workers"
    assert isinstance(result.output, list)
    assert result.output[6] is None  # settled by a person: no result recorded
    assert [o["pid"] for o in result.output[:6]] == [first.pid] * 6
    assert [o["pid"] for n, o in enumerate(result.output) if n > 6] == [second.pid] * 5
    stored = client.store.effects(run_id=run_id)
    assert Counter(e.status for e in stored) == Counter({"applied": 12})
