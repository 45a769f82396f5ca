"""Bad input: Hypothesis-generated run ids, digests, JSON payloads (deep nesting, huge numbers, NaN,
lone surrogates, NUL), timestamps (naive, out of range, garbage) and sizes at and over every limit,
through the Python API and the CLI. Only Tether's own errors (``TetherError`` subclasses) come out,
never a crash; a refused call leaves every table exactly as it was; whatever is accepted keeps the
oracle's invariants.
"""

from __future__ import annotations

import io
import math
import subprocess
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.support import TETHER, clean_env
from tests.reliability import oracle
from tests.reliability.support import soak_report
from tests.store.conftest import DIGEST, LEASE, at, reserve_args, snapshot
from tether import cli, open_store
from tether.errors import InvalidInput, TetherError
from tether.store import Store
from tether.values import MAX_EPOCH_MS, MAX_INT, MAX_JSON_BYTES, MAX_JSON_DEPTH, MAX_LEASE_MS, RUN_ID_PATTERN

TOKEN = "tok-held"

# -- strategies ---------------------------------------------------------------------------------
characters = st.one_of(
    st.characters(),
    st.characters(categories=["Cs"]),  # lone surrogates
    st.sampled_from(["\x00", "\udcff", "\ufeff", "\U0010ffff", "é", "/"]),
)
texts = st.lists(characters, max_size=30).map("".join)
run_ids = st.one_of(
    st.from_regex(RUN_ID_PATTERN, fullmatch=True),
    texts,
    st.sampled_from(["", ".a", "-a", "a" * 200, "a" * 201, "a\x00b", "a\udcffb", "run 1"]),
    st.integers(),
    st.none(),
)
digests = st.one_of(
    st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex()),
    st.binary(min_size=32, max_size=32).map(lambda b: b.hex().upper()),
    st.binary(min_size=31, max_size=33).map(lambda b: b.hex()),
    texts,
    st.none(),
    st.integers(),
)


def nested(depth: int) -> Any:
    value: Any = 1
    for n in range(depth):
        value = [value] if n % 2 else {"k": value}
    return value


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),  # unbounded: past 64 bits too
    st.sampled_from([MAX_INT, -MAX_INT, MAX_INT + 1, -MAX_INT - 1, 2**200]),
    st.floats(allow_nan=True, allow_infinity=True),
    texts,
)
json_values = st.one_of(
    st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.tuples(children, children),
            st.dictionaries(st.one_of(texts, st.integers()), children, max_size=4),
        ),
        max_leaves=15,
    ),
    st.integers(MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH + 3).map(nested),
    st.sampled_from([set(), b"bytes", object(), float("nan"), math.inf, complex(1, 1)]),
)
offsets = st.integers(-23 * 60, 23 * 60).map(lambda m: timezone(timedelta(minutes=m)))
timestamps = st.one_of(
    st.datetimes(),  # naive
    st.datetimes(timezones=offsets),
    st.datetimes(min_value=datetime(1969, 12, 1), max_value=datetime(1970, 1, 2), timezones=st.just(UTC)),
    st.sampled_from(
        [
            "2026-01-01T00:00:00Z",
            "1970-01-01T00:00:00Z",
            "1969-12-31T23:59:59.999Z",
            "9999-12-31T23:59:59.999Z",
            "9999-12-31T23:59:59.999-01:00",
            "2026-01-01T00:00:00",
            "not a time",
            "",
        ]
    ),
    texts,
    st.integers(),
)
lease_values = st.one_of(
    st.integers(), st.sampled_from([0, 1, MAX_LEASE_MS, MAX_LEASE_MS + 1, True, 1.5, "1000", None])
)


# -- the Python API -------------------------------------------------------------------------------
def call_reserve(store: Store, data: st.DataObject) -> Any:
    args = reserve_args(
        data.draw(run_ids, "run_id"),
        definition_digest=data.draw(digests, "digest"),
        input=data.draw(json_values, "input"),
        launch_options=data.draw(st.one_of(st.none(), json_values), "launch_options"),
        now=data.draw(timestamps, "now"),
        origin_session_id=data.draw(st.one_of(texts, st.just("session-x")), "session"),
        workflow_name=data.draw(st.one_of(texts, st.just("demo")), "workflow_name"),
    )
    if data.draw(st.booleans(), "bad snapshot"):
        args["definition_snapshot"] = data.draw(json_values, "snapshot")
    return store.reserve(**args)


def call_record_event(store: Store, data: st.DataObject) -> Any:
    return store.record_event(
        run_id=data.draw(st.one_of(st.just("held"), run_ids), "run_id"),
        workflow_ref=data.draw(st.one_of(st.just("builtin:demo"), texts), "ref"),
        type=data.draw(st.one_of(st.just("note"), texts), "type"),
        payload=data.draw(st.one_of(st.dictionaries(texts, json_values, max_size=3), json_values), "payload"),
        now=data.draw(timestamps, "now"),
    )


def call_claim(store: Store, data: st.DataObject) -> Any:
    return store.claim(
        run_id=data.draw(st.one_of(st.just("spare"), run_ids), "run_id"),
        runner_id=data.draw(st.one_of(st.just("host-z"), texts), "runner"),
        claim_token=data.draw(st.one_of(st.just("tok-spare"), texts), "token"),
        lease_ms=data.draw(lease_values, "lease_ms"),
        now=data.draw(timestamps, "now"),
    )


def call_held(store: Store, data: st.DataObject) -> Any:
    """A claim-gated write on the held run with one bad argument."""
    op = data.draw(
        st.sampled_from(["renew", "fail", "effect_enqueue", "events_after", "park_for_no_progress"])
    )
    token = data.draw(st.one_of(st.just(TOKEN), texts), "token")
    now = data.draw(st.one_of(st.just(at(100)), timestamps), "now")
    if op == "renew":
        return store.renew(run_id="held", claim_token=token, lease_ms=data.draw(lease_values), now=now)
    if op == "fail":
        return store.fail(
            run_id="held",
            claim_token=token,
            error_code=data.draw(texts, "code"),
            error_message=data.draw(st.one_of(texts, st.integers()), "message"),
            now=now,
        )
    if op == "effect_enqueue":
        return store.effect_enqueue(
            run_id="held",
            claim_token=token,
            effect_type=data.draw(st.one_of(st.just("mail.send"), texts), "type"),
            idempotency_key=data.draw(texts, "key"),
            payload=data.draw(json_values, "payload"),
            now=now,
        )
    if op == "park_for_no_progress":
        return store.park_for_no_progress(
            run_id="held", claim_token=token, detail=data.draw(st.one_of(texts, st.none())), now=now
        )
    return store.events_after(
        data.draw(st.one_of(st.integers(), st.just(True), st.none()), "seq"),
        limit=data.draw(st.one_of(st.integers(), st.floats()), "limit"),
        run_id=data.draw(st.one_of(st.none(), run_ids), "run_id"),
    )


def call_reads(store: Store, data: st.DataObject) -> Any:
    op = data.draw(st.sampled_from(["get_run", "effects", "messages", "decisions", "viewer_changes"]))
    value = data.draw(run_ids, "id")
    if op == "get_run":
        return store.get_run(value)  # type: ignore[arg-type]
    if op == "effects":
        return store.effects(run_id=value, status=data.draw(st.one_of(st.none(), texts)))  # type: ignore[arg-type]
    if op == "messages":
        return store.messages(session_id=value)  # type: ignore[arg-type]
    if op == "decisions":
        return store.decisions(run_id=value, expired_by=data.draw(st.one_of(st.none(), timestamps)))  # type: ignore[arg-type]
    return store.viewer_changes(run_id="held", revision=data.draw(st.one_of(st.integers(), st.just(2**80))))


API_CALLS: dict[str, Callable[[Store, st.DataObject], Any]] = {
    "reserve": call_reserve,
    "record_event": call_record_event,
    "claim": call_claim,
    "held": call_held,
    "reads": call_reads,
}


def prepared(tmp_path: Path) -> tuple[Store, oracle.History]:
    store = open_store(f"sqlite:///{tmp_path}/bad.db")
    store.reserve(**reserve_args("held", origin_session_id="session-held"))
    store.reserve(**reserve_args("spare", origin_session_id="session-spare"))
    assert store.claim(run_id="held", runner_id="host-a", claim_token=TOKEN, lease_ms=60_000, now=at(10))
    history = oracle.History(reserved={"held", "spare"}, tokens={TOKEN}, drained=False, min_rejections=0)
    return store, history


@pytest.mark.slow
def test_bad_input__python_api_raises_only_tether_errors_and_a_refusal_writes_nothing(
    tmp_path: Path, seed: int, soak: bool
) -> None:
    store, history = prepared(tmp_path)
    tally = {"refused": 0, "accepted": 0}

    @settings(
        max_examples=2000 if soak else 250,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(API_CALLS)), "call")
        before = snapshot(store)
        try:
            result = API_CALLS[name](store, data)
        except TetherError:
            tally["refused"] += 1
            assert snapshot(store) == before, f"{name} was refused but wrote"
            return
        tally["accepted"] += 1
        if name == "reserve":
            history.reserved.add(result.run_id)
        if name == "claim" and result is not None and result.claim_token == "tok-spare":
            # Only the fixed token: a short random one could match stored bytes by chance.
            history.tokens.add(result.claim_token)
        oracle.check(store, history)

    hypothesis.seed(seed)(check)
    check()
    oracle.check(store, history)
    print("bad input (API):", tally)
    soak_report("Bad input through the Python API", tally, [f"seed {seed}."])
    assert tally["refused"] > 0 and tally["accepted"] > 0
    store.close()


# -- limits, at and over -------------------------------------------------------------------------
def big_text(size: int, char: str = "x") -> str:
    """A JSON string whose canonical form is exactly ``size`` bytes."""
    width = len(char.encode("utf-8"))
    return char * ((size - 2) // width)


LIMITS: list[tuple[str, Callable[[Store], Any], bool]] = [
    ("run id of 200 characters", lambda s: s.reserve(**reserve_args("a" * 200)), True),
    ("run id of 201 characters", lambda s: s.reserve(**reserve_args("a" * 201)), False),
    ("workflow name of 200", lambda s: s.reserve(**reserve_args("r", workflow_name="n" * 200)), True),
    ("workflow name of 201", lambda s: s.reserve(**reserve_args("r", workflow_name="n" * 201)), False),
    ("source ref of 4096", lambda s: s.reserve(**reserve_args("r", workflow_source_ref="s" * 4096)), True),
    ("source ref of 4097", lambda s: s.reserve(**reserve_args("r", workflow_source_ref="s" * 4097)), False),
    (
        "digest of 64 hex, upper case",
        lambda s: s.reserve(
            **reserve_args("r", definition_digest=DIGEST.upper().replace("SHA256:", "sha256:"))
        ),
        True,
    ),
    ("digest of 63 hex", lambda s: s.reserve(**reserve_args("r", definition_digest=DIGEST[:-1])), False),
    ("digest of 65 hex", lambda s: s.reserve(**reserve_args("r", definition_digest=DIGEST + "a")), False),
    ("JSON nested 64 deep", lambda s: s.reserve(**reserve_args("r", input=nested(MAX_JSON_DEPTH))), True),
    (
        "JSON nested 65 deep",
        lambda s: s.reserve(**reserve_args("r", input=nested(MAX_JSON_DEPTH + 1))),
        False,
    ),
    ("JSON integer 2**63-1", lambda s: s.reserve(**reserve_args("r", input=[MAX_INT, -MAX_INT])), True),
    ("JSON integer 2**63", lambda s: s.reserve(**reserve_args("r", input=[MAX_INT + 1])), False),
    ("JSON integer -2**63", lambda s: s.reserve(**reserve_args("r", input=[-MAX_INT - 1])), False),
    ("JSON NaN", lambda s: s.reserve(**reserve_args("r", input={"x": math.nan})), False),
    ("JSON lone surrogate", lambda s: s.reserve(**reserve_args("r", input={"x": "\udc80"})), False),
    ("JSON key with a lone surrogate", lambda s: s.reserve(**reserve_args("r", input={"\ud800": 1})), False),
    ("JSON NUL inside a string", lambda s: s.reserve(**reserve_args("r", input={"x": "a\x00b"})), True),
    ("JSON of 4 MiB", lambda s: s.reserve(**reserve_args("r", input=big_text(MAX_JSON_BYTES))), True),
    (
        "JSON of 4 MiB + 1",
        lambda s: s.reserve(**reserve_args("r", input=big_text(MAX_JSON_BYTES + 1) + "x")),
        False,
    ),
    (
        "JSON of 4 MiB in two-byte characters + 2",
        lambda s: s.reserve(**reserve_args("r", input=big_text(MAX_JSON_BYTES + 4, "é"))),
        False,
    ),
    ("now at 1970", lambda s: s.reserve(**reserve_args("r", now="1970-01-01T00:00:00Z")), True),
    ("now before 1970", lambda s: s.reserve(**reserve_args("r", now="1969-12-31T23:59:59.999Z")), False),
    (
        "now at the last millisecond of 9999",
        lambda s: s.reserve(
            **reserve_args("r", now=datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=MAX_EPOCH_MS))
        ),
        True,
    ),
    ("now naive", lambda s: s.reserve(**reserve_args("r", now=datetime(2026, 1, 1))), False),
    ("now unparsable", lambda s: s.reserve(**reserve_args("r", now="yesterday")), False),
    (
        "lease of 1 ms",
        lambda s: s.claim(run_id="spare", runner_id="h", claim_token="tok-limit-0001", lease_ms=1, now=at(5)),
        True,
    ),
    (
        "lease of 24 h",
        lambda s: s.claim(
            run_id="spare", runner_id="h", claim_token="tok-limit-0001", lease_ms=MAX_LEASE_MS, now=at(5)
        ),
        True,
    ),
    (
        "lease of 0 ms",
        lambda s: s.claim(run_id="spare", runner_id="h", claim_token="tok-limit-0001", lease_ms=0, now=at(5)),
        False,
    ),
    (
        "lease of 24 h + 1 ms",
        lambda s: s.claim(
            run_id="spare", runner_id="h", claim_token="tok-limit-0001", lease_ms=MAX_LEASE_MS + 1, now=at(5)
        ),
        False,
    ),
    (
        "token of 1000",
        lambda s: s.claim(run_id="spare", runner_id="h", claim_token="t" * 1000, lease_ms=LEASE, now=at(5)),
        True,
    ),
    (
        "token of 1001",
        lambda s: s.claim(run_id="spare", runner_id="h", claim_token="t" * 1001, lease_ms=LEASE, now=at(5)),
        False,
    ),
    (
        "idempotency key of 1000",
        lambda s: s.effect_enqueue(
            run_id="held", claim_token=TOKEN, effect_type="t", idempotency_key="k" * 1000, now=at(20)
        ),
        True,
    ),
    (
        "idempotency key of 1001",
        lambda s: s.effect_enqueue(
            run_id="held", claim_token=TOKEN, effect_type="t", idempotency_key="k" * 1001, now=at(20)
        ),
        False,
    ),
    ("events_after limit 0", lambda s: s.events_after(0, limit=0), False),
    ("events_after seq 2**63", lambda s: s.events_after(MAX_INT + 1), False),
    ("viewer revision past 64 bits", lambda s: s.viewer_changes(run_id="held", revision=2**80), False),
    ("run id with a lone surrogate (read)", lambda s: s.get_run("run-\udcff"), False),
    ("session with a lone surrogate (read)", lambda s: s.messages(session_id="s\ud800"), False),
]


@pytest.mark.parametrize(("case", "call", "accepted"), LIMITS, ids=[name for name, _, _ in LIMITS])
def test_limits__at_the_limit_accepted_over_it_refused_with_nothing_written(
    tmp_path: Path, case: str, call: Callable[[Store], Any], accepted: bool
) -> None:
    store, history = prepared(tmp_path)
    before = snapshot(store)
    if accepted:
        result = call(store)
        if getattr(result, "claim_token", None):
            history.tokens.add(result.claim_token)
        if case.startswith(("run id", "workflow", "source", "digest", "JSON", "now")):
            history.reserved.add(result.run_id)
    else:
        with pytest.raises(InvalidInput):
            call(store)
        assert snapshot(store) == before, f"{case}: refused but wrote"
    oracle.check(store, history)
    store.close()


def test_limits__a_detail_over_8192_characters_is_cut_not_refused(tmp_path: Path) -> None:
    store, history = prepared(tmp_path)
    assert store.park_for_no_progress(run_id="held", claim_token=TOKEN, detail="é" * 9000, now=at(50))
    view = store.get_run_view("held")
    assert view is not None and view.error_message == "é" * 8192
    oracle.check(store, history)
    store.close()


# -- the CLI ------------------------------------------------------------------------------------
#: Exit codes the CLI documents (tether.cli.EXIT_CODES), 0, and argparse's usage error.
KNOWN_CODES = {0, 2, *(code for _, code in cli.EXIT_CODES)}
FOLDER_FLOWS = (
    "from tether.engine.graph import Workflow, compute, decision\n"
    "def step(ctx):\n    return 1\n"
    "solo = Workflow('solo', start='a', nodes=[compute('a', step)], edges={})\n"
    "ask = Workflow('ask', start='q', nodes=[decision('q', 'Ship?', options=['yes', 'no'])], edges={})\n"
)
cli_words = st.one_of(
    texts.filter(lambda t: "\x00" not in t), st.sampled_from(["solo", "ask", "cli-1", "-1", "0"])
)
json_texts = st.one_of(
    st.sampled_from(
        ['{"a": 1}', "[1, 2", "NaN", "1e999", '"\\ud800"', '{"a": "\\u0000"}', "[" * 70 + "]" * 70]
    ),
    cli_words,
    st.integers().map(str),
)


@st.composite
def cli_argvs(draw: st.DrawFn) -> list[str]:
    command = draw(
        st.sampled_from(
            ["start", "show", "cancel", "events", "answer", "submit", "effects", "runs", "resume"]
        )
    )
    word = draw(cli_words)
    if command == "start":
        argv = ["start", draw(st.sampled_from(["solo", "ask"])), "--input", draw(json_texts)]
        if draw(st.booleans()):
            argv += ["--run-id", word]
        if draw(st.booleans()):
            argv += ["--session", draw(cli_words)]
        return argv
    if command == "events":
        return ["events", "--after", draw(st.one_of(st.integers().map(str), cli_words)), "--run-id", word]
    if command == "answer":
        return ["answer", word, draw(json_texts)]
    if command == "submit":
        return ["submit", word, draw(json_texts), "--session", draw(cli_words)]
    if command == "effects":
        return ["effects", "--resolve", word, draw(st.sampled_from(["applied", "retry", "maybe"]))]
    if command == "runs":
        return ["runs", "--limit", draw(st.integers().map(str)), "--offset", draw(st.integers().map(str))]
    return [command, word]


@pytest.mark.slow
def test_bad_input__cli_exits_with_a_documented_code_and_a_refusal_writes_nothing(
    tmp_path: Path, seed: int, soak: bool
) -> None:
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "flows.py").write_text(FOLDER_FLOWS)
    url = f"sqlite:///{tmp_path}/cli.db"
    store = open_store(url)
    codes: dict[int, int] = {}

    @settings(
        max_examples=1000 if soak else 150,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(argv=cli_argvs())
    def check(argv: list[str]) -> None:
        before = snapshot(store)
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = cli.main(["--store", url, "--folder", str(folder), *argv])
            except SystemExit as exit:  # argparse's usage errors
                code = exit.code if isinstance(exit.code, int) else 2
        codes[code] = codes.get(code, 0) + 1
        assert code in KNOWN_CODES, (argv, code, err.getvalue())
        assert "Traceback" not in err.getvalue()
        if code != 0:
            assert snapshot(store) == before, f"{argv} failed with {code} but wrote"

    hypothesis.seed(seed)(check)
    check()
    reserved = {v.run_id for v in store.list_run_views(limit=10_000).runs}
    oracle.check(store, oracle.History(reserved=reserved, drained=False, min_rejections=0))
    print("bad input (CLI):", codes)
    soak_report("Bad input through the CLI (exit code: examples)", codes, [f"seed {seed}."])
    assert codes.get(0) and len(codes) > 1
    store.close()


RAW_ARGVS: list[list[bytes]] = [
    [b"start", b"solo", b"--input", b'"\xff"'],
    [b"start", b"solo", b"--run-id", b"bad\xffid"],
    [b"start", b"solo", b"--input", b"{" * 100 + b"}" * 100],
    [b"start", b"solo", b"--input", b"[99999999999999999999999]"],
    [b"show", b"\xed\xa0\x80"],
    [b"events", b"--run-id", b"\xff", b"--after", b"0"],
    [b"effects", b"--run-id", b"\xfe\xff"],
    [b"cancel", b"a" * 5000],
    [b"submit", b"req-\xff", b"{}", b"--session", b"s\xff"],
    [b"runs", b"--limit", b"-1"],
]


@pytest.mark.slow
@pytest.mark.parametrize("argv", RAW_ARGVS, ids=[repr(a)[:40] for a in RAW_ARGVS])
def test_bad_input__real_cli_process_never_crashes_on_raw_bytes(tmp_path: Path, argv: list[bytes]) -> None:
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "flows.py").write_text(FOLDER_FLOWS)
    url = f"sqlite:///{tmp_path}/raw.db"
    store = open_store(url)
    before = snapshot(store)
    done = subprocess.run(
        [bytes(TETHER), b"--store", url.encode(), b"--folder", bytes(folder), *argv],
        env=clean_env(),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode in KNOWN_CODES - {0}, done.stderr
    assert b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    assert done.stderr.startswith(b"tether: ") or done.returncode == 2
    assert snapshot(store) == before
    store.close()
