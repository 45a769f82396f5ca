"""Unit tests of tether.values: times, ids, digests, validators and canonical JSON (SPEC §2.1, §7)."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.errors import InvalidInput
from tether.values import (
    MAX_EPOCH_MS,
    MAX_INT,
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_LEASE_MS,
    canonical_bytes,
    canonical_json,
    definition_digest,
    digest_bytes,
    iso,
    optional_text,
    ordered_uuid,
    parse_now,
    require_count,
    require_lease_ms,
    require_run_id,
    require_text,
    to_datetime,
    token_hash,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
T0_MS = 1767225600000


def refused(message: str, call: Any, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(InvalidInput) as caught:
        call(*args, **kwargs)
    assert caught.value.message == message


# -- parse_now -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        T0,
        datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))),
        datetime(2025, 12, 31, 19, tzinfo=timezone(timedelta(hours=-5))),
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00z",
        "2026-01-01T00:00:00.000Z",
        "2026-01-01T00:00:00+00:00",
        "2026-01-01T05:30:00+05:30",
        "2026-01-01 00:00:00+00:00",
    ],
)
def test_parse_now__reads_aware_times_and_iso_strings_as_epoch_ms(value: object) -> None:
    assert parse_now(value) == T0_MS  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (datetime(2026, 1, 1, 0, 0, 0, 999, tzinfo=UTC), T0_MS),
        (datetime(2026, 1, 1, 0, 0, 0, 1_000, tzinfo=UTC), T0_MS + 1),
        (datetime(2026, 1, 1, 0, 0, 0, 999_999, tzinfo=UTC), T0_MS + 999),
        ("2026-01-01T00:00:00.1239Z", T0_MS + 123),
        ("2026-01-01T00:00:00.5Z", T0_MS + 500),
        (datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), MAX_EPOCH_MS),
        (datetime(7291, 6, 23, 17, 7, 12, 223_984, tzinfo=UTC), 167929607232223),
        (EPOCH, 0),
    ],
)
def test_parse_now__truncates_to_the_millisecond(value: object, ms: int) -> None:
    assert parse_now(value) == ms  # type: ignore[arg-type]


def test_parse_now__none_is_the_wall_clock() -> None:
    before = time.time_ns() // 1_000_000
    value = parse_now(None)
    after = time.time_ns() // 1_000_000
    assert before <= value <= after


@pytest.mark.parametrize(
    "value", ["", "not a time", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-01-01T24:61:00Z", "Z"]
)
def test_parse_now__refuses_unparsable_strings(value: str) -> None:
    refused("Invalid timestamp", parse_now, value)


@pytest.mark.parametrize("value", [0, 1767225600000, 1.5, True, b"2026-01-01T00:00:00Z", date(2026, 1, 1)])
def test_parse_now__refuses_values_that_are_not_times(value: object) -> None:
    refused("Invalid timestamp", parse_now, value)


@pytest.mark.parametrize("value", [datetime(2026, 1, 1), "2026-01-01T00:00:00", "2026-01-01"])
def test_parse_now__refuses_naive_times(value: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_now(value)  # type: ignore[arg-type]
    assert caught.value.message.startswith("Invalid timestamp")
    assert "timezone" in caught.value.message


@pytest.mark.parametrize(
    "value",
    [
        "1969-12-31T23:59:59.999Z",
        datetime(1969, 12, 31, 23, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-1))),
    ],
)
def test_parse_now__refuses_times_outside_1970_to_9999(value: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_now(value)  # type: ignore[arg-type]
    assert caught.value.message == "Invalid timestamp: it must lie between 1970 and 9999"


@given(st.integers(min_value=0, max_value=MAX_EPOCH_MS))
def test_parse_now__round_trips_iso_and_to_datetime(ms: int) -> None:
    assert parse_now(iso(ms)) == ms
    moment = to_datetime(ms)
    assert moment is not None
    assert parse_now(moment) == ms


@given(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999_999)))
def test_parse_now__equals_exact_millisecond_floor(moment: datetime) -> None:
    aware = moment.replace(tzinfo=UTC)
    assert parse_now(aware) == (aware - EPOCH) // timedelta(milliseconds=1)


# -- iso / to_datetime -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (1, "1970-01-01T00:00:00.001Z"),
        (T0_MS + 999, "2026-01-01T00:00:00.999Z"),
        (T0_MS + 61_010, "2026-01-01T00:01:01.010Z"),
        (MAX_EPOCH_MS, "9999-12-31T23:59:59.999Z"),
    ],
)
def test_iso__prints_utc_with_three_fraction_digits_and_z(ms: int, text: str) -> None:
    assert iso(ms) == text


def test_to_datetime__is_aware_utc_and_keeps_none() -> None:
    assert to_datetime(None) is None
    assert to_datetime(T0_MS + 5) == T0 + timedelta(milliseconds=5)
    moment = to_datetime(0)
    assert moment is not None and moment.utcoffset() == timedelta(0)


# -- run id ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["a", "0", "Z", "a" * 200, "a.b-c_d", "0..--__"])
def test_require_run_id__accepts_the_pattern(value: str) -> None:
    assert require_run_id(value) == value


@pytest.mark.parametrize(
    "value", ["", ".a", "-a", "_a", "a" * 201, "a b", "a/b", "a\n", "\na", "ä", "a\x00", None, 1, ["a"]]
)
def test_require_run_id__refuses_everything_else(value: object) -> None:
    refused(f"Invalid workflow run id: {value}", require_run_id, value)


# -- digests ---------------------------------------------------------------------------------

HEX = "0123456789abcdef" * 4


@pytest.mark.parametrize("value", [HEX, f"sha256:{HEX}", HEX.upper(), f"sha256:{HEX.upper()}"])
def test_digest_bytes__accepts_64_hex_with_optional_prefix_in_any_case(value: str) -> None:
    assert digest_bytes(value) == bytes.fromhex(HEX)


@pytest.mark.parametrize(
    "value",
    [
        HEX[:-1],
        HEX + "0",
        f"sha256:{HEX[:-1]}",
        f"sha256:{HEX}0",
        f"SHA256:{HEX}",
        f"sha512:{HEX}",
        f"sha256:sha256:{HEX}",
        "g" * 64,
        f"{HEX}\n",
        "",
        None,
        bytes.fromhex(HEX),
    ],
)
def test_digest_bytes__refuses_anything_else(value: object) -> None:
    refused("Expected a SHA-256 digest", digest_bytes, value)


def test_definition_digest__is_sha256_of_the_canonical_snapshot() -> None:
    expected = "sha256:" + hashlib.sha256(b'{"a":1,"b":[2]}').hexdigest()
    assert definition_digest({"b": [2.0], "a": 1}) == expected


def test_token_hash__is_sha256_of_the_utf8_token() -> None:
    assert token_hash("tök") == hashlib.sha256("tök".encode()).digest()
    assert len(token_hash("")) == 32


# -- text, counts and lease lengths ----------------------------------------------------------


@pytest.mark.parametrize("value", ["x", "a" * 200, "ünï code"])
def test_require_text__accepts_non_empty_bounded_strings(value: str) -> None:
    assert require_text("name", value) == value


@pytest.mark.parametrize("value", ["", "a" * 201, "a\x00b", None, 3, b"bytes"])
def test_require_text__refuses_empty_long_nul_and_non_strings(value: object) -> None:
    refused(
        "name must be a non-empty string of at most 200 characters without NUL", require_text, "name", value
    )


def test_require_text__takes_a_limit() -> None:
    assert require_text("ref", "a" * 4096, limit=4096) == "a" * 4096
    refused(
        "ref must be a non-empty string of at most 4096 characters without NUL",
        require_text,
        "ref",
        "a" * 4097,
        limit=4096,
    )


def test_optional_text__none_passes_otherwise_like_require_text() -> None:
    assert optional_text("name", None) is None
    assert optional_text("name", "x") == "x"
    refused(
        "name must be a non-empty string of at most 200 characters without NUL", optional_text, "name", ""
    )


@pytest.mark.parametrize("value", [1, 30_000, MAX_LEASE_MS])
def test_require_lease_ms__accepts_1_ms_to_24_h(value: int) -> None:
    assert require_lease_ms(value) == value


@pytest.mark.parametrize("value", [0, -1, MAX_LEASE_MS + 1, 1.5, 30_000.0, True, "30000", None])
def test_require_lease_ms__refuses_others(value: object) -> None:
    refused(
        f"lease_ms must be a whole number of milliseconds from 1 to {MAX_LEASE_MS}", require_lease_ms, value
    )


@pytest.mark.parametrize(("value", "minimum"), [(0, 0), (5, 0), (1, 1), (MAX_INT, 0)])
def test_require_count__accepts_whole_numbers_from_the_minimum(value: int, minimum: int) -> None:
    assert require_count("n", value, minimum=minimum) == value


@pytest.mark.parametrize(
    ("value", "minimum"), [(-1, 0), (0, 1), (MAX_INT + 1, 0), (1.0, 0), (True, 0), (False, 0), ("1", 0)]
)
def test_require_count__refuses_others(value: object, minimum: int) -> None:
    refused(f"n must be a whole number of at least {minimum}", require_count, "n", value, minimum=minimum)


# -- canonical JSON --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "null"),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (-0.0, "0"),
        (0.0, "0"),
        (1.0, "1"),
        (-3.0, "-3"),
        (2.5, "2.5"),
        (1e16, "10000000000000000"),
        (1e300, "1e+300"),
        (MAX_INT, str(MAX_INT)),
        ('é\u2028"\\', '"é\u2028\\"\\\\"'),
        ([], "[]"),
        ({}, "{}"),
        ((1, "a"), '[1,"a"]'),
        ({"b": 1, "a": 2}, '{"a":2,"b":1}'),
        (
            {"b": {"d": [{"z": 1, "y": -0.0}], "c": None}, "a": [3.0]},
            '{"a":[3],"b":{"c":null,"d":[{"y":0,"z":1}]}}',
        ),
        ({"é": 1, "e": 2, "Z": 3}, '{"Z":3,"e":2,"é":1}'),
    ],
)
def test_canonical_json__is_sorted_compact_and_normalised(value: object, text: str) -> None:
    assert canonical_json(value) == text
    assert canonical_bytes(value) == text.encode("utf-8")


def test_canonical_json__does_not_mutate_its_input() -> None:
    value = {"b": [1.0, -0.0], "a": {"y": 1, "x": 2}}
    canonical_json(value)
    assert value == {"b": [1.0, -0.0], "a": {"y": 1, "x": 2}}
    assert list(value) == ["b", "a"]


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), float("-inf"), [1, float("nan")], {"a": float("inf")}]
)
def test_canonical_json__refuses_non_finite_numbers(value: object) -> None:
    refused("JSON numbers must be finite", canonical_json, value)


@pytest.mark.parametrize("value", [{1: "a"}, {None: 1}, {True: 1}, {("a",): 1}, [{"ok": {2: 3}}]])
def test_canonical_json__refuses_non_string_keys(value: object) -> None:
    refused("Only plain objects can be stored as canonical JSON", canonical_json, value)


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ({1}, "set"),
        (frozenset(), "frozenset"),
        (b"x", "bytes"),
        (bytearray(b"x"), "bytearray"),
        (Decimal(1), "Decimal"),
        (1j, "complex"),
        (T0, "datetime"),
        (object(), "object"),
        ([{"a": [{1}]}], "set"),
    ],
)
def test_canonical_json__refuses_unsupported_types(value: object, name: str) -> None:
    refused(f"Unsupported JSON value type: {name}", canonical_json, value)


@pytest.mark.parametrize("value", [MAX_INT + 1, -(MAX_INT + 1) - 1, 10**30, {"a": MAX_INT + 1}])
def test_canonical_json__refuses_integers_beyond_64_bits(value: int) -> None:
    refused("JSON integers must fit in 64 bits", canonical_json, value)


@pytest.mark.parametrize("value", ["\ud800", {"\udfff": 1}, ["ok", "a\ud83d"], {"a": "é\ud800"}])
def test_canonical_json__refuses_lone_surrogates(value: object) -> None:
    refused("JSON strings must be valid Unicode (no lone surrogates)", canonical_json, value)


def test_canonical_json__flat_objects_normalise_like_nested_ones() -> None:
    """Flat objects of plain values take a shorter path; one with a float still normalises."""
    assert canonical_json({"b": "é", "a": True, "c": None, "d": -MAX_INT}) == (
        f'{{"a":true,"b":"é","c":null,"d":{-MAX_INT}}}'
    )
    assert canonical_json({"a": 1.0, "b": -0.0}) == '{"a":1,"b":0}'


def nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def test_canonical_json__limits_depth() -> None:
    assert canonical_json(nested(MAX_JSON_DEPTH)) == "[" * MAX_JSON_DEPTH + "0" + "]" * MAX_JSON_DEPTH
    refused(
        f"JSON values may nest at most {MAX_JSON_DEPTH} levels deep",
        canonical_json,
        nested(MAX_JSON_DEPTH + 1),
    )


def test_canonical_json__limits_size_in_bytes() -> None:
    fits = "a" * (MAX_JSON_BYTES - 2)
    assert len(canonical_bytes(fits)) == MAX_JSON_BYTES
    message = f"JSON values may be at most {MAX_JSON_BYTES} bytes"
    refused(message, canonical_bytes, "a" * (MAX_JSON_BYTES - 1))
    # Two bytes per character: within the limit in characters, beyond it in bytes.
    refused(message, canonical_bytes, "é" * (MAX_JSON_BYTES // 2))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_canonical_json__is_a_fixed_point_of_parsing(value: object) -> None:
    text = canonical_json(value)
    assert canonical_json(json.loads(text)) == text


@given(st.dictionaries(st.text(max_size=5), st.integers(min_value=0, max_value=9), max_size=6))
def test_canonical_json__ignores_key_insertion_order(value: dict[str, int]) -> None:
    reversed_order = dict(reversed(list(value.items())))
    assert canonical_json(reversed_order) == canonical_json(value)
    assert list(json.loads(canonical_json(value))) == sorted(value)


@given(st.integers(min_value=0, max_value=MAX_EPOCH_MS), st.integers(min_value=1, max_value=10**6))
def test_ordered_uuid__is_a_version_7_uuid_that_sorts_by_its_milliseconds(now_ms: int, later: int) -> None:
    import uuid

    first = ordered_uuid(now_ms)
    parsed = uuid.UUID(first)
    assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert str(parsed) == first
    assert parsed.int >> 80 == now_ms % (1 << 48)
    if now_ms + later < 1 << 48:
        assert first < ordered_uuid(now_ms + later)  # a later millisecond sorts after, as text too


def test_ordered_uuid__differs_within_one_millisecond() -> None:
    assert len({ordered_uuid(1_796_000_000_000) for _ in range(1000)}) == 1000
