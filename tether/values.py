"""Validation and encoding of the values that cross the store's boundary: times, ids, digests, JSON."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any, overload

from tether.errors import InvalidInput

Json = Any
"""A JSON value: None, bool, int, float, str, list of Json, or dict of str to Json."""

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
DIGEST_PATTERN = re.compile(r"(?:sha256:)?([0-9a-fA-F]{64})")
MAX_NAME_LENGTH = 200
MAX_JSON_BYTES = 4 * 1024 * 1024
MAX_JSON_DEPTH = 64
MAX_INT = 2**63 - 1
MAX_LEASE_MS = 24 * 60 * 60 * 1000
# Epoch milliseconds that still round-trip through datetime (years 1970..9999).
MAX_EPOCH_MS = 253402300799999
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def now_ms() -> int:
    """The wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000


def parse_now(value: datetime | str | None) -> int:
    """Turn a caller's ``now`` (aware datetime, ISO-8601 string or None) into epoch ms."""
    if value is None:
        return now_ms()
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise InvalidInput("Invalid timestamp") from None
    if not isinstance(value, datetime):
        raise InvalidInput("Invalid timestamp")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput("Invalid timestamp: give a timezone-aware time (for example with +00:00)")
    # Exact integer arithmetic: a float timestamp loses sub-millisecond precision in late years.
    ms = (value - _EPOCH) // timedelta(milliseconds=1)
    if not 0 <= ms <= MAX_EPOCH_MS:
        raise InvalidInput("Invalid timestamp: it must lie between 1970 and 9999")
    return ms


@overload
def to_datetime(ms: int) -> datetime: ...
@overload
def to_datetime(ms: None) -> None: ...
def to_datetime(ms: int | None) -> datetime | None:
    """Epoch milliseconds as an aware UTC datetime (None stays None)."""
    return None if ms is None else _EPOCH + timedelta(milliseconds=ms)


def iso(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC with three fractional digits and ``Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(ms // 1000)) + f"{ms % 1000:03d}Z"


def require_run_id(value: object) -> str:
    if not isinstance(value, str) or RUN_ID_PATTERN.fullmatch(value) is None:
        raise InvalidInput(f"Invalid workflow run id: {value}")
    return value


def require_text(name: str, value: object, *, limit: int = MAX_NAME_LENGTH) -> str:
    """A non-empty string of at most ``limit`` characters without NUL."""
    if not isinstance(value, str) or not value or len(value) > limit or "\x00" in value:
        raise InvalidInput(f"{name} must be a non-empty string of at most {limit} characters without NUL")
    return value


def optional_text(name: str, value: object, *, limit: int = MAX_NAME_LENGTH) -> str | None:
    return None if value is None else require_text(name, value, limit=limit)


def require_lease_ms(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_LEASE_MS:
        raise InvalidInput(f"lease_ms must be a whole number of milliseconds from 1 to {MAX_LEASE_MS}")
    return value


def require_count(name: str, value: object, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_INT:
        raise InvalidInput(f"{name} must be a whole number of at least {minimum}")
    return value


def digest_bytes(value: object) -> bytes:
    """A SHA-256 digest given as 64 hex digits with an optional ``sha256:`` prefix."""
    match = DIGEST_PATTERN.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidInput("Expected a SHA-256 digest")
    return bytes.fromhex(match.group(1))


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def random_bits() -> int:
    """74 random bits for ``ordered_uuid`` (a test replaces this to draw ids deterministically)."""
    return int.from_bytes(os.urandom(10)) >> 6


def ordered_uuid(now_ms: int) -> str:
    """A version 7 UUID: the time in milliseconds, then 74 random bits (``random_bits``). Ids
    that grow with time keep an index's inserts on its last pages instead of scattering them."""
    random = random_bits()
    value = (now_ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | (random >> 62) << 64 | 0b10 << 62
    digits = f"{value | (random & ((1 << 62) - 1)):032x}"
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


@functools.lru_cache(maxsize=1024)
def token_hash(token: str) -> bytes:
    """What the store keeps of a claim token: its SHA-256, never the token. Remembered for the
    last tokens hashed: a runner's every call on a run hashes the same token."""
    return sha256(token.encode("utf-8", "surrogatepass"))


def _check_json(value: object, depth: int) -> object:
    if depth > MAX_JSON_DEPTH:
        raise InvalidInput(f"JSON values may nest at most {MAX_JSON_DEPTH} levels deep")
    if value is None or isinstance(value, bool | str):
        if isinstance(value, str):
            _check_string(value)
        return value
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            raise InvalidInput("JSON integers must fit in 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput("JSON numbers must be finite")
        if value == 0:
            return 0
        if value.is_integer() and abs(value) <= MAX_INT:
            return int(value)
        return value
    if isinstance(value, list | tuple):
        return [_check_json(item, depth + 1) for item in value]
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise InvalidInput("Only plain objects can be stored as canonical JSON")
        for key in value:
            _check_string(key)
        return {key: _check_json(item, depth + 1) for key, item in value.items()}
    raise InvalidInput(f"Unsupported JSON value type: {type(value).__name__}")


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_string(value: str) -> None:
    if not _valid_unicode(value):
        raise InvalidInput("JSON strings must be valid Unicode (no lone surrogates)")


#: One encoder for every canonical text (``json.dumps`` with options builds one per call).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _plain_object(value: object) -> bool:
    """Whether ``value`` is an object of string keys and strings, booleans, nulls and 64-bit
    integers only (most of the store's own payloads): nothing in it to normalise, so its text
    needs no walk of ``_check_json`` (a lone surrogate is still refused: see ``canonical_json``)."""
    if type(value) is not dict:
        return False
    for key, item in value.items():
        if type(key) is not str:
            return False
        kind = type(item)
        if kind is int:
            if not -MAX_INT <= item <= MAX_INT:
                return False
        elif kind is not str and kind is not bool and item is not None:
            return False
    return True


def canonical_json(value: object) -> str:
    """Keys sorted, compact, non-ASCII kept, ``-0`` as ``0``, integral floats without ``.0``."""
    text = _CANONICAL.encode(value) if _plain_object(value) else None
    if text is None or not (text.isascii() or _valid_unicode(text)):
        text = _CANONICAL.encode(_check_json(value, 0))
    if len(text) > MAX_JSON_BYTES:
        raise InvalidInput(f"JSON values may be at most {MAX_JSON_BYTES} bytes")
    return text


def require_json(name: str, value: object) -> None:
    """Refuse a value that cannot be stored as JSON, naming where in it the problem lies
    (``input at $.order.when: Unsupported JSON value type: datetime``)."""
    try:
        canonical_json(value)
    except InvalidInput as error:
        path = "$"
        while True:  # descend into the first part that is refused on its own
            items = (
                list(value.items())
                if isinstance(value, dict)
                else list(enumerate(value))
                if isinstance(value, list | tuple)
                else []
            )
            bad = next((p for p in items if not _json_ok(p[1])), None)
            if bad is None:
                break
            key, value = bad
            path += f"[{key}]" if isinstance(key, int) else f".{key}"
        where = f" at {path}" if path != "$" else ""
        raise InvalidInput(f"{name}{where}: {error.message}") from None


def _json_ok(value: object) -> bool:
    try:
        canonical_json(value)
    except InvalidInput:
        return False
    return True


def canonical_bytes(value: object) -> bytes:
    data = canonical_json(value).encode("utf-8")
    if len(data) > MAX_JSON_BYTES:
        raise InvalidInput(f"JSON values may be at most {MAX_JSON_BYTES} bytes")
    return data


def definition_digest(snapshot: object) -> str:
    """The ``sha256:`` digest of a definition snapshot's canonical JSON."""
    return "sha256:" + sha256(canonical_bytes(snapshot)).hex()
