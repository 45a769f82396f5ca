"""JSON Schema for answers, inputs and model outputs, validated by the ``jsonschema`` package
(draft 2020-12, with ``format`` checked).

A schema is a JSON object, or a pydantic model class (its ``model_json_schema()``). A schema is
checked when the node is built: it must be valid for the draft, and every keyword in it must be
one the draft knows, so a misspelt keyword (``minLenght``) never silently checks less than its
author wrote. Validation errors read as ``$.field: what is wrong``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from tether.errors import InvalidInput

VALIDATOR = Draft202012Validator
#: Keywords that annotate without validating, besides the validating ones the draft defines.
ANNOTATIONS = {
    "$schema",
    "$id",
    "$anchor",
    "$defs",
    "$comment",
    "$vocabulary",
    "$dynamicAnchor",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
    "definitions",
}
KEYWORDS = set(VALIDATOR.VALIDATORS) | ANNOTATIONS
#: Keywords whose value is a schema, a list of schemas or a map of names to schemas.
SUBSCHEMA = {"items", "not", "if", "then", "else", "contains", "additionalProperties", "propertyNames"}
SUBSCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems"}
SUBSCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
MAX_DEPTH = 32


def model_of(schema: Any) -> type | None:
    """The pydantic model class ``schema`` is, or None (a JSON Schema object)."""
    if isinstance(schema, type) and callable(getattr(schema, "model_json_schema", None)):
        return schema
    return None


def schema_of(schema: Any) -> dict[str, Any]:
    """The JSON Schema of ``schema``: a mapping as is, a pydantic model class by its
    ``model_json_schema()``."""
    to_json_schema = getattr(schema, "model_json_schema", None) if isinstance(schema, type) else None
    if callable(to_json_schema):
        return dict(to_json_schema())
    if isinstance(schema, Mapping):
        return dict(schema)
    raise InvalidInput(
        f"A schema is a JSON Schema object or a pydantic model class, not {type(schema).__name__}"
    )


def check_schema(schema: Any) -> None:
    """Refuse a schema that is not valid JSON Schema or uses keywords the draft does not know."""
    if not isinstance(schema, dict):
        raise InvalidInput("Schema at $ must be an object")
    _known_keywords(schema, "$", 0)
    try:
        VALIDATOR.check_schema(schema)
    except SchemaError as error:
        where = _path(error.path)
        raise InvalidInput(f"Schema at {where} is not valid JSON Schema: {error.message}") from None


def _known_keywords(schema: Any, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise InvalidInput(f"Schema at {path} nests more than {MAX_DEPTH} levels")
    if not isinstance(schema, dict):
        return
    unknown = set(schema) - KEYWORDS
    if unknown:
        raise InvalidInput(f"Schema at {path} uses unknown keywords: {', '.join(sorted(unknown))}")
    for keyword, value in schema.items():
        if keyword in SUBSCHEMA:
            _known_keywords(value, f"{path}[]" if keyword == "items" else path, depth + 1)
        elif keyword in SUBSCHEMA_LISTS and isinstance(value, list):
            for item in value:
                _known_keywords(item, path, depth + 1)
        elif keyword in SUBSCHEMA_MAPS and isinstance(value, dict):
            for name, item in value.items():
                _known_keywords(item, f"{path}.{name}", depth + 1)


def errors(value: Any, schema: Mapping[str, Any]) -> list[str]:
    """Every way ``value`` breaks ``schema``, as readable lines (empty when it conforms)."""
    validator = VALIDATOR(dict(schema), format_checker=VALIDATOR.FORMAT_CHECKER)
    found: list[str] = []
    for error in validator.iter_errors(value):
        found.extend(_describe(error))
    return sorted(found)


def conform(value: Any, schema: Mapping[str, Any], model: type | None = None) -> tuple[Any, list[str]]:
    """``value`` checked against ``schema`` and, with ``model`` (a pydantic model class), by the
    model's own validation too: ``(value, problems)``. Without problems the value is ``value``
    itself, or with a model its validated ``model_dump(mode="json")`` (JSON still, the model's
    defaults filled in)."""
    problems = errors(value, schema)
    if problems or model is None:
        return value, problems
    try:
        validated = model.model_validate(value)  # type: ignore[attr-defined]
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        found = getattr(error, "errors", None)
        if not callable(found):
            return value, [f"$: {error}"]
        return value, sorted(f"{_path(e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in found())
    return validated.model_dump(mode="json"), []


def _path(parts: Any) -> str:
    path = "$"
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _describe(error: ValidationError) -> list[str]:
    """The error in the user's terms, at the path of the value it concerns."""
    where = _path(error.absolute_path)
    kind, instance = error.validator, error.instance
    expected: Any = error.validator_value
    schema: Any = error.schema if isinstance(error.schema, Mapping) else {}
    if kind == "required" and isinstance(instance, dict):
        missing = [name for name in expected if name not in instance]
        return [f"{_path([*error.absolute_path, name])}: required" for name in missing]
    if kind == "additionalProperties" and isinstance(instance, dict) and expected is False:
        allowed = set(schema.get("properties", {}))
        patterns = schema.get("patternProperties", {})
        extra = [name for name in instance if name not in allowed and not patterns]
        if extra:
            return [f"{_path([*error.absolute_path, name])}: not allowed" for name in extra]
    if kind == "type":
        kinds = expected if isinstance(expected, list) else [expected]
        return [f"{where}: expected {' or '.join(map(str, kinds))}, got {type(instance).__name__}"]
    messages = {
        "minLength": f"shorter than {expected} characters",
        "maxLength": f"longer than {expected} characters",
        "minimum": f"less than {expected}",
        "maximum": f"more than {expected}",
        "minItems": f"fewer than {expected} items",
        "maxItems": f"more than {expected} items",
        "enum": f"must be one of {expected}",
        "const": f"must be {expected!r}",
    }
    return [f"{where}: {messages.get(str(kind), error.message)}"]
