"""Concurrency limits of a workflow: ``Workflow(..., concurrency=Limit(max=5))`` lets at most 5 of
its runs execute at once; ``Limit(max=1, key="customer_id")`` at most one per value of the input's
``customer_id``.

A run's key is computed from its input when it is started (``Tether.start``, a restart or a fork)
and stored with the run; a run whose input has no value for the key is refused then. A run holds
a slot while a worker holds it (its lease is live): a run parked for a person, a sleep or a retry's
backoff frees its slot, and a crashed worker's slot frees when its lease lapses. Workers honour the
cap when they claim runs (``tether.store.limits``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tether.errors import InvalidInput
from tether.store.limits import KEY_LIMIT, MAX_LIMIT, RunLimit
from tether.values import Json

_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_PATH = re.compile(r"\$(\.[A-Za-z_][A-Za-z0-9_-]{0,63})+")


@dataclass(frozen=True, init=False)
class Limit:
    """At most ``max`` runs of the workflow execute at once; with ``key``, at most ``max`` per
    value of the key. ``key``: a top-level input field name (``"customer_id"``), a JSON path into
    the input (``"$.order.customer"``), or a function of the input returning the key's value.
    A key's value is a string or a whole number."""

    max: int
    key: str | Callable[[Json], Any] | None = None

    def __init__(self, max: int, key: str | Callable[[Json], Any] | None = None) -> None:
        if isinstance(max, bool) or not isinstance(max, int) or not 1 <= max <= MAX_LIMIT:
            raise InvalidInput(f"Limit max must be a whole number from 1 to {MAX_LIMIT}, not {max!r}")
        if isinstance(key, str):
            if not (_FIELD.fullmatch(key) or _PATH.fullmatch(key)):
                raise InvalidInput(
                    f"Limit key {key!r} must be an input field name (customer_id), a JSON path "
                    "($.order.customer) or a function of the input"
                )
        elif key is not None and not callable(key):
            raise InvalidInput("Limit key must be an input field name, a JSON path or a function")
        object.__setattr__(self, "max", max)
        object.__setattr__(self, "key", key)

    @property
    def key_name(self) -> str | None:
        """How the key reads in a run's status: the field or path, or the function's name."""
        if self.key is None or isinstance(self.key, str):
            return self.key
        return getattr(self.key, "__name__", None) or type(self.key).__name__

    def snapshot(self, callable_name: Callable[[Callable[..., Any]], str]) -> dict[str, Json]:
        """The limit in the workflow's definition (and so its digest): a key function by
        ``callable_name`` (its name and a digest of its code, as node functions are)."""
        if self.key is None or isinstance(self.key, str):
            return {"max": self.max, "key": self.key}
        return {"max": self.max, "key": {"function": callable_name(self.key)}}

    def run_limit(self, workflow: str, input: Json) -> RunLimit:
        """The limit a run of ``workflow`` with this ``input`` counts against. Raises
        ``InvalidInput`` naming the key when the input has no value for it."""
        if self.key is None:
            return RunLimit(workflow, self.max)
        value = self._value(workflow, input)
        if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
            raise InvalidInput(
                f"Workflow {workflow} limits its runs per {self.key_name}: the key's value must be "
                f"a non-empty string or a whole number, not {value!r}"
            )
        key = f"{workflow}:{self.key_name}={value}"
        if len(key) > KEY_LIMIT:
            raise InvalidInput(
                f"Workflow {workflow} limits its runs per {self.key_name}: the input's value is too "
                f"long for a key ({KEY_LIMIT} characters at most with the workflow's name)"
            )
        return RunLimit(key, self.max)

    def _value(self, workflow: str, input: Json) -> Any:
        key = self.key
        if callable(key):
            try:
                return key(input)
            except Exception as error:
                raise InvalidInput(
                    f"Workflow {workflow} limits its runs per {self.key_name}: computing the key "
                    f"from the input failed: {type(error).__name__}: {error}"
                ) from None
        assert isinstance(key, str)
        path = key[2:].split(".") if key.startswith("$.") else [key]
        value: Any = input
        for depth, part in enumerate(path):
            if not isinstance(value, dict) or value.get(part) is None:
                where = "the input" if depth == 0 else "$." + ".".join(path[:depth])
                example = "..."
                for name in reversed(path):
                    example = f"{{{json.dumps(name)}: {example}}}"
                raise InvalidInput(
                    f"Workflow {workflow} limits its runs per {key}: {where} has no field "
                    f"{part!r}; start the run with an input that gives it (e.g. {example})"
                )
            value = value[part]
        return value
