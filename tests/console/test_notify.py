"""Webhook notifications against a local HTTP receiver: signed, retried after a 500, delivered
again with the same idempotency key after a crash between send and record, and driven by the
console's own notifier thread with the deliveries visible in the API."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.console.conftest import HOSTS, OPERATOR, Console, wait_until
from tether.console import ConsoleConfig, create_app
from tether.console.notify import Notifier, WebhookConfig

SECRET = "webhook-secret-for-tests"


class Receiver:
    """A local webhook receiver: answers the queued statuses (then 200) and acts once per key."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        self.acted: dict[str, dict[str, Any]] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.received.append((headers, body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                if status == 200:
                    receiver.acted.setdefault(headers["idempotency-key"], json.loads(body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    try:
        yield found
    finally:
        found.server.shutdown()
        found.server.server_close()


def webhooks(receiver: Receiver, tmp_path: Path, **options: Any) -> WebhookConfig:
    settings: dict[str, Any] = {"backoff_s": 0.01, "poll_s": 0.05, **options}
    return WebhookConfig(
        urls=(receiver.url,),
        secret=SECRET,
        state_path=tmp_path / "outbox.json",
        public_url="http://console.example",
        **settings,
    )


def test_a_decision_is_announced_signed_and_retried_after_a_500(
    console: Console, receiver: Receiver, tmp_path: Path
) -> None:
    notifier = Notifier(console.client, webhooks(receiver, tmp_path))
    console.engine.runner()
    run_id = console.start("approval")
    wait_until(lambda: console.client.decisions(run_id), what="a decision")
    assert notifier.collect() == 1
    receiver.statuses = [500]
    assert notifier.deliver_due() == 0
    (pending,) = notifier.view()["pending"]
    assert pending["attempts"] == 1 and "500" in pending["last_error"]
    assert notifier.deliver_due(now=pending["next_at"] + 0.001) == 1
    assert notifier.view()["pending"] == []

    first, second = receiver.received
    assert first[0]["idempotency-key"] == second[0]["idempotency-key"]
    assert first[1] == second[1]
    for headers, body in receiver.received:
        expected = hmac.new(
            SECRET.encode(), headers["x-tether-timestamp"].encode() + b"." + body, hashlib.sha256
        )
        assert headers["x-tether-signature"] == "sha256=" + expected.hexdigest()
    message = json.loads(second[1])
    assert message["event"] == "decision.requested" and message["run_id"] == run_id
    assert message["link"] == "http://console.example/inbox"
    (delivered,) = notifier.view()["recent"]
    assert (delivered["outcome"], delivered["attempts"]) == ("delivered", 2)
    assert SECRET not in json.dumps(notifier.view())


def test_a_crash_between_send_and_record_delivers_once_per_key(
    console: Console, receiver: Receiver, tmp_path: Path
) -> None:
    config = webhooks(receiver, tmp_path)
    crashed = Notifier(console.client, config)
    run_id = console.start("broken")
    console.engine.runner()
    console.wait_status(run_id, "failed")
    assert crashed.collect() == 1
    # The send lands, and the process dies before it records the delivery.
    crashed.send(crashed.view()["pending"][0])

    restarted = Notifier(console.client, config)
    assert restarted.collect() == 0
    assert restarted.deliver_due() == 1
    assert len(receiver.received) == 2
    assert receiver.received[0][0]["idempotency-key"] == receiver.received[1][0]["idempotency-key"]
    (message,) = receiver.acted.values()
    assert message["event"] == "run.queue_failed" and "the disk is on fire" in message["summary"]
    assert Notifier(console.client, config).collect() == 0


def test_gives_up_after_the_last_attempt(console: Console, receiver: Receiver, tmp_path: Path) -> None:
    notifier = Notifier(console.client, webhooks(receiver, tmp_path, max_attempts=2, slack=True))
    console.engine.runner()
    run_id = console.start("broken")
    console.wait_status(run_id, "failed")
    notifier.collect()
    receiver.statuses = [503, 503]
    notifier.deliver_due()
    notifier.deliver_due(now=notifier.view()["pending"][0]["next_at"] + 0.001)
    assert notifier.view()["pending"] == []
    assert notifier.view()["recent"][0]["outcome"] == "failed"
    assert notifier.outcomes() == {"failed": 1}
    assert list(json.loads(receiver.received[0][1])) == ["text"]


def test_the_console_delivers_by_itself_and_shows_the_outbox(
    console: Console, receiver: Receiver, tmp_path: Path
) -> None:
    config = ConsoleConfig(
        operator_tokens=(OPERATOR,), allowed_hosts=HOSTS, webhooks=webhooks(receiver, tmp_path)
    )
    app = create_app(config, console.client)
    with TestClient(app, headers={"Authorization": f"Bearer {OPERATOR}"}) as api:
        console.engine.runner()
        run_id = console.start("asked", session_id="chat-9")
        wait_until(lambda: receiver.acted, what="a delivered notification")
        (message,) = receiver.acted.values()
        assert (message["event"], message["run_id"]) == ("input.requested", run_id)
        shown = wait_until(
            lambda: api.get("/api/v1/notifications").json()["recent"], what="a recorded delivery"
        )
        assert shown[0]["outcome"] == "delivered"
        page = api.get("/notifications")
        assert "input.requested" in page.text and "delivered" in page.text
        metrics = api.get("/metrics").text
        assert 'tether_notification_deliveries_total{outcome="delivered"} 1.0' in metrics
