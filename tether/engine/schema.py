"""A small JSON Schema subset for validating answers and model outputs.

Supported keywords: ``type`` (string or list), ``enum``, ``const``, ``properties``, ``required``,
``additionalProperties`` (boolean), ``items``, ``minLength``, ``maxLength``, ``minimum``,
``maximum``, ``minItems``, ``maxItems``. Unknown keywords are refused when a schema is declared,
so a schema never silently checks less than its author wrote.
"""

from __future__ import annotations

from typing import Any

from tether.errors import InvalidInput

KEYWORDS = {
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "description",
    "title",
}
TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}


MAX_DEPTH = 32
#: What each keyword's value must be, so validation never meets a value it cannot use.
KEYWORD_VALUES: dict[str, tuple[type, ...]] = {
    "enum": (list,),
    "properties": (dict,),
    "required": (list,),
    "additionalProperties": (bool,),
    "minLength": (int,),
    "maxLength": (int,),
    "minimum": (int, float),
    "maximum": (int, float),
    "minItems": (int,),
    "maxItems": (int,),
    "description": (str,),
    "title": (str,),
}


def check_schema(schema: Any, path: str = "$", depth: int = 0) -> None:
    """Refuse a schema that uses keywords, types or values this validator does not implement."""
    if depth > MAX_DEPTH:
        raise InvalidInput(f"Schema at {path} nests more than {MAX_DEPTH} levels")
    if not isinstance(schema, dict):
        raise InvalidInput(f"Schema at {path} must be an object")
    unknown = set(schema) - KEYWORDS
    if unknown:
        raise InvalidInput(f"Schema at {path} uses unsupported keywords: {', '.join(sorted(unknown))}")
    for keyword, allowed in KEYWORD_VALUES.items():
        value = schema.get(keyword)
        if keyword in schema and (
            (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed)
        ):
            names = " or ".join(t.__name__ for t in allowed)
            raise InvalidInput(f"Schema at {path}: {keyword} must be a {names}")
    if not all(isinstance(name, str) for name in schema.get("required", [])):
        raise InvalidInput(f"Schema at {path}: required must list property names")
    kinds = schema.get("type")
    for kind in kinds if isinstance(kinds, list) else [kinds] if kinds is not None else []:
        if kind not in TYPES:
            raise InvalidInput(f"Schema at {path} has unknown type {kind!r}")
    for name, sub in (schema.get("properties") or {}).items():
        check_schema(sub, f"{path}.{name}", depth + 1)
    if "items" in schema:
        check_schema(schema["items"], f"{path}[]", depth + 1)


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, int | float) and not isinstance(value, bool)


def errors(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema``, as readable lines (empty when it conforms)."""
    found: list[str] = []
    kinds = schema.get("type")
    if kinds is not None:
        allowed = kinds if isinstance(kinds, list) else [kinds]
        if not any(_type_ok(value, k) for k in allowed):
            return [f"{path}: expected {' or '.join(allowed)}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path}: must be one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        found.append(f"{path}: must be {schema['const']!r}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            found.append(f"{path}: shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            found.append(f"{path}: longer than {schema['maxLength']} characters")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            found.append(f"{path}: less than {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            found.append(f"{path}: more than {schema['maximum']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                found.append(f"{path}.{name}: required")
        for name, item in value.items():
            if name in properties:
                found.extend(errors(item, properties[name], f"{path}.{name}"))
            elif schema.get("additionalProperties") is False:
                found.append(f"{path}.{name}: not allowed")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            found.append(f"{path}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            found.append(f"{path}: more than {schema['maxItems']} items")
        if "items" in schema:
            for index, item in enumerate(value):
                found.extend(errors(item, schema["items"], f"{path}[{index}]"))
    return found
