"""``tether serve`` as a real process on each backend: it prints a generated operator token once,
serves health without a token and the API with it, and stops on SIGTERM without a traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]


def test_serve_prints_a_token_and_serves_the_api(store_url: str, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["TETHER_API_READ_TOKEN"] = "a-reader"
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "tether.cli", "--store", store_url, "--folder", str(REPO / "examples")),
            *("serve", "--port", str(port)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith("operator token (shown once"), first
        token = first.rsplit(" ", 1)[1].strip()
        assert len(token) >= 40
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                return httpx.get(f"{base}/healthz").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, timeout=30, what="tether serve to answer")
        assert httpx.get(f"{base}/readyz").json() == {"status": "ready"}
        assert httpx.get(f"{base}/api/v1/runs").status_code == 401
        operator = {"Authorization": f"Bearer {token}"}
        started = httpx.post(
            f"{base}/api/v1/runs",
            headers=operator,
            json={"workflow": "release", "run_id": "served-1", "session_id": "desk"},
        )
        assert started.status_code == 201, started.text
        reader = {"Authorization": "Bearer a-reader"}
        listed = httpx.get(f"{base}/api/v1/runs", headers=reader).json()
        assert [r["run_id"] for r in listed["runs"]] == ["served-1"]
        assert httpx.post(f"{base}/api/v1/runs/served-1/cancel", headers=reader).status_code == 403
        foreign = httpx.get(f"{base}/healthz", headers={"Host": "console.example"})
        assert foreign.status_code == 400
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
    # uvicorn shuts down gracefully, then ends by the signal it caught, as an unhandled SIGTERM would.
    assert process.returncode == -signal.SIGTERM, output
    assert "Traceback" not in output
    assert token not in output
