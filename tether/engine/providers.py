"""Model providers for agent nodes.

A provider answers one prompt (``complete(prompt, schema) -> JSON``: an agent without tools), or
takes one turn of a conversation (``turn(messages, tools, schema) -> Turn``: the model calls tools
or gives its final answer, with the tokens it used when the provider reports them).

``ScriptedProvider`` answers from a list (tests, examples, offline demos). ``OpenAICompatibleProvider``
calls a chat-completions endpoint and ``AnthropicProvider`` the Anthropic Messages API, through
the official SDKs (the ``openai`` and ``anthropic`` extras), tool calls included; the SDKs retry
rate limits (429) and server errors (5xx) as ``Retry-After`` says, within the provider's bounds.
Asked with ``on_text``, a turn streams and passes the model's text on as it comes (the agent loop
shows it live; see ``tether.engine.livetext``).

A conversation's messages are JSON objects with a ``role`` (``user``, ``assistant``, ``tool``):
``content`` (text, or the JSON answer), an assistant's ``toolCalls`` (``id``, ``name``,
``arguments``) and ``usage``, a tool result's ``toolCallId`` and ``name``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import threading
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


def streams_text(provider: Any) -> bool:
    """Whether ``provider.turn`` takes ``on_text`` (a function it passes the model's text to, a
    piece at a time, as the model streams it)."""
    try:
        parameters = inspect.signature(provider.turn).parameters
    except (AttributeError, TypeError, ValueError):
        return False
    return "on_text" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


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


#: The key sent to an OpenAI-compatible endpoint when none is given or set in ``OPENAI_API_KEY``
#: (the SDK always sends one; a local server ignores it, api.openai.com refuses it clearly).
NO_KEY = "no-key"


class _Tries(threading.local):
    """The retries the SDK made for the current request on this thread."""

    retries = 0


def _require_sdk(name: str) -> None:
    """Refuse at once when the official SDK package ``name`` (``openai``, ``anthropic``) is not
    installed, naming the extra that installs it. The package itself is imported on the first
    request: it takes seconds to import, and a workflow module that only names a provider (the
    CLI loads the folder for most commands) should not pay for it."""
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise InvalidInput(f"the {name} model provider needs the {name} extra: pip install 'tether[{name}]'")


def _bounded_client(
    client_class: Any, tries: _Tries, max_wait_s: float, sleep: Callable[[float], None] | None
) -> Any:
    """The SDK's client class with its retry waits capped at ``max_wait_s`` and counted in
    ``tries``: a provider cannot see its step's cancellation, so the cap bounds how long a
    cancelled step waits here. With ``sleep``, the wait is slept there (a test's clock) and the
    SDK's own sleep is skipped."""

    class Bounded(client_class):  # type: ignore[misc]
        def _calculate_retry_timeout(self, *args: Any, **kwargs: Any) -> float:
            wait = max(0.0, min(float(super()._calculate_retry_timeout(*args, **kwargs)), max_wait_s))
            tries.retries += 1
            if sleep is None:
                return wait
            sleep(wait)
            return 0.0

    return Bounded


class _SdkProvider:
    """What both SDK providers share: the client (built lazily, once per provider), the retry
    bounds, and the SDK's errors turned into ``ProviderError``."""

    _package = ""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None,
        timeout_s: float,
        retries: int,
        max_wait_s: float,
        sleep: Callable[[float], None] | None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise InvalidInput("model must name the provider's model")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidInput("retries must be a whole number of retries, 0 or more")
        if isinstance(max_wait_s, bool) or not isinstance(max_wait_s, int | float) or max_wait_s < 0:
            raise InvalidInput("max_wait_s must be 0 or more seconds")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
            raise InvalidInput("timeout_s must be a number of seconds above 0")
        self.base_url = _checked_url(base_url)
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.retries = retries
        self.max_wait_s = max_wait_s
        self._sleep = sleep
        _require_sdk(self._package)
        self._tries = _Tries()
        self._client: Any = None
        self._lock = threading.Lock()

    def _make_client(self, sdk: Any, bounded: Any) -> Any:
        raise NotImplementedError

    @property
    def _sdk_module(self) -> Any:
        return importlib.import_module(self._package)

    @property
    def client(self) -> Any:
        """The SDK client (one per provider, shared by the steps that use it)."""
        with self._lock:
            if self._client is None:
                sdk = self._sdk_module
                bounded = _bounded_client(self._client_class(sdk), self._tries, self.max_wait_s, self._sleep)
                self._client = self._make_client(sdk, bounded)
            return self._client

    def _client_class(self, sdk: Any) -> Any:
        raise NotImplementedError

    def _call(self, request: Callable[[], Any]) -> Any:
        """``request()`` (an SDK call, retried there), its errors as ``ProviderError``."""
        sdk = self._sdk_module
        self._tries.retries = 0
        try:
            return request()
        except sdk.APIStatusError as error:
            tried = f" (after {self._tries.retries + 1} tries)" if self._tries.retries else ""
            raise ProviderError(
                f"The model provider answered HTTP {error.status_code}{tried}: {_status_message(error)}"
            ) from error
        except sdk.APIConnectionError as error:
            cause = error.__cause__ or error
            raise ProviderError(f"The model provider could not be reached: {cause}") from error
        except (sdk.APIError, ValueError) as error:
            # ValueError: a streamed event that is not JSON.
            raise ProviderError(f"The model provider's answer could not be read: {error}") from error


class OpenAICompatibleProvider(_SdkProvider):
    """A chat-completions endpoint (``POST {base_url}/chat/completions``) through the official
    ``openai`` SDK (``pip install 'tether[openai]'``): OpenAI itself, or any server that speaks
    its wire format. ``api_key`` defaults to ``OPENAI_API_KEY``; the SDK retries rate limits and
    server errors (``retries`` times), waiting as ``Retry-After`` says, each wait capped at
    ``max_wait_s``. A turn asked with ``on_text`` streams, passing the text on as it comes."""

    _package = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60,
        retries: int = 4,
        max_wait_s: float = 60,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(
            base_url=base_url,
            model=model,
            api_key=api_key,
            timeout_s=timeout_s,
            retries=retries,
            max_wait_s=max_wait_s,
            sleep=sleep,
        )

    def _client_class(self, sdk: Any) -> Any:
        return sdk.OpenAI

    def _make_client(self, sdk: Any, bounded: Any) -> Any:
        key = self.api_key or os.environ.get("OPENAI_API_KEY") or NO_KEY
        return bounded(base_url=self.base_url, api_key=key, timeout=self.timeout_s, max_retries=self.retries)

    def complete(self, prompt: str, schema: dict[str, Any]) -> Json:
        messages: list[Json] = [
            {
                "role": "system",
                "content": "Answer with one JSON object matching this schema: " + json.dumps(schema),
            },
            {"role": "user", "content": prompt},
        ]
        reply = self._create(messages, [], None)
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
        on_text: Callable[[str], None] | None = None,
    ) -> Turn:
        """One chat-completions request with the conversation and the tools (``tools`` in the
        wire format); the reply's ``tool_calls``, or its content as the final answer (JSON when
        it parses, else the text, which the schema then refuses). With ``on_text`` the reply is
        streamed and each piece of text is passed to it as it arrives."""
        instructions = "Give your final answer as one JSON object matching this schema: " + json.dumps(schema)
        if tools:
            instructions = "You may call the tools you are given first. " + instructions
        wire = [{"role": "system", "content": instructions}, *map(_wire_message, messages)]
        reply = self._create(wire, [{"type": "function", "function": dict(t)} for t in tools], on_text)
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

    def _create(self, messages: list[Json], tools: list[Json], on_text: Callable[[str], None] | None) -> Any:
        """The reply as a JSON object in the chat-completions shape (a stream put together)."""
        options: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "response_format": {"type": "json_object"},
        }
        if tools:
            options["tools"] = tools
        completions = self.client.chat.completions
        if on_text is None:
            return self._call(lambda: completions.create(**options).model_dump())

        def streamed() -> dict[str, Any]:
            stream = completions.create(**options, stream=True, stream_options={"include_usage": True})
            try:
                return _gathered_chunks(stream, on_text)
            finally:
                stream.close()

        return self._call(streamed)


def _gathered_chunks(stream: Any, on_text: Callable[[str], None]) -> dict[str, Any]:
    """A streamed chat completion put together: its content (passed to ``on_text`` piece by
    piece), its tool calls (their pieces joined by index) and its usage."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage: Any = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices or []:
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                content.append(delta.content)
                on_text(delta.content)
            for piece in delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"id": "", "function": {"name": "", "arguments": ""}})
                if piece.id:
                    call["id"] = piece.id
                if piece.function is not None:
                    call["function"]["name"] += piece.function.name or ""
                    call["function"]["arguments"] += piece.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) if content else None}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return {"choices": [{"message": message}], "usage": usage}


class AnthropicProvider(_SdkProvider):
    """The Anthropic Messages API (``POST {base_url}/v1/messages``) through the official
    ``anthropic`` SDK (``pip install 'tether[anthropic]'``). ``api_key`` defaults to
    ``ANTHROPIC_API_KEY``; retries as ``OpenAICompatibleProvider``. A turn asked with
    ``on_text`` streams, passing the text on as it comes."""

    _package = "anthropic"

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
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if not model:
            raise InvalidInput("model must name an Anthropic model, e.g. claude-sonnet-4-5")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidInput("max_tokens must be a positive integer")
        super().__init__(
            base_url=base_url,
            model=model,
            api_key=api_key,
            timeout_s=timeout_s,
            retries=retries,
            max_wait_s=max_wait_s,
            sleep=sleep,
        )
        self.max_tokens = max_tokens
        self.anthropic_version = anthropic_version

    def _client_class(self, sdk: Any) -> Any:
        return sdk.Anthropic

    def _make_client(self, sdk: Any, bounded: Any) -> Any:
        return bounded(
            base_url=self.base_url,
            api_key=self.api_key or os.environ.get("ANTHROPIC_API_KEY"),
            timeout=self.timeout_s,
            max_retries=self.retries,
            default_headers={"anthropic-version": self.anthropic_version},
        )

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
        on_text: Callable[[str], None] | None = None,
    ) -> Turn:
        """One Messages request: the instructions as ``system``, the tools with their
        ``input_schema``; the reply's ``tool_use`` blocks, or its text as the final answer (JSON
        when it parses, a fenced JSON block included, else the text, which the schema refuses).
        With ``on_text`` the reply is streamed and each piece of text is passed to it as it
        arrives."""
        instructions = "Give your final answer as one JSON object matching this schema: " + json.dumps(schema)
        if tools:
            instructions = "You may call the tools you are given first. " + instructions
        options: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": instructions,
            "messages": _anthropic_messages(messages),
        }
        if tools:
            options["tools"] = [
                {
                    "name": t.get("name"),
                    "description": t.get("description") or "",
                    "input_schema": t.get("parameters") or {"type": "object"},
                }
                for t in tools
            ]
        api = self.client.messages

        def streamed() -> Any:
            assert on_text is not None
            with api.stream(**options) as stream:
                for text in stream.text_stream:
                    on_text(text)
                return stream.get_final_message().model_dump()

        reply = self._call(streamed if on_text else lambda: api.create(**options).model_dump())
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


def _status_message(error: Any) -> str:
    """The server's message in an error reply (``{"error": {"message": ...}}`` in both wire
    formats, or the SDK's own message)."""
    body = error.body
    for _ in range(2):
        if isinstance(body, dict) and "error" in body:
            body = body["error"]
    if isinstance(body, dict) and isinstance(body.get("message"), str) and body["message"]:
        return str(body["message"])
    if isinstance(body, str) and body:
        return body
    return str(getattr(error, "message", "") or error)[:500]


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
