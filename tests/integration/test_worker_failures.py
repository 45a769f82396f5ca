"""Real worker processes that die, freeze, stop on a signal or crash on a poison run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import urllib.request
from collections import Counter

import pytest

from tests.integration.support import Lab, pid_alive, stop_outside_write, wait_for

pytestmark = pytest.mark.slow


def completed(lab: Lab, run_id: str) -> dict[str, object]:
    """Output of each completed node; fails when any node completed more than once."""
    attempts = [a for a in lab.client.store.attempts(run_id) if a.status == "completed"]
    counts = Counter(a.node_id for a in attempts)
    assert all(n == 1 for n in counts.values()), f"a node completed twice: {counts}"
    return {a.node_id: a.output for a in attempts}


def test_kill_9_mid_node_resumes_from_last_committed_node_on_another_worker(lab: Lab) -> None:
    run_id = lab.start("steps", {"latch": "gate-latch"})
    first = lab.worker("host-first")
    wait_for(lambda: lab.executions(run_id, "gate"), what="the gate node to start")
    assert [a.node_id for a in lab.client.store.attempts(run_id)] == ["a", "b", "gate"]

    os.kill(first.pid, signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    lab.release("gate-latch")
    second = lab.worker("host-second")
    result = lab.wait_finished(run_id)

    assert (result.status, result.run_state_status) == ("done", "completed")
    outputs = completed(lab, run_id)
    assert list(outputs) == ["a", "b", "gate", "d"]
    # a and b committed before the crash: their outputs come from the first process only.
    assert outputs["a"] == {"node": "a", "pid": first.pid}
    assert outputs["b"] == {"node": "b", "pid": first.pid}
    assert outputs["gate"] == {"node": "gate", "pid": second.pid}
    assert outputs["d"] == {"node": "d", "pid": second.pid}
    # The sink proves what executed where: committed nodes never ran again.
    assert [x["pid"] for x in lab.executions(run_id, "a")] == [first.pid]
    assert [x["pid"] for x in lab.executions(run_id, "b")] == [first.pid]
    assert [x["pid"] for x in lab.executions(run_id, "gate")] == [first.pid, second.pid]
    assert [x["pid"] for x in lab.executions(run_id, "d")] == [second.pid]
    statuses = [(a.node_id, a.status) for a in lab.client.store.attempts(run_id)]
    assert statuses == [
        ("a", "completed"),
        ("b", "completed"),
        ("gate", "interrupted"),
        ("gate", "completed"),
        ("d", "completed"),
    ]
    types = lab.event_types(run_id)
    assert types.count("node.interrupted") == 1
    assert types.count("run.queue_done") == 1
    assert result.output == {"node": "d", "pid": second.pid}
    assert "Traceback" not in lab.worker_log("host-second")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _counts(port: int) -> dict[str, float]:
    """A worker's own counts, scraped from its --metrics-port."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode("utf-8")
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_stale_worker_resumed_after_takeover_cannot_write(lab: Lab) -> None:
    run_id = lab.start("steps", {"latch": "stale-latch"})
    stale_port, fresh_port = _free_port(), _free_port()
    stale = lab.worker("host-stale", "--metrics-port", str(stale_port))
    wait_for(lambda: lab.executions(run_id, "gate"), what="the gate node to start")
    stale_generation = lab.lease(run_id)["generation"]

    stop_outside_write(stale, lab.db)
    # Both gates (the frozen one and the new one) find the latch open.
    lab.release("stale-latch")
    fresh = lab.worker("host-fresh", "--metrics-port", str(fresh_port))
    lab.wait_finished(run_id)
    takeover = next(
        e
        for e in lab.run_events_raw(run_id)
        if e["event_type"] == "lease.claimed" and (e["actor_id"] or "").startswith("host-fresh#")
    )
    assert takeover["lease_generation"] > stale_generation
    before = lab.fingerprint()

    os.kill(stale.pid, signal.SIGCONT)
    wait_for(
        lambda: [x for x in lab.executions(run_id, "gate", "end") if x["pid"] == stale.pid],
        what="the stale gate to return",
    )
    # Each worker counts what happened to it: the takeover, and the stale write refused.
    refused = wait_for(
        lambda: (c := _counts(stale_port))["tether_worker_stale_writes_refused_total"] >= 1 and c,
        what="the stale worker to count its refused write",
    )
    assert refused["tether_worker_takeovers_total"] == 0
    took = _counts(fresh_port)
    assert took["tether_worker_takeovers_total"] == 1
    assert took["tether_worker_stale_writes_refused_total"] == 0
    assert took["tether_worker_runs_claimed_total"] >= 1
    # Stopping the stale worker joins its run thread, so its write attempt is over when it exits.
    stale.send_signal(signal.SIGTERM)
    assert stale.wait(timeout=15) == 0

    assert lab.fingerprint() == before, "the stale worker wrote after the takeover"
    events = lab.run_events_raw(run_id)
    after = [e for e in events if e["event_seq"] > takeover["event_seq"]]
    assert after, "the fresh worker recorded its progress"
    assert all(e["lease_generation"] != stale_generation for e in after)
    assert all(not (e["actor_id"] or "").startswith("host-stale#") for e in after)
    attempts = lab.attempts_raw(run_id)
    stale_attempts = [
        (a["node_id"], a["status"]) for a in attempts if a["lease_generation"] == stale_generation
    ]
    assert stale_attempts == [("a", "completed"), ("b", "completed"), ("gate", "interrupted")]
    assert [e["event_type"] for e in events].count("run.queue_done") == 1
    outputs = completed(lab, run_id)
    assert outputs["gate"] == {"node": "gate", "pid": fresh.pid}
    assert lab.view(run_id).status == "done"
    fresh.send_signal(signal.SIGTERM)
    assert fresh.wait(timeout=15) == 0


def test_sigterm_parks_the_run_and_exits_zero_then_another_worker_completes_it(lab: Lab) -> None:
    run_id = lab.start("slowshell")
    first = lab.worker("host-term")
    command = wait_for(lambda: lab.executions(None, "wait"), what="the command to start")[0]
    assert command["ppid"] == first.pid

    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=15) == 0
    assert not pid_alive(command["pid"]), "the command outlived its worker"
    view = lab.view(run_id)
    assert (view.status, view.run_state_status) == ("parked", "running")
    lease = lab.lease(run_id)
    assert lease["owner_id"] is None and lease["token_hash"] is None and lease["expires_at"] is None
    attempts = lab.client.store.attempts(run_id)
    assert [(a.node_id, a.status) for a in attempts] == [("prep", "completed"), ("wait", "interrupted")]
    assert attempts[1].error_message == "interrupted by runner shutdown"
    parked = [e for e in lab.events(run_id) if e.type == "run.queue_parked"]
    assert [(e.runner_id or "").partition("#")[0] for e in parked] == ["host-term"]

    lab.release("latch-shell")
    second = lab.worker("host-after")
    result = lab.wait_finished(run_id)
    assert (result.status, result.run_state_status) == ("done", "completed")
    outputs = completed(lab, run_id)
    assert list(outputs) == ["prep", "wait", "after"]
    assert outputs["wait"]["stdout"] == "released\n"  # type: ignore[index]
    assert [x["pid"] for x in lab.executions(run_id, "prep")] == [first.pid]
    assert [x["pid"] for x in lab.executions(run_id, "after")] == [second.pid]
    assert [x["ppid"] for x in lab.executions(None, "wait")] == [first.pid, second.pid]
    assert "Traceback" not in lab.worker_log("host-term") + lab.worker_log("host-after")


def test_poison_run_fails_after_max_takeovers_while_a_healthy_run_completes(lab: Lab) -> None:
    poison = lab.start("poison")
    healthy = lab.start("healthy")
    workers: list[subprocess.Popen[bytes]] = []

    def supervise() -> bool:
        """Respawn the worker whenever it died; done when both runs are finished."""
        if not workers or workers[-1].poll() is not None:
            workers.append(
                lab.worker(f"host-w{len(workers) + 1}", "--max-takeovers", "2", "--concurrency", "1")
            )
        return lab.client.result(poison).finished and lab.client.result(healthy).finished

    wait_for(supervise, timeout=40, what="both runs to finish")

    result = lab.client.result(poison)
    assert (result.status, result.run_state_status) == ("failed", "failed")
    assert result.error_code == "poisonRun"
    assert "stopped 2 times while running node boom (limit 2)" in (result.error_message or "")
    assert lab.event_types(poison).count("node.interrupted") == 2
    booms = lab.executions(poison, "boom")
    assert len(booms) == 2 and len({x["pid"] for x in booms}) == 2
    assert len(lab.executions(poison, "a")) == 1
    died = [w for w in workers if w.poll() is not None]
    assert [w.returncode for w in died] == [-signal.SIGKILL, -signal.SIGKILL]
    assert len(workers) == 3
    assert lab.client.result(healthy).status == "done"
    assert completed(lab, healthy).keys() == {"one", "two"}
    assert all(x["pid"] != booms[0]["pid"] for x in lab.sink_lines(healthy))
