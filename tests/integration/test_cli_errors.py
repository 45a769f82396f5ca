"""Refused ``tether`` commands: the exit code names the cause, stderr holds one ``tether:`` line
and no traceback, and the database is exactly as it was before the call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.support import Lab

#: (command with {placeholders}, exit status, start of the message after "tether: ")
REFUSALS: list[tuple[str, int, str]] = [
    # Unknown ids: exit 3.
    ("show run-nosuch", 3, "Workflow run not found: run-nosuch"),
    ("show run-nosuch --json", 3, "Workflow run not found: run-nosuch"),
    ("watch run-nosuch", 3, "Workflow run not found: run-nosuch"),
    ("cancel run-nosuch", 3, "Workflow run not found: run-nosuch"),
    ("pause run-nosuch", 3, "Workflow run not found: run-nosuch"),
    ("resume run-nosuch", 3, "Workflow run not found: run-nosuch"),
    ("restart run-nosuch", 3, "Workflow run not found: run-nosuch"),
    ("answer decision-nosuch approve", 3, "Decision not found: decision-nosuch"),
    ("answer decision-nosuch 7", 3, "Decision not found: decision-nosuch"),
    ("submit request-nosuch {{}} --session session-form", 3, "Interactive request not found: request-nosuch"),
    ("effects --resolve effect-nosuch applied", 3, "Effect not found: effect-nosuch"),
    ("graph nosuch", 3, "Unknown workflow 'nosuch' (known: "),
    ("start nosuch", 3, "Unknown workflow 'nosuch' (known: "),
    ("run nosuch", 3, "Unknown workflow 'nosuch' (known: "),
    # Malformed or invalid input: exit 4.
    ("start healthy --input {{bad", 4, "--input is not valid JSON: "),
    ("run healthy --input [1,", 4, "--input is not valid JSON: "),
    ("restart {done} --input {{bad", 4, "--input is not valid JSON: "),
    ("answer {size_decision} seven", 4, "the answer is not valid JSON: "),
    ("answer {size_decision} 0", 4, "Answer does not match the decision's schema: $: less than 1"),
    ("answer {open_decision} maybe", 4, "Answer must be one of approve, reject"),
    ("submit {request} {{oops --session session-form", 4, "the payload is not valid JSON: "),
    ("start healthy --run-id bad/id", 4, "Invalid workflow run id: bad/id"),
    ("effects --resolve {effect} undo", 4, "outcome must be 'applied', 'rejected' or 'retry'"),
    ("--store mysql://db/tether runs", 4, "Unsupported store URL 'mysql://db/tether'"),
    ("restart {done} --from nosuch", 4, "Workflow healthy has no node nosuch (its nodes: one, two)"),
    # The run, decision, request or effect is in the wrong state: exit 5.
    ("pause {queued}", 5, "Workflow run {queued} cannot be paused: only a parked run waiting"),
    ("pause {done}", 5, "Workflow run {done} cannot be paused: "),
    ("resume {done}", 5, "Workflow run {done} cannot be resumed: it is done/completed"),
    ("cancel {done}", 5, "Workflow run {done} is already done"),
    ("restart {queued}", 5, "Workflow run {queued} is queued: only a finished run can be restarted"),
    ("restart {restarted}", 5, "Workflow run {restarted} was already restarted as {restarted}-r1: "),
    ("restart {restarted} --new-run-id run-other", 5, "Workflow run {restarted} was already restarted as "),
    ("restart {queued} --from two", 5, "Workflow run {queued} is queued: only a finished run can be "),
    ("restart {routed} --from big", 5, "Workflow run {routed} never reached node big: nothing to fork"),
    ("restart {restarted} --from two", 5, "Workflow run {restarted} was already restarted as "),
    ("answer {answered_decision} approve", 5, "Decision {answered_decision} was already resolved"),
    ("submit {request} {{}} --session session-other", 5, "Interactive request {request} belongs to another"),
    ("effects --resolve {effect} applied", 5, "Effect {effect} is applied, not ambiguous"),
    ("start form --session session-busy", 5, "Session session-busy already has an active interactive run"),
    (
        "start healthy --run-id {queued} --input 1",
        5,
        "Run id {queued} is already used by a run with a different input",
    ),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, dict[str, str]]]:
    """A store holding runs in every state the refusals need."""
    lab = Lab(Path(tmp_path_factory.mktemp("refusals")))
    lab.release("open")
    ids = {
        "done": lab.start("healthy", run_id="run-done"),
        "restarted": lab.start("healthy", run_id="run-restarted"),
        "approval": lab.start("approval", run_id="run-approval"),
        "answered": lab.start("approval", run_id="run-answered"),
        "sizing": lab.start("sizing", run_id="run-sizing"),
        "form": lab.start("form", run_id="run-form", session_id="session-form"),
        "published": lab.start("publishing", {"latch": "open"}, run_id="run-published"),
        "routed": lab.start("routed", {"n": 1}, run_id="run-routed"),
    }
    drained = lab.cli("worker", "--until-idle", "--lease-ms", "1500", "--poll-ms", "50")
    assert drained.returncode == 0, drained.stderr
    assert lab.cli("restart", ids["restarted"]).returncode == 0
    ids["queued"] = lab.start("healthy", run_id="run-queued")
    lab.start("form", run_id="run-busy", session_id="session-busy")
    decisions = {d.run_id: d.decision_id for d in lab.client.decisions()}
    ids["open_decision"] = decisions[ids["approval"]]
    ids["size_decision"] = decisions[ids["sizing"]]
    ids["answered_decision"] = decisions[ids["answered"]]
    lab.client.answer(ids["answered_decision"], "reject")
    [request] = lab.client.store.requests(run_id=ids["form"], status="pending")
    ids["request"] = request.request_id
    [effect] = lab.client.store.effects(run_id=ids["published"])
    ids["effect"] = effect.effect_id
    assert lab.view(ids["done"]).status == "done"
    assert effect.status == "applied"
    try:
        yield lab, ids
    finally:
        lab.shutdown()


@pytest.mark.parametrize(("command", "code", "message"), REFUSALS, ids=[r[0].split()[0] for r in REFUSALS])
def test_refused_command_exits_with_its_code_and_one_line_and_writes_nothing(
    world: tuple[Lab, dict[str, str]], command: str, code: int, message: str
) -> None:
    lab, ids = world
    argv = [part.format(**ids) for part in command.split()]
    before = lab.fingerprint()
    result = lab.cli(*argv, store=argv[0] != "--store")
    assert result.returncode == code, f"stdout={result.stdout!r} stderr={result.stderr!r}"
    assert result.stdout == ""
    stderr = result.stderr.splitlines()
    assert len(stderr) == 1, result.stderr
    assert stderr[0].startswith("tether: " + message.format(**ids)), stderr[0]
    assert "Traceback" not in result.stderr
    assert lab.changes_since(before) == {}, "a refused command changed the database"


def test_a_refused_call_leaves_every_table_row_count_as_it_was(world: tuple[Lab, dict[str, str]]) -> None:
    lab, ids = world
    counts = lab.row_counts()
    assert counts["runs"] >= 9 and counts["events"] > 0
    for argv in (["pause", ids["queued"]], ["resume", ids["done"]], ["start", "healthy", "--input", "{"]):
        assert lab.cli(*argv).returncode in (4, 5)
    assert lab.row_counts() == counts


def test_a_missing_argument_is_a_usage_error(world: tuple[Lab, dict[str, str]]) -> None:
    lab, _ = world
    result = lab.cli("show")
    assert result.returncode == 2
    assert "usage: tether show [-h] [--json] [--conversation] run_id" in result.stderr
    assert "the following arguments are required: run_id" in result.stderr
