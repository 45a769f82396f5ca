"""Times, progress, values and agent messages in words, for people (the CLI and the console say
them the same way)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tether.store import AgentMessage, Progress


def duration(ms: int | float | None) -> str:
    """A duration in milliseconds as ``850 ms``, ``12.5 s``, ``3 min 4 s``, ``5 h 6 min`` or ``2 d 3 h``."""
    if ms is None:
        return ""
    seconds = ms / 1000
    if seconds < 1:
        return f"{int(ms)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


def progress_text(progress: Progress) -> str:
    """``40/100 (40%) downloading, about 12 s left``: a step's latest progress report."""
    done = f"{progress.done:g}" + ("" if progress.total is None else f"/{progress.total:g}")
    parts = [done]
    if progress.fraction is not None:
        parts.append(f"({progress.fraction:.0%})")
    if progress.message:
        parts.append(progress.message)
    text = " ".join(parts)
    left = progress.seconds_left
    return text if left is None else f"{text}, about {duration(left * 1000)} left"


def summary(value: Any, limit: int = 60) -> str:
    """A one-line summary of a JSON value."""
    if value is None:
        return ""
    text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def message_words(message: AgentMessage, limit: int = 400) -> tuple[str, str, str]:
    """An agent conversation's message in words: who spoke (``model``, ``tool``, ``user``, or
    ``fix`` for a correction sent back), what was said (``calls NAME(ARGUMENTS)`` for the tools the
    model calls, ``answers ...`` for its answer), and the tokens the turn used (empty when
    unknown)."""
    body = message.body
    if message.role == "assistant" and isinstance(body.get("toolCalls"), list):
        calls = [c for c in body["toolCalls"] if isinstance(c, Mapping)]
        who, what = (
            "model",
            "; ".join(f"calls {c.get('name')}({summary(c.get('arguments'), limit)})" for c in calls),
        )
    elif message.role == "assistant":
        who, what = "model", "answers " + summary(body.get("content"), limit)
    elif message.role == "tool":
        who, what = "tool", f"{body.get('name')} → {summary(body.get('content'), limit)}"
    else:
        content = body.get("content")
        who = "fix" if body.get("invalid") else "user"
        what = (content if isinstance(content, str) else summary(content, limit))[:limit]
    usage = body.get("usage")
    tokens = ""
    if isinstance(usage, Mapping):
        tokens = f"{usage.get('inputTokens', 0)} in, {usage.get('outputTokens', 0)} out"
    return who, what, tokens
