"""What a real ``tether worker`` process says and survives: a step calling ``sys.exit()`` fails
its run (with the traceback kept) while the worker goes on; ``--log-format json`` writes one JSON
object per line with the run's structured fields."""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any

import pytest

from tests.integration.support import LEASE_MS, POLL_MS, TETHER, Lab, clean_env

pytestmark = pytest.mark.slow

FLOWS = """
import sys

from tether.engine.graph import Workflow, compute


def leave(ctx):
    sys.exit(2)


def fine(ctx):
    return {"ok": True}


exiting = Workflow("exiting", start="a", nodes=[compute("a", leave)])
quick = Workflow(
    "quick", start="one", nodes=[compute("one", fine), compute("two", fine)], edges={"one": "two"}
)
"""


def _worker(lab: Lab, name: str, *extra: str) -> subprocess.Popen[bytes]:
    err = open(lab.base / f"{name}.err", "ab")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        [
            str(TETHER),
            "--store",
            lab.url,
            "--folder",
            str(lab.folder),
            "--log-level",
            "INFO",
            "worker",
            "--runner-id",
            name,
            "--lease-ms",
            str(LEASE_MS),
            "--poll-ms",
            str(POLL_MS),
            *extra,
        ],
        cwd=lab.base,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    err.close()
    lab.processes.append(process)
    return process


def _records(lab: Lab, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lab.worker_log(name).splitlines() if line.strip()]


def test_worker__sys_exit_in_a_step_fails_the_run_and_json_logs_tell_the_story(any_lab: Lab) -> None:
    lab = any_lab
    (lab.folder / "exits.py").write_text(FLOWS)
    worker = _worker(lab, "host-logs", "--log-format", "json", "--concurrency", "1")

    bad = lab.start("exiting")
    failed = lab.wait_finished(bad)
    assert (failed.status, failed.error_code) == ("failed", "nodeFailed")
    assert "SystemExit: 2" in (failed.error_message or "")
    [attempt] = lab.client.store.attempts(bad)
    assert "Traceback" in (attempt.error_message or "") and "sys.exit(2)" in (attempt.error_message or "")

    good = lab.start("quick")  # the one run thread survived the step's sys.exit()
    assert lab.wait_finished(good).status == "done"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0

    records = _records(lab, "host-logs")  # every line parses as JSON
    about = {run: [r for r in records if r.get("run_id") == run] for run in (bad, good)}
    claimed = [r for r in about[bad] if "claimed" in r["message"]]
    assert claimed and claimed[0]["level"] == "INFO" and claimed[0]["logger"] == "tether.runner"
    assert claimed[0]["workflow"] == "exiting" and claimed[0]["runner_id"].startswith("host-logs#")
    [failure] = [r for r in about[bad] if "failed after" in r["message"]]
    assert (failure["node"], failure["attempt"]) == ("a", 1)
    assert failure["duration_s"] >= 0 and "SystemExit: 2" in failure["message"]
    steps = [
        (r["node"], r["message"].rsplit(" ", 1)[-1]) for r in about[good] if "node" in r and "attempt" in r
    ]
    assert ("one", "started") in steps and ("two", "started") in steps
    finished = [r for r in about[good] if "finished in" in r["message"]]
    assert [r["node"] for r in finished] == ["one", "two"]
    assert all(isinstance(r["duration_s"], float) for r in finished)
    assert any(r["message"] == f"run {good} completed" for r in about[good])


def _console_spans(text: str) -> list[dict[str, Any]]:
    """The spans OpenTelemetry's console exporter printed: JSON objects one after another."""
    decoder, spans, at = json.JSONDecoder(), [], 0
    while (start := text.find("{", at)) != -1:
        span, at = decoder.raw_decode(text, start)
        spans.append(span)
    return spans


def test_worker__trace_exports_a_span_per_run_and_step(lab: Lab) -> None:
    (lab.folder / "exits.py").write_text(FLOWS)
    started = lab.cli("start", "quick")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    result = subprocess.run(
        [str(TETHER), "--store", lab.url, "--folder", str(lab.folder), "worker", "--until-idle", "--trace"],
        cwd=lab.base,
        env=clean_env(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="billing-worker"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    spans = [s for s in _console_spans(result.stdout) if s["attributes"].get("tether.run_id") == run_id]
    assert sorted(s["name"] for s in spans) == ["tether.run", "tether.step one", "tether.step two"]
    from tether.engine.tracing import trace_id_of

    assert {s["context"]["trace_id"] for s in spans} == {f"0x{trace_id_of(run_id):032x}"}
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"billing-worker"}


def test_worker__an_unknown_trace_exporter_is_refused_in_one_line(lab: Lab) -> None:
    (lab.folder / "exits.py").write_text(FLOWS)
    result = subprocess.run(
        [str(TETHER), "--store", lab.url, "--folder", str(lab.folder), "worker", "--until-idle", "--trace"],
        cwd=lab.base,
        env=clean_env(OTEL_TRACES_EXPORTER="zipkin"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "OTEL_TRACES_EXPORTER='zipkin' is not supported here: use otlp or console" in result.stderr
