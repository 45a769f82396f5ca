"""Tools an agent step's model may call: plain Python functions with typed parameters.

``Tool(fn)`` (or the ``@tool`` decorator) names a function for the model: its name (the
function's, unless given), a description (its docstring's first paragraph, unless given) and the
JSON Schema of its parameters, derived from the type hints (or given as ``parameters=``). The
model's arguments are checked against that schema before the function is called; a refusal, or
an exception the function raises, goes back to the model as the call's result (``{"error":
...}``), so the model can correct itself: a tool's failure is never the step's.

A tool may be called again after a worker died between running it and recording its result:
write tools that can be repeated (a lookup, an idempotent write). A tool marked ``effect=True``
goes through the effects outbox instead, as an ``effect`` step does: each call is recorded before
it is applied and applied at most once (keyed by the conversation and the call); one caught
mid-apply by a crash is ``ambiguous`` and waits for an operator. Such a function may take an
``idempotency_key: str`` parameter (not shown to the model) to pass on to the system it acts on.
A tool marked ``needs_approval=True`` runs only once a person approved the call: the call
becomes a decision (options ``approve`` and ``reject``, answered like any decision) and the step
waits for it, holding no worker; a rejected call goes back to the model as ``{"error": ...}``.
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


#: The parameter an effect tool's function may take to receive its call's idempotency key.
KEY_PARAMETER = "idempotency_key"


def parameters_schema(fn: Callable[..., Any], skip: Sequence[str] = ()) -> dict[str, Json]:
    """The JSON Schema of ``fn``'s parameters from its type hints: an object with a property per
    parameter (those in ``skip`` left out), required unless it has a default."""
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as error:
        raise InvalidInput(f"tool {name}: its type hints cannot be read ({error})") from None
    properties: dict[str, Json] = {}
    required: list[Json] = []
    for param in inspect.signature(fn).parameters.values():
        if param.name in skip:
            continue
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
    """A function the model may call. ``effect``: each call goes through the effects outbox
    (applied at most once); ``needs_approval``: each call waits for a person's approval."""

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
        description = self.description or (inspect.getdoc(self.fn) or "").split("\n\n")[0].strip()
        skip = (KEY_PARAMETER,) if self.effect and self.takes_key else ()
        parameters = dict(self.parameters) if self.parameters else parameters_schema(self.fn, skip)
        check_schema(parameters)
        if parameters.get("type") != "object":
            raise InvalidInput(f"tool {name}: its parameters schema must describe an object")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "parameters", parameters)

    @property
    def takes_key(self) -> bool:
        """Whether the function takes the call's idempotency key (``idempotency_key``)."""
        try:
            return KEY_PARAMETER in inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            return False

    def refusal(self, arguments: Json) -> str | None:
        """Why the model's ``arguments`` cannot be passed to the function, or None."""
        if not isinstance(arguments, dict):
            return f"the arguments of tool {self.name} must be a JSON object"
        problems = schema_errors(arguments, dict(self.parameters))
        if problems:
            return f"invalid arguments for tool {self.name}: " + "; ".join(problems[:10])
        return None

    def describe(self) -> dict[str, Json]:
        """What a provider tells the model about the tool (and what the definition records)."""
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}

    def run(
        self,
        arguments: Mapping[str, Json],
        invoke: Callable[[Callable[[], Any]], Any] | None = None,
        key: str | None = None,
    ) -> Json:
        """Call the function with checked ``arguments`` (and ``key`` as its ``idempotency_key``
        when it takes one) and return its JSON value; raises what it raises. ``invoke``: how to
        call it (a runner awaits an ``async def`` tool's coroutine on its event loop)."""
        given = dict(arguments)
        if key is not None and self.takes_key:
            given[KEY_PARAMETER] = key
        value = self.fn(**given) if invoke is None else invoke(lambda: self.fn(**given))
        canonical_json(value)
        return typing.cast(Json, value)

    def call(self, arguments: Json, invoke: Callable[[Callable[[], Any]], Any] | None = None) -> Json:
        """``run`` with the model's ``arguments``: a refusal or a raised exception comes back as
        ``{"error": ...}`` for the model, never raised."""
        refused = self.refusal(arguments)
        if refused is not None or not isinstance(arguments, dict):
            return {"error": refused}
        try:
            return self.run(arguments, invoke)
        except Exception as error:
            return {"error": summary(error)}


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str = "",
    description: str = "",
    effect: bool = False,
    needs_approval: bool = False,
) -> Any:
    """``@tool`` or ``@tool(name=..., description=..., effect=..., needs_approval=...)``: the
    function as a ``Tool``."""
    flags: dict[str, Any] = {
        "name": name,
        "description": description,
        "effect": effect,
        "needs_approval": needs_approval,
    }
    if fn is None:
        return lambda inner: Tool(inner, **flags)
    return Tool(fn, **flags)


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
