"""A runner embedded in an application process, as an integrator runs it: started in background
threads, its signal handlers chained to the application's own, stopped with a timeout while a step
hangs (the run handed back for another worker, the late result refused)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.integration.support import LEASE_MS, POLL_MS, Lab, clean_env, wait_for

pytestmark = pytest.mark.slow

APP = """
import signal, sys, threading

from tether.client import Tether
from tether.engine.runner import Runner, RunnerConfig

stopped = threading.Event()

def application_handler(signum, frame):
    print("application heard", signum, flush=True)
    stopped.set()

signal.signal(signal.SIGTERM, application_handler)
tether = Tether(sys.argv[1], folder=sys.argv[2])
runner = Runner(tether.store, tether.registry, runner_id="embedded",
                config=RunnerConfig(lease_ms=int(sys.argv[3]), poll_ms=int(sys.argv[4])))
runner.install_signal_handlers()
runner.start()
print("ready", flush=True)
stopped.wait(60)
finished = runner.stop(timeout=2.0)
print("stopped", finished, flush=True)
tether.store.close()
"""


def test_embedded_runner__sigterm_reaches_the_app_and_stop_with_a_timeout_hands_the_hung_run_back(
    any_lab: Lab,
) -> None:
    lab = any_lab
    run_id = lab.start("steps")  # a, b, then a gate that waits for a latch file, then d
    app = subprocess.Popen(
        [sys.executable, "-c", APP, lab.url, str(lab.folder), str(LEASE_MS), str(POLL_MS)],
        cwd=lab.base,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lab.processes.append(app)  # type: ignore[arg-type]
    wait_for(lambda: lab.executions(run_id, "gate"), what="the gate step to hang")

    app.send_signal(signal.SIGTERM)
    out, err = app.communicate(timeout=30)
    assert app.returncode == 0, err
    assert out.splitlines() == ["ready", f"application heard {int(signal.SIGTERM)}", "stopped True"]
    assert "Traceback" not in err
    attempts = [(a.node_id, a.status) for a in lab.client.store.attempts(run_id)]
    assert attempts == [("a", "completed"), ("b", "completed"), ("gate", "interrupted")]
    assert lab.view(run_id).status in ("queued", "parked")

    lab.release()
    lab.worker("host-after")
    result = lab.wait_finished(run_id)
    assert result.status == "done"
    assert [a.node_id for a in lab.client.store.attempts(run_id) if a.status == "completed"] == [
        "a",
        "b",
        "gate",
        "d",
    ]
