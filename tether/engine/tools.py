"""Tools an agent step's model may call: plain Python functions with typed parameters.

``Tool(fn)`` (or the ``@tool`` decorator) names a function for the model: its name (the
function's, unless given), a description (its docstring's first paragraph, unless given) and the
JSON Schema of its parameters, derived from the type hints (or given as ``parameters=``). The
model's arguments are checked against that schema before the function is called; a refusal, or
an exception the function raises, goes back to the model as the call's result (``{"error":
...}``), so the model can correct itself: a tool's failure is never the step's.

A tool may be called again after a worker died between running it and recording its result:
write tools that can be repeated (a lookup, an idempotent write). The ``effect`` flag is kept for
tools with side effects that must go through the effects outbox; it is refused until then.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from tether.engine.failures import summary
from tether.engine.schema import check_schema, schema_of
from tether.engine.schema import errors as schema_errors
from tether.errors import InvalidInput
from tether.values import Json, canonical_json

TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_SCALARS: dict[Any, dict[str, Json]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
}


def _type_schema(hint: Any, where: str) -> dict[str, Json]:
    """The JSON Schema of one parameter's type hint."""
    if hint in _SCALARS:
        return dict(_SCALARS[hint])
    if hint is Any:
        return {}
    if isinstance(hint, type) and callable(getattr(hint, "model_json_schema", None)):
        return schema_of(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal and all(isinstance(a, str | int | float | bool) for a in args):
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_type_schema(a, where) for a in args]}
    if origin in (list, Sequence) or hint is list:
        return {"type": "array", **({"items": _type_schema(args[0], where)} if args else {})}
    if origin in (dict, Mapping) or hint is dict:
        if args and args[0] is not str:
            raise InvalidInput(f"{where}: a mapping parameter's keys must be str")
        return {"type": "object", **({"additionalProperties": _type_schema(args[1], where)} if args else {})}
    raise InvalidInput(
        f"{where}: cannot derive a JSON Schema from the type {hint!r}; use str, int, float, bool, "
        "list, dict, Literal, a union of these or a pydantic model, or give parameters= explicitly"
    )


def parameters_schema(fn: Callable[..., Any]) -> dict[str, Json]:
    """The JSON Schema of ``fn``'s parameters from its type hints: an object with a property per
    parameter, required unless it has a default."""
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as error:
        raise InvalidInput(f"tool {name}: its type hints cannot be read ({error})") from None
    properties: dict[str, Json] = {}
    required: list[Json] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise InvalidInput(f"tool {name}: *args and **kwargs cannot be described to a model")
        if param.name not in hints:
            raise InvalidInput(f"tool {name}: parameter {param.name} needs a type hint")
        properties[param.name] = _type_schema(hints[param.name], f"tool {name}, parameter {param.name}")
        if param.default is param.empty:
            required.append(param.name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    """A function the model may call. Flags for tools that act on the world (``effect``,
    ``needs_approval``) are part of the type so that steps can honour them; neither is supported
    yet, and a tool declaring one is refused."""

    fn: Callable[..., Any]
    name: str = ""
    description: str = ""
    #: The JSON Schema of the arguments (derived from the type hints unless given).
    parameters: Mapping[str, Json] = field(default_factory=dict)
    effect: bool = False
    needs_approval: bool = False

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise InvalidInput(f"a tool wraps a function, not {type(self.fn).__name__}")
        name = self.name or getattr(self.fn, "__name__", "")
        if not isinstance(name, str) or TOOL_NAME.fullmatch(name) is None:
            raise InvalidInput(
                f"Invalid tool name {name!r}: use a letter or _, then letters, digits, _ or - (64 at most)"
            )
        if self.effect or self.needs_approval:
            raise InvalidInput(
                f"tool {name}: effect and needs_approval tools are not supported yet; a tool must "
                "be safe to call again"
            )
        description = self.description or (inspect.getdoc(self.fn) or "").split("\n\n")[0].strip()
        parameters = dict(self.parameters) if self.parameters else parameters_schema(self.fn)
        check_schema(parameters)
        if parameters.get("type") != "object":
            raise InvalidInput(f"tool {name}: its parameters schema must describe an object")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "parameters", parameters)

    def describe(self) -> dict[str, Json]:
        """What a provider tells the model about the tool (and what the definition records)."""
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}

    def call(self, arguments: Json, invoke: Callable[[Callable[[], Any]], Any] | None = None) -> Json:
        """Call the function with the model's ``arguments``; a refusal or a raised exception
        comes back as ``{"error": ...}`` for the model, never raised. ``invoke``: how to call
        it (a runner awaits an ``async def`` tool's coroutine on its event loop)."""
        if not isinstance(arguments, dict):
            return {"error": f"the arguments of tool {self.name} must be a JSON object"}
        problems = schema_errors(arguments, dict(self.parameters))
        if problems:
            return {"error": f"invalid arguments for tool {self.name}: " + "; ".join(problems[:10])}
        try:
            value = self.fn(**arguments) if invoke is None else invoke(lambda: self.fn(**arguments))
            canonical_json(value)
        except Exception as error:
            return {"error": summary(error)}
        return typing.cast(Json, value)


def tool(fn: Callable[..., Any] | None = None, *, name: str = "", description: str = "") -> Any:
    """``@tool`` or ``@tool(name=..., description=...)``: the function as a ``Tool``."""
    if fn is None:
        return lambda inner: Tool(inner, name=name, description=description)
    return Tool(fn, name=name, description=description)


def tools_of(values: Sequence[Tool | Callable[..., Any]]) -> list[Tool]:
    """An agent's tools: each a ``Tool`` or a function (wrapped), with distinct names."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InvalidInput("tools must be a list of functions or Tool objects")
    found = [value if isinstance(value, Tool) else Tool(value) for value in values]
    names = [t.name for t in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidInput(f"two tools are named {', '.join(twice)}")
    return found
