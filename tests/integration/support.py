"""Helpers for the integration suite: real ``tether`` processes on a temporary SQLite file.

Every wait is deadline-based (``wait_for``); nothing sleeps for a fixed time where a condition
can be polled. Workflows are written into a temporary folder from ``FLOWS`` and record every
node they execute as one JSON line (run id, node id, pid, phase) in an append-only sink file.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from tests.waiting import wait_until as wait_for
from tether.client import RunResult, Tether
from tether.store import RunEvent, RunView

REPO = Path(__file__).resolve().parents[2]
TETHER = REPO / ".venv" / "bin" / "tether"
EXAMPLES = REPO / "examples"
#: Lease and poll for test workers: a takeover waits at most one lease.
LEASE_MS = 1500
POLL_MS = 50

T = TypeVar("T")

FLOWS = r'''
"""Workflows the integration tests run in real worker processes."""

import json
import os
import signal
import time
from pathlib import Path

from tether.engine.graph import Exit, Workflow, compute, decision, effect, input, notify, shell, sleep

BASE = Path(__BASE__)
SINK = BASE / "sink.jsonl"
PYTHON = __PYTHON__


def mark(ctx, phase="run", **extra):
    line = {
        "run_id": ctx.run_id,
        "node_id": ctx.node_id,
        "pid": os.getpid(),
        "attempt": ctx.attempt,
        "phase": phase,
        **extra,
    }
    with open(SINK, "a", encoding="utf-8") as sink:
        sink.write(json.dumps(line) + "\n")


def block_on(name):
    latch = BASE / name
    deadline = time.monotonic() + 60
    while not latch.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"latch {name} never appeared")
        time.sleep(0.02)


def latch_name(ctx):
    return (ctx.input or {}).get("latch", "latch")


def step(ctx):
    mark(ctx)
    return {"node": ctx.node_id, "pid": os.getpid()}


def gate(ctx):
    mark(ctx)
    block_on(latch_name(ctx))
    mark(ctx, "end")
    return {"node": ctx.node_id, "pid": os.getpid()}


def boom(ctx):
    mark(ctx)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def publish(ctx, key):
    mark(ctx, key=key)
    block_on(latch_name(ctx))
    mark(ctx, "end", key=key)
    return {"published": key, "pid": os.getpid()}


def publish_and_crash(ctx, key):
    mark(ctx, key=key)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def nap(ctx):
    # Sleeps up to a minute in short steps, looking at its run's cancellation signal.
    mark(ctx)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if ctx.cancelled:
            mark(ctx, "cancelled")
            ctx.raise_if_cancelled()
        time.sleep(0.02)
    return {"napped": True}


def pay(ctx, key):
    mark(ctx, key=key)
    return {"paid": key}


def flaky(ctx):
    mark(ctx)
    if ctx.attempt == 1:
        raise ConnectionError("the first try fails")
    return {"tries": ctx.attempt}


def choose(ctx):
    mark(ctx)
    return Exit("big" if (ctx.input or {}).get("n", 0) > 10 else "small", {"n": (ctx.input or {}).get("n")})


def misroute(ctx):
    # An exit name the store refuses to record: a fault the runner cannot turn into progress.
    mark(ctx)
    return {"fixed": True} if (BASE / "fixed").exists() else Exit("", None)


WAIT_SCRIPT = """
import json, os, sys, time
base = sys.argv[1]
with open(os.path.join(base, "sink.jsonl"), "a", encoding="utf-8") as sink:
    line = {"run_id": None, "node_id": "wait", "pid": os.getpid(), "ppid": os.getppid(), "phase": "run"}
    sink.write(json.dumps(line) + "\\n")
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(base, "latch-shell")):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.02)
print("released")
"""

steps = Workflow(
    "steps",
    description="Two steps, a gate that waits for a latch file, a last step",
    start="a",
    nodes=[compute("a", step), compute("b", step), compute("gate", gate), compute("d", step)],
    edges={"a": "b", "b": "gate", "gate": "d"},
)

slowshell = Workflow(
    "slowshell",
    description="A step, a command that waits for a latch file, a step",
    start="prep",
    nodes=[
        compute("prep", step),
        shell("wait", [PYTHON, "-c", WAIT_SCRIPT, str(BASE)], timeout_s=120),
        compute("after", step),
    ],
    edges={"prep": "wait", "wait": "after"},
)

poison = Workflow(
    "poison",
    description="A step, then a node that kills its own process",
    start="a",
    nodes=[compute("a", step), compute("boom", boom)],
    edges={"a": "boom"},
)

healthy = Workflow(
    "healthy",
    description="Two quick steps",
    start="one",
    nodes=[compute("one", step), compute("two", step)],
    edges={"one": "two"},
)

publishing = Workflow(
    "publishing",
    description="A step, an effect that waits for a latch file, a step",
    start="prep",
    nodes=[compute("prep", step), effect("pub", publish), compute("after", step)],
    edges={"prep": "pub", "pub": "after"},
)

crashing = Workflow(
    "crashing",
    description="An effect whose process dies while it applies, then a step",
    start="pub",
    nodes=[effect("pub", publish_and_crash), compute("after", step)],
    edges={"pub": "after"},
)

approval = Workflow(
    "approval",
    description="A person approves or rejects",
    start="ask",
    nodes=[
        decision("ask", "Ship it?", options=["approve", "reject"]),
        compute("shipped", step),
        compute("dropped", step),
    ],
    edges={"ask.approve": "shipped", "ask.reject": "dropped"},
)

sizing = Workflow(
    "sizing",
    description="A person answers with JSON matching a schema",
    start="size",
    nodes=[decision("size", "How many?", schema={"type": "integer", "minimum": 1}), compute("use", step)],
    edges={"size": "use"},
)

form = Workflow(
    "form",
    description="The origin session answers a structured question",
    start="ask",
    nodes=[
        input(
            "ask",
            "Your name?",
            schema={
                "type": "object",
                "properties": {"name": {"type": "string", "minLength": 1}},
                "required": ["name"],
            },
            timeout_s=600,
        ),
        compute("greet", step),
        notify("reply", lambda ctx: {"text": "hello " + ctx.outputs["ask"]["value"]["name"]}),
    ],
    edges={"ask": "greet", "greet": "reply"},
)

broken = Workflow(
    "broken",
    description="A step, then a node whose exit cannot be recorded until it is fixed",
    start="a",
    nodes=[compute("a", step), compute("bad", misroute)],
    edges={"a": "bad"},
)

cooperative = Workflow(
    "cooperative",
    description="A step that sleeps cooperatively, then an effect that pays",
    start="nap",
    nodes=[compute("nap", nap), effect("pay", pay), compute("after", step)],
    edges={"nap": "pay", "pay": "after"},
)

patient = Workflow(
    "patient",
    description="A step retried after a durable backoff, a durable sleep, a step",
    start="flaky",
    nodes=[compute("flaky", flaky, retries=1, backoff_s=0.5), sleep("rest", 0.5), compute("after", step)],
    edges={"flaky": "rest", "rest": "after"},
)

def down(ctx):
    mark(ctx)
    raise ConnectionError("the service is down")


def copy(ctx):
    ctx.progress(3, 10, "copying")
    block_on(latch_name(ctx))
    ctx.progress(10, 10, "copied")
    return {"copied": 10}


progressing = Workflow(
    "progressing",
    description="A step that reports its progress, then waits for a latch",
    start="copy",
    nodes=[compute("copy", copy)],
)

def declined(ctx):
    mark(ctx)
    raise PermissionError("the card was declined")


def refund(ctx):
    mark(ctx)
    return {"refunded": True, "because": ctx.outputs["charge"]["error"].splitlines()[0]}


recovering = Workflow(
    "recovering",
    description="A charge that fails after its retry, routed to a refund on its error exit",
    start="charge",
    nodes=[compute("charge", declined, retries=1, backoff_s=0.05), compute("refund", refund)],
    edges={"charge.error": "refund"},
)


def again(ctx):
    return Exit("again", {"round": ctx.attempt})


looping = Workflow(
    "looping",
    description="A cycle that never ends, stopped by the step bound",
    start="ping",
    nodes=[compute("ping", again, exits=["again"]), compute("pong", step)],
    edges={"ping.again": "pong", "pong": "ping"},
    max_steps=6,
)

backing_off = Workflow(
    "backing-off",
    description="A step that always fails, retried after ten minutes",
    start="call",
    nodes=[compute("call", down, retries=2, backoff_s=600)],
)

routed = Workflow(
    "routed",
    description="Routes on a chosen exit",
    start="choose",
    nodes=[compute("choose", choose, exits=["big", "small"]), compute("big", step), compute("small", step)],
    edges={"choose.big": "big", "choose.small": "small"},
)
'''


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a ``tether`` process: no inherited ``TETHER_*`` settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


class Lab:
    """One temporary store, workflows folder and sink, with the processes started on them."""

    def __init__(self, base: Path, url: str | None = None) -> None:
        self.base = base
        self.db = base / "tether.db"
        #: SQLite in the lab folder unless another store URL is given (``sql`` and
        #: ``fingerprint`` read SQLite only).
        self.url = url or f"sqlite:///{self.db}"
        # A package name of its own: the test process loads many labs' folders (``lab.client``),
        # and one package name would make each the other's stale module.
        self.folder = base / f"workflows_{uuid.uuid4().hex[:8]}"
        self.folder.mkdir()
        self.flows = self.folder / "flows.py"
        self.flows.write_text(
            FLOWS.replace("__BASE__", repr(str(base))).replace("__PYTHON__", repr(sys.executable))
        )
        self.sink = base / "sink.jsonl"
        self.processes: list[subprocess.Popen[bytes]] = []
        self._client: Tether | None = None

    # -- processes ---------------------------------------------------------------------------
    def cli(
        self, *args: str, timeout: float = 60, store: bool = True, folder: str | Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run one ``tether`` command to completion in the lab folder."""
        prefix = [str(TETHER)]
        if store:
            prefix += ["--store", self.url]
        prefix += ["--folder", str(folder or self.folder)]
        return subprocess.run(
            [*prefix, *args],
            cwd=self.base,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def worker(
        self,
        runner_id: str,
        *extra: str,
        folder: str | Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a long-lived worker process (its output goes to files in the lab folder), with
        ``env`` added to its environment."""
        out = open(self.base / f"{runner_id}.out", "ab")  # noqa: SIM115 - closed with the process
        err = open(self.base / f"{runner_id}.err", "ab")  # noqa: SIM115
        process = subprocess.Popen(
            [
                str(TETHER),
                "--store",
                self.url,
                "--folder",
                str(folder or self.folder),
                "worker",
                "--runner-id",
                runner_id,
                "--lease-ms",
                str(LEASE_MS),
                "--poll-ms",
                str(POLL_MS),
                *extra,
            ],
            cwd=self.base,
            env=clean_env(**(env or {})),
            stdout=out,
            stderr=err,
        )
        out.close()
        err.close()
        self.processes.append(process)
        return process

    def worker_log(self, runner_id: str) -> str:
        path = self.base / f"{runner_id}.err"
        return path.read_text(errors="replace") if path.exists() else ""

    def shutdown(self) -> None:
        """Stop every process this lab started (by its own pid)."""
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.kill(process.pid, signal.SIGCONT)
                    process.kill()
                except ProcessLookupError:
                    pass
                process.wait(timeout=10)
        if self._client is not None:
            self._client.store.close()

    # -- the store ---------------------------------------------------------------------------
    @property
    def client(self) -> Tether:
        if self._client is None:
            self._client = Tether(self.url, folder=self.folder)
        return self._client

    def start(self, workflow: str, input: Any = None, **kwargs: Any) -> str:
        return self.client.start(workflow, input, **kwargs).run_id

    def view(self, run_id: str) -> RunView:
        view = self.client.store.get_run_view(run_id)
        assert view is not None, f"run {run_id} does not exist"
        return view

    def wait_finished(self, run_id: str, timeout: float = 30) -> RunResult:
        result = wait_for(
            lambda: (r := self.client.result(run_id)).finished and r,
            timeout=timeout,
            what=f"run {run_id} to finish",
        )
        assert isinstance(result, RunResult)
        return result

    def wait_status(self, run_id: str, status: str, timeout: float = 30) -> RunView:
        return wait_for(
            lambda: (v := self.view(run_id)).status == status and v,
            timeout=timeout,
            what=f"run {run_id} to be {status}",
        )

    def events(self, run_id: str) -> list[RunEvent]:
        return self.client.store.events_after(0, run_id=run_id, limit=100_000)

    def event_types(self, run_id: str) -> list[str]:
        return [e.type for e in self.events(run_id)]

    def sql(self, query: str, *params: Any) -> list[sqlite3.Row]:
        """Read the database directly (SELECT only), for what the store API does not expose."""
        connection = sqlite3.connect(self.db, timeout=10)
        connection.row_factory = sqlite3.Row
        try:
            return connection.execute(query, params).fetchall()
        finally:
            connection.close()

    def run_events_raw(self, run_id: str) -> list[sqlite3.Row]:
        """A run's journal with the columns the API leaves out (lease generation, actor)."""
        return self.sql(
            "SELECT e.event_seq, e.event_type, e.actor_type, e.actor_id, e.lease_generation "
            "FROM events e JOIN runs r ON r.resource_id = e.resource_id "
            "WHERE r.run_id = ? ORDER BY e.event_seq",
            run_id,
        )

    def attempts_raw(self, run_id: str) -> list[sqlite3.Row]:
        return self.sql(
            "SELECT attempt_id, node_id, status, lease_generation FROM node_attempts "
            "WHERE run_id = ? ORDER BY started_at, rowid",
            run_id,
        )

    def lease(self, run_id: str) -> sqlite3.Row:
        rows = self.sql(
            "SELECT l.* FROM leases l JOIN runs r ON r.resource_id = l.resource_id WHERE r.run_id = ?",
            run_id,
        )
        assert len(rows) == 1
        return rows[0]

    def fingerprint(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table: equal fingerprints mean nothing was written."""
        tables = [
            r["name"]
            for r in self.sql(
                "SELECT name FROM sqlite_master "
                # Not the live workers' announcements: a worker that stops retires its own.
                "WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name != 'workers' ORDER BY name"
            )
        ]
        return {t: sorted(tuple(r) for r in self.sql(f'SELECT * FROM "{t}"')) for t in tables}

    def changes_since(self, before: dict[str, list[tuple[Any, ...]]]) -> dict[str, dict[str, list[str]]]:
        """Rows added and removed per table since the ``before`` fingerprint (empty: no change)."""
        after = self.fingerprint()
        changed: dict[str, dict[str, list[str]]] = {}
        for table in sorted(set(before) | set(after)):
            old, new = set(before.get(table, [])), set(after.get(table, []))
            if old != new:
                changed[table] = {
                    "added": [repr(r)[:300] for r in sorted(new - old, key=repr)],
                    "removed": [repr(r)[:300] for r in sorted(old - new, key=repr)],
                }
        return changed

    def row_counts(self) -> dict[str, int]:
        return {table: len(rows) for table, rows in self.fingerprint().items()}

    # -- files -------------------------------------------------------------------------------
    def sink_lines(self, run_id: str | None = None) -> list[dict[str, Any]]:
        if not self.sink.exists():
            return []
        lines = [json.loads(line) for line in self.sink.read_text().splitlines() if line.strip()]
        return [line for line in lines if run_id is None or line["run_id"] == run_id]

    def executions(self, run_id: str, node_id: str, phase: str = "run") -> list[dict[str, Any]]:
        return [
            line for line in self.sink_lines(run_id) if line["node_id"] == node_id and line["phase"] == phase
        ]

    def release(self, name: str = "latch") -> None:
        (self.base / name).touch()


def stop_outside_write(process: subprocess.Popen[bytes], db: Path, tries: int = 100) -> None:
    """SIGSTOP ``process`` at a moment it holds no write lock on ``db``, so that the frozen
    process stands for a stalled runner rather than a stalled database."""
    for _ in range(tries):
        os.kill(process.pid, signal.SIGSTOP)
        connection = sqlite3.connect(db, timeout=0.2, isolation_level=None)
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.kill(process.pid, signal.SIGCONT)
            time.sleep(0.01)
        finally:
            connection.close()
    raise AssertionError("the process held the database write lock every time it was stopped")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def lines(text: str) -> Iterator[str]:
    return (line for line in text.splitlines() if line.strip())
