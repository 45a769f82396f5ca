"""Model providers for agent nodes: ``complete(prompt, schema) -> JSON``.

``ScriptedProvider`` answers from a list (tests, examples, offline demos). ``OpenAICompatibleProvider``
calls a chat-completions endpoint over HTTP with the standard library only.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tether.errors import InvalidInput, ProviderError
from tether.values import Json


class Provider(Protocol):
    def complete(self, prompt: str, schema: dict[str, Any]) -> Json: ...


class ScriptedProvider:
    """Answers from a script: each call takes the next response (or calls it with the prompt)."""

    def __init__(self, responses: Sequence[Json | Callable[[str], Json]]) -> None:
        self._responses = list(responses)
        self._lock = threading.Lock()
        self.prompts: list[str] = []

    def complete(self, prompt: str, schema: dict[str, Any]) -> Json:
        with self._lock:
            if not self._responses:
                raise ProviderError("The scripted provider has no responses left")
            response = self._responses.pop(0)
            self.prompts.append(prompt)
        return response(prompt) if callable(response) else response


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
        body = {
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
                reply = json.loads(response.read().decode("utf-8"))
            content = reply["choices"][0]["message"]["content"]
            return json.loads(content) if isinstance(content, str) else content
        except urllib.error.HTTPError as error:
            raise ProviderError(f"The model provider answered HTTP {error.code}") from error
        except (urllib.error.URLError, TimeoutError, OSError) as error:
            raise ProviderError(f"The model provider could not be reached: {error}") from error
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise ProviderError(f"The model provider's answer is not a JSON completion: {error}") from error
