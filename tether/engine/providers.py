"""Model providers for agent nodes.

A provider answers one prompt (``complete(prompt, schema) -> JSON``: an agent without tools), or
takes one turn of a conversation (``turn(messages, tools, schema) -> Turn``: the model calls tools
or gives its final answer, with the tokens it used when the provider reports them).

``ScriptedProvider`` answers from a list (tests, examples, offline demos). ``OpenAICompatibleProvider``
calls a chat-completions endpoint over HTTP with the standard library only, tool calls included.

A conversation's messages are JSON objects with a ``role`` (``user``, ``assistant``, ``tool``):
``content`` (text, or the JSON answer), an assistant's ``toolCalls`` (``id``, ``name``,
``arguments``) and ``usage``, a tool result's ``toolCallId`` and ``name``.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tether.errors import InvalidInput, ProviderError
from tether.values import Json


class Provider(Protocol):
    def complete(self, prompt: str, schema: dict[str, Any]) -> Json: ...


@dataclass(frozen=True)
class ToolCall:
    """The model asks for ``name`` to be called with ``arguments`` (``id``: the model's handle,
    given back with the result)."""

    name: str
    arguments: Json
    id: str = ""


@dataclass(frozen=True)
class Usage:
    """Tokens a turn used, as the provider reports them."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class Turn:
    """One model response: tool calls to make, or (without calls) the final ``answer``."""

    calls: Sequence[ToolCall] = ()
    answer: Json = None
    usage: Usage | None = None


class TurnProvider(Protocol):
    def turn(
        self,
        messages: Sequence[Mapping[str, Json]],
        tools: Sequence[Mapping[str, Json]],
        schema: dict[str, Any],
    ) -> Turn: ...


def takes_turns(provider: Any) -> bool:
    """Whether ``provider`` can hold a conversation (has ``turn``)."""
    return callable(getattr(provider, "turn", None))


class ScriptedProvider:
    """Answers from a script: each call takes the next response (or calls it with the prompt).

    For a conversation (``turn``), a response is a ``Turn`` (tool calls, or a final answer), a
    JSON value (the final answer), or a function of the messages so far returning either."""

    def __init__(self, responses: Sequence[Json | Turn | Callable[..., Json | Turn]]) -> None:
        self._responses = list(responses)
        self._lock = threading.Lock()
        self.prompts: list[str] = []
        #: The messages each turn was asked with.
        self.turns: list[list[dict[str, Json]]] = []

    def _next(self) -> Json | Turn | Callable[..., Json | Turn]:
        with self._lock:
            if not self._responses:
                raise ProviderError("The scripted provider has no responses left")
            return self._responses.pop(0)

    def turn(
        self,
        messages: Sequence[Mapping[str, Json]],
        tools: Sequence[Mapping[str, Json]],
        schema: dict[str, Any],
    ) -> Turn:
        response = self._next()
        seen = [dict(m) for m in messages]
        with self._lock:
            self.turns.append(seen)
        value = response(seen) if callable(response) else response
        return value if isinstance(value, Turn) else Turn(answer=value)

    def complete(self, prompt: str, schema: dict[str, Any]) -> Json:
        response = self._next()
        with self._lock:
            self.prompts.append(prompt)
        value = response(prompt) if callable(response) else response
        if isinstance(value, Turn):
            raise ProviderError("A scripted Turn answers a conversation turn, not a single prompt")
        return value


class OpenAICompatibleProvider:
    """A chat-completions endpoint (``POST {base_url}/chat/completions``) asked for a JSON object."""

    def __init__(
        self, *, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 60
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InvalidInput("base_url must be an http(s) URL")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s

    def complete(self, prompt: str, schema: dict[str, Any]) -> Json:
        body: dict[str, Json] = {
            "model": self.model,
            "messages": [
                {
                    "role": "system",
                    "content": "Answer with one JSON object matching this schema: " + json.dumps(schema),
                },
                {"role": "user", "content": prompt},
            ],
            "response_format": {"type": "json_object"},
        }
        reply = self._post(body)
        try:
            content = reply["choices"][0]["message"]["content"]
            return json.loads(content) if isinstance(content, str) else content
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise ProviderError(f"The model provider's answer is not a JSON completion: {error}") from error

    def turn(
        self,
        messages: Sequence[Mapping[str, Json]],
        tools: Sequence[Mapping[str, Json]],
        schema: dict[str, Any],
    ) -> Turn:
        """One chat-completions request with the conversation and the tools (``tools`` in the
        wire format); the reply's ``tool_calls``, or its content as the final answer (JSON when
        it parses, else the text, which the schema then refuses)."""
        instructions = "Give your final answer as one JSON object matching this schema: " + json.dumps(schema)
        if tools:
            instructions = "You may call the tools you are given first. " + instructions
        body: dict[str, Json] = {
            "model": self.model,
            "messages": [{"role": "system", "content": instructions}, *map(_wire_message, messages)],
            "response_format": {"type": "json_object"},
        }
        if tools:
            body["tools"] = [{"type": "function", "function": dict(t)} for t in tools]
        reply = self._post(body)
        try:
            message = reply["choices"][0]["message"]
            calls = [
                ToolCall(
                    name=str(call["function"]["name"]),
                    arguments=_parsed(call["function"].get("arguments") or "{}"),
                    id=str(call.get("id") or ""),
                )
                for call in message.get("tool_calls") or []
            ]
            used = reply.get("usage") or {}
            usage = (
                Usage(int(used.get("prompt_tokens") or 0), int(used.get("completion_tokens") or 0))
                if used
                else None
            )
            if calls:
                return Turn(calls=calls, usage=usage)
            content = message.get("content")
            return Turn(answer=_parsed(content) if isinstance(content, str) else content, usage=usage)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            raise ProviderError(f"The model provider's answer is not a chat completion: {error}") from error

    def _post(self, body: dict[str, Json]) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            f"{self.base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers=headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as error:
            raise ProviderError(f"The model provider answered HTTP {error.code}") from error
        except (urllib.error.URLError, TimeoutError, OSError) as error:
            raise ProviderError(f"The model provider could not be reached: {error}") from error
        except ValueError as error:
            raise ProviderError(f"The model provider's answer is not a JSON completion: {error}") from error


def _parsed(text: str) -> Json:
    """JSON text parsed, or the text itself when it is not JSON."""
    try:
        value: Json = json.loads(text)
    except ValueError:
        return text
    return value


def _wire_message(message: Mapping[str, Json]) -> dict[str, Json]:
    """A conversation message in the chat-completions wire format."""
    role = message.get("role")
    content = message.get("content")
    # Keys sorted: a conversation read back from the store is sent exactly as it was first sent.
    text = content if isinstance(content, str) or content is None else json.dumps(content, sort_keys=True)
    if role == "tool":
        return {"role": "tool", "tool_call_id": message.get("toolCallId"), "content": text or ""}
    if role == "assistant":
        wire: dict[str, Json] = {"role": "assistant", "content": text}
        calls = message.get("toolCalls")
        if isinstance(calls, list) and calls:
            wire["tool_calls"] = [
                {
                    "id": call.get("id"),
                    "type": "function",
                    "function": {
                        "name": call.get("name"),
                        "arguments": json.dumps(call.get("arguments"), sort_keys=True),
                    },
                }
                for call in calls
                if isinstance(call, dict)
            ]
        return wire
    return {"role": "user", "content": text or ""}
