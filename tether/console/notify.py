"""Webhook notifications: when something waits for a person or a run fails, POST a message.

What is announced: a decision opened (``decision.requested``), an input request opened
(``input.requested``), a run failed (``run.queue_failed``), all read from the journal in order,
and an effect became ambiguous (read from the store's effects, since an effect caught by a cancel
leaves no run event).

Delivery is at least once, from an outbox kept in a state file (``notify_state``): a new event
becomes one pending delivery per URL, written (with the journal position it came from) before
anything is sent; a delivery leaves the outbox only once its receiver answered 2xx. A failed send is
retried with exponential backoff (``backoff_s`` doubling up to ``max_backoff_s``) until
``max_attempts``. A process that dies between a send and its record sends again after a restart,
with the same body and the same ``Idempotency-Key`` header, so a receiver that remembers the keys it
has seen acts once.

Each request carries ``X-Tether-Timestamp`` and ``X-Tether-Signature: sha256=HEX``, the HMAC-SHA256
of ``TIMESTAMP.BODY`` under the shared secret: a receiver recomputes it and refuses a mismatch (and
a stale timestamp). ``slack=True`` sends Slack's incoming-webhook shape (``{"text": ...}``) instead
of the JSON message.

One notifier per state file: two consoles on one store should share one ``notify_state`` only if
they never run at the same time (each would deliver; receivers dedupe by key).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tether.client import Tether
from tether.errors import InvalidInput, TetherError
from tether.store import RunEvent

log = logging.getLogger(__name__)

ANNOUNCED = {
    "decision.requested": "A decision waits for a person",
    "input.requested": "An input request waits for its session",
    "run.queue_failed": "A run failed",
}
#: Deliveries kept for the console's view after they left the outbox.
RECENT = 200


@dataclass
class WebhookConfig:
    urls: tuple[str, ...]
    secret: str = field(repr=False)
    state_path: Path
    public_url: str = "http://127.0.0.1:8080"
    slack: bool = False
    max_attempts: int = 8
    backoff_s: float = 1.0
    max_backoff_s: float = 300.0
    timeout_s: float = 10.0
    poll_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.secret:
            raise InvalidInput("Webhooks need a signing secret (TETHER_WEBHOOK_SECRET)")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise InvalidInput(f"A webhook URL must start with http:// or https://: {url!r}")


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=HEX``: the HMAC-SHA256 of ``TIMESTAMP.BODY`` under ``secret``."""
    digest = hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


class Notifier:
    """Turns journal events into outbox entries and delivers them (see the module docstring)."""

    def __init__(self, tether: Tether, config: WebhookConfig) -> None:
        self.tether = tether
        self.config = config
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._outcomes: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self.state = self._load()

    # -- the outbox file -----------------------------------------------------------------------
    def _load(self) -> dict[str, Any]:
        path = self.config.state_path
        if path.exists():
            state: dict[str, Any] = json.loads(path.read_text("utf-8"))
            return state
        # A new outbox announces what happens from now on, not the store's history.
        return {
            "cursor": self.tether.store.last_event_seq(),
            "effects_seen": [e.effect_id for e in self.tether.store.effects(status="ambiguous")],
            "pending": [],
            "recent": [],
        }

    def _save(self) -> None:
        path = self.config.state_path
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(self.state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    # -- what to announce ------------------------------------------------------------------------
    def _message(self, key: str, kind: str, run_id: str, seq: int | None, summary: str, link: str) -> bytes:
        body: dict[str, Any]
        if self.config.slack:
            body = {"text": f"{summary}: run {run_id} <{link}|open in the console>"}
        else:
            body = {
                "id": key,
                "event": kind,
                "run_id": run_id,
                "seq": seq,
                "summary": summary,
                "link": link,
                "sent_by": "tether",
            }
        return json.dumps(body, sort_keys=True).encode("utf-8")

    def _enqueue(self, source: str, kind: str, run_id: str, seq: int | None, summary: str, path: str) -> None:
        link = self.config.public_url.rstrip("/") + path
        for url in self.config.urls:
            key = hashlib.sha256(f"{source}|{url}".encode()).hexdigest()[:32]
            self.state["pending"].append(
                {
                    "key": key,
                    "url": url,
                    "event": kind,
                    "run_id": run_id,
                    "body": self._message(key, kind, run_id, seq, summary, link).decode("utf-8"),
                    "attempts": 0,
                    "next_at": 0.0,
                    "last_error": None,
                }
            )

    def _announce(self, event: RunEvent) -> None:
        run_path = "/runs/" + quote(event.run_id, safe="")
        path = "/inbox" if event.type in ("decision.requested", "input.requested") else run_path
        summary = ANNOUNCED[event.type]
        if (
            event.type == "run.queue_failed"
            and isinstance(event.payload, dict)
            and event.payload.get("error")
        ):
            summary += f": {str(event.payload['error'])[:200]}"
        self._enqueue(f"seq:{event.seq}", event.type, event.run_id, event.seq, summary, path)

    def collect(self) -> int:
        """Move new events into the outbox (saved before any send); the number added."""
        store = self.tether.store
        with self._lock:
            before = len(self.state["pending"])
            while True:
                batch = store.events_after(self.state["cursor"], limit=500)
                for event in batch:
                    self.state["cursor"] = event.seq
                    if event.type in ANNOUNCED:
                        self._announce(event)
                if len(batch) < 500:
                    break
            seen = set(self.state["effects_seen"])
            for effect in store.effects(status="ambiguous"):
                if effect.effect_id not in seen:
                    seen.add(effect.effect_id)
                    self.state["effects_seen"].append(effect.effect_id)
                    self._enqueue(
                        f"effect:{effect.effect_id}",
                        "effect.ambiguous",
                        effect.run_id,
                        None,
                        f"Effect {effect.effect_type} is ambiguous and waits for an operator",
                        "/inbox",
                    )
            added = len(self.state["pending"]) - before
            self._save()
            return added

    # -- delivery ----------------------------------------------------------------------------
    def send(self, delivery: dict[str, Any]) -> None:
        """POST one delivery; raises on anything but a 2xx answer. Records nothing."""
        body = delivery["body"].encode("utf-8")
        timestamp = str(int(time.time()))
        request = urllib.request.Request(
            delivery["url"],
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "tether-console",
                "Idempotency-Key": delivery["key"],
                "X-Tether-Event": delivery["event"],
                "X-Tether-Timestamp": timestamp,
                "X-Tether-Signature": signature(self.config.secret, timestamp, body),
            },
        )
        with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:
            if not 200 <= response.status < 300:
                raise urllib.error.HTTPError(
                    delivery["url"], response.status, "not 2xx", response.headers, None
                )

    def deliver_due(self, now: float | None = None) -> int:
        """Send every pending delivery whose time has come; the number delivered. Sends happen
        outside the lock, so that a slow receiver does not hold up the console's view."""
        moment = time.time() if now is None else now
        with self._lock:
            due = [d for d in self.state["pending"] if d["next_at"] <= moment]
        delivered = 0
        for delivery in due:
            try:
                self.send(delivery)
                failure: Exception | None = None
            except (OSError, urllib.error.URLError, ValueError) as error:
                failure = error
            with self._lock:
                delivery["attempts"] += 1
                if failure is None:
                    self._finish(delivery, "delivered")
                    delivered += 1
                elif delivery["attempts"] >= self.config.max_attempts:
                    delivery["last_error"] = str(failure)[:300]
                    self._finish(delivery, "failed")
                    log.warning(
                        "webhook %s gave up after %d attempts: %s",
                        delivery["url"],
                        delivery["attempts"],
                        failure,
                    )
                else:
                    delivery["last_error"] = str(failure)[:300]
                    backoff = self.config.backoff_s * 2 ** (delivery["attempts"] - 1)
                    delivery["next_at"] = moment + min(self.config.max_backoff_s, backoff)
                self._save()
        return delivered

    def outcomes(self) -> dict[str, int]:
        """Deliveries finished since this notifier started, by outcome (delivered, failed)."""
        with self._lock:
            return dict(self._outcomes)

    def _finish(self, delivery: dict[str, Any], outcome: str) -> None:
        self._outcomes[outcome] = self._outcomes.get(outcome, 0) + 1
        self.state["pending"].remove(delivery)
        self.state["recent"] = [
            *self.state["recent"][-(RECENT - 1) :],
            {**delivery, "outcome": outcome, "finished_at": time.time()},
        ]

    def view(self) -> dict[str, Any]:
        """The outbox and the latest finished deliveries, for the console (no secret in it)."""
        with self._lock:
            return {
                "urls": list(self.config.urls),
                "pending": [dict(d) for d in self.state["pending"]],
                "recent": [dict(d) for d in reversed(self.state["recent"])],
            }

    # -- the thread ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tether-notifier", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.config.timeout_s + 5)

    def _run(self) -> None:
        with self.tether.store.changes.subscription("events") as changed:
            while not self._stop.is_set():
                changed.clear()
                try:
                    self.collect()
                    self.deliver_due()
                except TetherError as error:  # the store is unavailable for now: try again later
                    log.warning("notifications: %s", error)
                except Exception:  # keep notifying after anything else, and say what happened
                    log.exception("notifications: unexpected failure")
                changed.wait(self.config.poll_s)
