"""Model providers for agent nodes.

A provider answers one prompt (``complete(prompt, schema) -> JSON``: an agent without tools), or
takes one turn of a conversation (``turn(messages, tools, schema) -> Turn``: the model calls tools
or gives its final answer, with the tokens it used when the provider reports them).

``ScriptedProvider`` answers from a list (tests, examples, offline demos). ``OpenAICompatibleProvider``
calls a chat-completions endpoint and ``AnthropicProvider`` the Anthropic Messages API, both over
HTTP with the standard library only, tool calls included, and both retrying rate limits (429) and
server errors (5xx) the same way (``_HttpJson``).

A conversation's messages are JSON objects with a ``role`` (``user``, ``assistant``, ``tool``):
``content`` (text, or the JSON answer), an assistant's ``toolCalls`` (``id``, ``name``,
``arguments``) and ``usage``, a tool result's ``toolCallId`` and ``name``.
"""

from __future__ import annotations

import email.utils
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
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
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60,
        retries: int = 4,
        max_wait_s: float = 60,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = _checked_url(base_url)
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self._http = _HttpJson(timeout_s=timeout_s, retries=retries, max_wait_s=max_wait_s, sleep=sleep)

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
        return self._http.post(f"{self.base_url}/chat/completions", body, headers)


class AnthropicProvider:
    """The Anthropic Messages API (``POST {base_url}/v1/messages``), over HTTP with the standard
    library: the official SDK would bring its own retry policy and a dependency for one request
    shape, where this shares the retries of ``OpenAICompatibleProvider``."""

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None = None,
        base_url: str = "https://api.anthropic.com",
        max_tokens: int = 4096,
        anthropic_version: str = "2023-06-01",
        timeout_s: float = 60,
        retries: int = 4,
        max_wait_s: float = 60,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not model:
            raise InvalidInput("model must name an Anthropic model, e.g. claude-sonnet-4-5")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidInput("max_tokens must be a positive integer")
        self.base_url = _checked_url(base_url)
        self.model = model
        self.api_key = api_key
        self.max_tokens = max_tokens
        self.anthropic_version = anthropic_version
        self.timeout_s = timeout_s
        self._http = _HttpJson(timeout_s=timeout_s, retries=retries, max_wait_s=max_wait_s, sleep=sleep)

    def complete(self, prompt: str, schema: dict[str, Any]) -> Json:
        answer = self.turn([{"role": "user", "content": prompt}], [], schema).answer
        if isinstance(answer, str):
            raise ProviderError("The model provider's answer is not a JSON completion: " + answer[:200])
        return answer

    def turn(
        self,
        messages: Sequence[Mapping[str, Json]],
        tools: Sequence[Mapping[str, Json]],
        schema: dict[str, Any],
    ) -> Turn:
        """One Messages request: the instructions as ``system``, the tools with their
        ``input_schema``; the reply's ``tool_use`` blocks, or its text as the final answer (JSON
        when it parses, a fenced JSON block included, else the text, which the schema refuses)."""
        instructions = "Give your final answer as one JSON object matching this schema: " + json.dumps(schema)
        if tools:
            instructions = "You may call the tools you are given first. " + instructions
        body: dict[str, Json] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": instructions,
            "messages": _anthropic_messages(messages),
        }
        if tools:
            body["tools"] = [
                {
                    "name": t.get("name"),
                    "description": t.get("description") or "",
                    "input_schema": t.get("parameters") or {"type": "object"},
                }
                for t in tools
            ]
        headers = {"Content-Type": "application/json", "anthropic-version": self.anthropic_version}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        reply = self._http.post(f"{self.base_url}/v1/messages", body, headers)
        try:
            blocks = reply["content"]
            calls = [
                ToolCall(name=str(block["name"]), arguments=block.get("input"), id=str(block.get("id") or ""))
                for block in blocks
                if block.get("type") == "tool_use"
            ]
            used = reply.get("usage") or {}
            usage = (
                Usage(int(used.get("input_tokens") or 0), int(used.get("output_tokens") or 0))
                if used
                else None
            )
            if calls:
                return Turn(calls=calls, usage=usage)
            text = "".join(str(block.get("text") or "") for block in blocks if block.get("type") == "text")
            return Turn(answer=_parsed(_unfenced(text)), usage=usage)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ProviderError(f"The model provider's answer is not a Messages reply: {error}") from error


class _HttpJson:
    """POSTs JSON and reads JSON back, retrying rate limits (429) and server errors (5xx).

    A retry waits as the reply's ``Retry-After`` says (seconds or an HTTP date), else backs off
    exponentially (1 s, 2 s, 4 s ...); every wait is capped at ``max_wait_s``. A provider cannot
    see its step's cancellation, so the cap bounds how long a cancelled step waits here. Other
    HTTP errors are not retried: the error names the status and the server's message."""

    def __init__(
        self, *, timeout_s: float, retries: int, max_wait_s: float, sleep: Callable[[float], None]
    ) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidInput("retries must be a whole number of retries, 0 or more")
        if max_wait_s < 0:
            raise InvalidInput("max_wait_s must be 0 or more seconds")
        self.timeout_s = timeout_s
        self.retries = retries
        self.max_wait_s = max_wait_s
        self._sleep = sleep

    def post(self, url: str, body: dict[str, Json], headers: dict[str, str]) -> Any:
        data = json.dumps(body).encode()
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return json.loads(response.read().decode("utf-8"))
            except urllib.error.HTTPError as error:
                retryable = error.code == 429 or error.code >= 500
                if not retryable or attempt == self.retries:
                    tried = f" (after {attempt + 1} tries)" if attempt else ""
                    raise ProviderError(
                        f"The model provider answered HTTP {error.code}{tried}: {_error_message(error)}"
                    ) from error
                self._sleep(self._wait_s(error.headers.get("Retry-After"), attempt))
            except (urllib.error.URLError, TimeoutError, OSError) as error:
                raise ProviderError(f"The model provider could not be reached: {error}") from error
            except ValueError as error:
                raise ProviderError(
                    f"The model provider's answer is not a JSON completion: {error}"
                ) from error
        raise AssertionError("unreachable: the last try returns or raises")

    def _wait_s(self, retry_after: str | None, attempt: int) -> float:
        wait = _retry_after_s(retry_after)
        if wait is None:
            wait = float(2**attempt)
        return max(0.0, min(wait, self.max_wait_s))


def _retry_after_s(value: str | None, now: datetime | None = None) -> float | None:
    """A ``Retry-After`` header in seconds (it gives seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return float(value.strip())
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - (now or datetime.now(UTC))).total_seconds()


def _error_message(error: urllib.error.HTTPError) -> str:
    """The server's message in an error reply (``{"error": {"message": ...}}`` in both wire
    formats), else the start of its body."""
    try:
        text = error.read().decode("utf-8", errors="replace")
    except OSError:
        return error.reason if isinstance(error.reason, str) else ""
    try:
        detail = json.loads(text)["error"]
        message = detail["message"] if isinstance(detail, dict) else detail
        if isinstance(message, str) and message:
            return message
    except (ValueError, KeyError, TypeError):
        pass
    return text.strip()[:500] or str(error.reason)


def _checked_url(base_url: str) -> str:
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise InvalidInput("base_url must be an http(s) URL")
    return base_url.rstrip("/")


def _unfenced(text: str) -> str:
    """Text without a surrounding Markdown code fence (```json ... ```)."""
    stripped = text.strip()
    if stripped.startswith("```") and stripped.endswith("```") and "\n" in stripped:
        return stripped[stripped.index("\n") + 1 : -3].strip()
    return text


def _anthropic_messages(messages: Sequence[Mapping[str, Json]]) -> list[Json]:
    """The conversation in the Messages wire format: an assistant's tool calls as ``tool_use``
    blocks, tool results as ``tool_result`` blocks in a user message; consecutive messages of one
    role are merged, as the API wants the roles to alternate. Keys are sorted as in
    ``_wire_message``."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        text = content if isinstance(content, str) or content is None else json.dumps(content, sort_keys=True)
        blocks: list[dict[str, Json]] = []
        if role == "assistant":
            if text:
                blocks.append({"type": "text", "text": text})
            calls = message.get("toolCalls")
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, dict):
                    arguments = call.get("arguments")
                    blocks.append(
                        {
                            "type": "tool_use",
                            "id": call.get("id"),
                            "name": call.get("name"),
                            "input": arguments if isinstance(arguments, dict) else {},
                        }
                    )
            if not blocks:
                blocks.append({"type": "text", "text": "(no answer)"})
        elif role == "tool":
            role = "user"
            blocks.append(
                {"type": "tool_result", "tool_use_id": message.get("toolCallId"), "content": text or ""}
            )
        else:
            role = "user"
            blocks.append({"type": "text", "text": text or "(empty)"})
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    return list(wire)


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
