"""Streamed turns: the text a model streams while an agent step's turn runs is visible through the
client before the turn is recorded, at a bounded rate, and the recorded turn supersedes it (a slow
streaming local server on both wire formats, both stores). Also: a missing SDK extra is named."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tether.engine.graph import Workflow, agent
from tether.engine.providers import AnthropicProvider, OpenAICompatibleProvider, streams_text
from tether.errors import InvalidInput
from tether.store import live_text_of
from tether.store.turns import TEXT_EVENT

from ..model_wire import events_for
from .conftest import Engine, wait_until

ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
FINAL = json.dumps({"answer": "The tide comes in twice a day, as the moon pulls the sea."})
#: Where the server stops streaming until the test lets it go on.
HELD_AT = 4


class _SlowServer:
    """A model endpoint that streams its answer a few characters at a time and stops after
    ``HELD_AT`` events until ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.streamed: list[bool] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                server.streamed.append(bool(body.get("stream")))
                if "max_tokens" in body:
                    reply: dict[str, Any] = {
                        "content": [{"type": "text", "text": FINAL}],
                        "usage": {"input_tokens": 9, "output_tokens": 20},
                    }
                else:
                    reply = {
                        "choices": [{"message": {"role": "assistant", "content": FINAL}}],
                        "usage": {"prompt_tokens": 9, "completion_tokens": 20},
                    }
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for n, event in enumerate(events_for(body, reply, piece=6)):
                    if n == HELD_AT:
                        server.release.wait(30)
                    self.wfile.write(event)
                    self.wfile.flush()
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def slow() -> Iterator[_SlowServer]:
    served = _SlowServer()
    try:
        yield served
    finally:
        served.close()


def _provider(wire: str, url: str) -> Any:
    if wire == "anthropic":
        return AnthropicProvider(model="claude-test", api_key="sk-test", base_url=url, timeout_s=30)
    return OpenAICompatibleProvider(base_url=url + "/v1", model="m", api_key="k", timeout_s=30)


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_streaming__partial_text_is_visible_before_the_turn_is_recorded(
    engine: Engine, slow: _SlowServer, wire: str
) -> None:
    wf = Workflow(
        f"stream-{wire}",
        start="think",
        nodes=[agent("think", _provider(wire, slow.url), "Why are there tides?", schema=ANSWER, max_turns=3)],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start(f"stream-{wire}")
    live = wait_until(
        lambda: engine.client.live_text(run.run_id).get("think"), what="the streamed text to show"
    )
    # The server holds the rest back: what shows is the start of the answer, and no turn is
    # recorded yet.
    assert live.text and FINAL.startswith(live.text) and live.text != FINAL
    assert (live.node_id, live.index) == ("think", 2)
    assert [m.role for m in engine.client.conversation(run.run_id)] == ["user"]
    slow.release.set()
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output == json.loads(FINAL)
    assert slow.streamed == [True]
    # The recorded turn supersedes the live text; the journal got a few entries, not one a piece.
    assert engine.client.live_text(run.run_id) == {}
    entries = engine.store.events_after(0, run_id=run.run_id, event_type=TEXT_EVENT, limit=1000)
    assert 1 <= len(entries) < len(FINAL) // 6
    recorded = engine.client.conversation(run.run_id)
    assert recorded[-1].body["content"] == json.loads(FINAL)


def test_live_text_of__joins_pieces_and_drops_a_recorded_turn(engine: Engine) -> None:
    from datetime import UTC, datetime

    from tether.store import RunEvent

    def entry(seq: int, kind: str, **payload: Any) -> RunEvent:
        return RunEvent(seq, datetime.now(UTC), "r1", "wf", kind, None, {"nodeId": "a", **payload})

    pieces = [
        entry(1, TEXT_EVENT, conversation="c", index=2, offset=0, text="Hel"),
        entry(2, TEXT_EVENT, conversation="c", index=2, offset=3, text="lo, "),
        # An entry whose write failed is carried again by the next one, from its offset.
        entry(3, TEXT_EVENT, conversation="c", index=2, offset=7, text="wor"),
        entry(4, TEXT_EVENT, conversation="c", index=2, offset=5, text=", world"),
    ]
    assert live_text_of(pieces)["a"].text == "Hello, world"
    recorded = entry(5, "agent.message", conversation="c", index=2, role="assistant", message={})
    assert live_text_of([*pieces, recorded]) == {}
    earlier = entry(5, "agent.message", conversation="c", index=1, role="user", message={})
    assert live_text_of([*pieces, earlier])["a"].text == "Hello, world"


def test_streams_text__only_providers_whose_turn_takes_on_text() -> None:
    class Plain:
        def turn(self, messages: Any, tools: Any, schema: Any) -> None: ...

    class Streaming:
        def turn(self, messages: Any, tools: Any, schema: Any, on_text: Any = None) -> None: ...

    assert not streams_text(Plain()) and streams_text(Streaming())
    assert streams_text(OpenAICompatibleProvider(base_url="http://127.0.0.1:9", model="m"))


@pytest.mark.parametrize("package", ["openai", "anthropic"])
def test_sdk_extra__a_missing_sdk_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, package: str
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # import fails as when it is not installed
    with pytest.raises(InvalidInput, match=rf"pip install 'tether\[{package}\]'"):
        _provider(package, "http://127.0.0.1:9")
