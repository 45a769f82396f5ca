"""The streaming side of the model providers' wire formats, for the local fake servers: a reply
recorded as one JSON body, sent as the server-sent events a streaming request gets instead
(chat-completions chunks, or Anthropic Messages stream events)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def _event(data: Any, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return (head + "data: " + json.dumps(data) + "\n\n").encode()


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def openai_events(reply: dict[str, Any], piece: int = 8) -> Iterator[bytes]:
    """A chat completion as ``chat.completion.chunk`` events: the content in pieces of ``piece``
    characters, each tool call's arguments in two pieces, the usage in a last chunk."""
    message = reply["choices"][0]["message"]
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""})
    content = message.get("content")
    if content:
        for part in _pieces(content, piece):
            yield chunk({"content": part})
    for index, call in enumerate(message.get("tool_calls") or []):
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": arguments[:half]},
                    }
                ]
            }
        )
        yield chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]})
    yield chunk({}, "tool_calls" if message.get("tool_calls") else "stop")
    if reply.get("usage"):
        usage = dict(reply["usage"])
        usage.setdefault("total_tokens", usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0))
        yield _event({**base, "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"


def anthropic_events(reply: dict[str, Any], piece: int = 8) -> Iterator[bytes]:
    """A Messages reply as its stream events: text blocks in pieces of ``piece`` characters,
    tool_use blocks with their input as JSON in two pieces."""
    usage = reply.get("usage") or {"input_tokens": 0, "output_tokens": 0}
    start = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": usage.get("input_tokens", 0), "output_tokens": 0},
    }
    yield _event({"type": "message_start", "message": start}, "message_start")
    for index, block in enumerate(reply.get("content") or []):
        if block["type"] == "text":
            opened: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": part} for part in _pieces(block["text"], piece)]
        else:
            opened = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            arguments = json.dumps(block.get("input") or {})
            half = len(arguments) // 2
            deltas = [
                {"type": "input_json_delta", "partial_json": arguments[:half]},
                {"type": "input_json_delta", "partial_json": arguments[half:]},
            ]
        yield _event(
            {"type": "content_block_start", "index": index, "content_block": opened}, "content_block_start"
        )
        for delta in deltas:
            yield _event(
                {"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"
            )
        yield _event({"type": "content_block_stop", "index": index}, "content_block_stop")
    stop = "tool_use" if any(b["type"] == "tool_use" for b in reply.get("content") or []) else "end_turn"
    yield _event(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": usage.get("output_tokens", 0)},
        },
        "message_delta",
    )
    yield _event({"type": "message_stop"}, "message_stop")


def events_for(body: dict[str, Any], reply: dict[str, Any], piece: int = 8) -> Iterator[bytes]:
    """The stream events for ``reply`` in the wire format of the request ``body``."""
    return anthropic_events(reply, piece) if "max_tokens" in body else openai_events(reply, piece)
