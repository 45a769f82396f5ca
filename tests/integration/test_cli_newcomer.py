"""What a new user meets first: help, versions, readable output, errors in their own terms, and a
CLI that keeps working when one workflow file is broken. Every test runs the real ``tether``
command as a subprocess."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from tests.integration.support import EXAMPLES, TETHER, Lab, clean_env, wait_for


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"stdout={result.stdout!r} stderr={result.stderr!r}"
    assert "Traceback" not in result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], code: int, message: str) -> None:
    assert result.returncode == code, f"stdout={result.stdout!r} stderr={result.stderr!r}"
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("tether: "), result.stderr
    assert message in result.stderr, result.stderr


def drain(lab: Lab) -> str:
    return ok(lab.cli("worker", "--until-idle", "--lease-ms", "1500", "--poll-ms", "50"))


# -- help ------------------------------------------------------------------------------------
def test_bare_tether_prints_help_and_succeeds(tmp_path: Path) -> None:
    result = subprocess.run([str(TETHER)], cwd=tmp_path, env=clean_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: tether")
    assert "examples:" in result.stdout and "inbox" in result.stdout


def test_version_prints_the_package_version(tmp_path: Path) -> None:
    from importlib import metadata

    result = subprocess.run(
        [str(TETHER), "--version"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    assert result.returncode == 0
    assert result.stdout.strip() == f"tether {metadata.version('tether')}"


def test_every_command_help_has_examples(tmp_path: Path) -> None:
    from tether.clidoc import command_names

    for name in command_names():
        result = subprocess.run(
            [str(TETHER), name, "--help"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        examples = result.stdout.split("examples:\n", 1)
        assert len(examples) == 2, f"tether {name} --help has no examples"
        assert f"tether {name}" in examples[1] or (name == "serve" and "tether serve" in examples[1])


# -- a broken workflow file ------------------------------------------------------------------
def test_a_broken_workflow_file_does_not_disable_commands_that_do_not_execute_workflows(lab: Lab) -> None:
    approval = lab.start("approval", run_id="run-approval")
    drain(lab)
    lab.start("healthy", run_id="run-healthy")
    (lab.folder / "zz_broken.py").write_text("def oops(:\n", encoding="utf-8")
    [decision] = lab.client.decisions(approval)
    ok(lab.cli("runs"))
    assert "run-approval" in ok(lab.cli("show", approval))
    ok(lab.cli("effects"))
    ok(lab.cli("events", "--run-id", approval))
    ok(lab.cli("decisions"))
    ok(lab.cli("inbox"))
    assert "accepted" in ok(lab.cli("answer", decision.decision_id, "approve"))
    ok(lab.cli("cancel", "run-healthy"))
    # watch uses the workflow only for retry delays: it warns about the broken file and goes on.
    watched = lab.cli("watch", "run-healthy")
    assert watched.returncode == 1 and "cancelled" in watched.stdout
    assert watched.stderr.startswith("tether: warning: ") and "zz_broken.py" in watched.stderr
    # A command that loads the folder names the broken file, in one line.
    refused(lab.cli("workflows"), 1, "zz_broken.py")


# -- passwords -------------------------------------------------------------------------------
def test_store_urls_are_printed_with_the_password_masked(tmp_path: Path) -> None:
    url = "postgresql://tether:s3cret@127.0.0.1:1/nosuch?connect_timeout=1"
    for argv in (["db", "status"], ["runs"], ["worker", "--until-idle"]):
        result = subprocess.run(
            [str(TETHER), "--store", url, "--folder", str(EXAMPLES), *argv],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode != 0
        assert "s3cret" not in result.stdout + result.stderr
        assert "Traceback" not in result.stderr


def test_the_worker_prints_the_resolved_sqlite_path(lab: Lab) -> None:
    lab.start("healthy")
    result = subprocess.run(
        [str(TETHER), "--store", "sqlite:///rel/x.db", "--folder", str(lab.folder), "worker", "--until-idle"],
        cwd=lab.base,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"on sqlite:///{lab.base.resolve() / 'rel' / 'x.db'} (" in result.stdout
    status = subprocess.run(
        [str(TETHER), "--store", "sqlite:///rel/x.db", "db", "status"],
        cwd=lab.base,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"store sqlite:///{lab.base.resolve() / 'rel' / 'x.db'}" in status.stdout


def test_a_masked_url_log_filter_hides_passwords() -> None:
    from tether.clioutput import display_url, mask_urls

    assert display_url("postgresql://u:pw@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert mask_urls("cannot reach postgresql://u:pw@h/db now") == "cannot reach postgresql://u:***@h/db now"


# -- pipes and colour ------------------------------------------------------------------------
def test_runs_piped_into_head_ends_without_a_traceback(lab: Lab) -> None:
    for n in range(60):
        lab.start("healthy", run_id=f"run-{n:03}")
    result = subprocess.run(
        f"'{TETHER}' --store '{lab.url}' runs --limit 60 | head -1",
        shell=True,
        cwd=lab.base,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.split() == ["RUN", "WORKFLOW", "STATUS", "CREATED"]
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


def test_piped_output_has_no_colour_codes(lab: Lab) -> None:
    lab.start("healthy")
    assert "\x1b[" not in ok(lab.cli("runs"))
    assert "\x1b[" not in ok(lab.cli("inbox"))


# -- watch and run exit statuses -------------------------------------------------------------
def test_watch_exits_non_zero_on_a_cancelled_run(lab: Lab) -> None:
    run_id = lab.start("steps", {"latch": "never"})
    ok(lab.cli("cancel", run_id))
    result = lab.cli("watch", run_id)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cancelled" in result.stdout.splitlines()[-2] + result.stdout.splitlines()[-1]


def test_watch_exits_zero_on_a_completed_run_with_an_outcome_line(lab: Lab) -> None:
    run_id = lab.start("healthy")
    drain(lab)
    out = ok(lab.cli("watch", run_id))
    assert out.splitlines()[-1].startswith("completed")
    assert "▶ one" in out and "✓ two" in out


def test_run_shows_durations_retries_and_the_outcome(lab: Lab) -> None:
    out = ok(lab.cli("run", "patient", "--poll-ms", "50"))
    assert "✗ flaky failed" in out
    assert "ConnectionError: the first try fails" in out
    assert "retrying flaky in 500 ms (attempt 2)" in out
    assert "sleeping for 500 ms" in out
    assert out.splitlines()[-1].startswith("completed in ")


def test_runs_counts_down_to_a_retry(lab: Lab) -> None:
    run_id = lab.start("backing-off")
    worker = lab.worker("w1")
    wait_for(
        lambda: (
            lab.view(run_id).status == "parked"
            and [a.status for a in lab.client.store.attempts(run_id)] == ["failed"]
        ),
        what="the first try failed and the run parked for its backoff",
    )
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    out = ok(lab.cli("runs"))
    line = next(line for line in out.splitlines() if line.startswith(run_id))
    assert "retrying call in 9 min" in line and "(attempt 1 failed)" in line, line
    [shown] = json.loads(ok(lab.cli("runs", "--json")))["runs"]
    assert "retrying call in 9 min" in shown["summary"], shown


def test_show_and_watch_give_a_steps_progress(lab: Lab) -> None:
    run_id = lab.start("progressing", {"latch": "copy-latch"})
    worker = lab.worker("w1")
    wait_for(lambda: lab.client.progress(run_id).get("copy"), what="the step's first report")
    shown = ok(lab.cli("show", run_id))
    assert "progress of copy: 3/10 (30%) copying" in shown
    assert json.loads(ok(lab.cli("show", run_id, "--json")))["progress"]["copy"]["done"] == 3
    (lab.base / "copy-latch").touch()
    lab.wait_finished(run_id)
    watched = ok(lab.cli("watch", run_id))
    assert "⋯ copy 3/10 (30%) copying" in watched and "⋯ copy 10/10 (100%) copied" in watched
    assert "progress of" not in ok(lab.cli("show", run_id))  # a finished step's report is history
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_a_failed_step_routed_to_recovery_and_a_runaway_cycle_stopped(lab: Lab) -> None:
    recovered = lab.start("recovering")
    looped = lab.start("looping")
    drain(lab)
    shown = json.loads(ok(lab.cli("show", recovered, "--json")))
    assert shown["run"]["summary"] == "completed"
    assert shown["result"]["output"] == {
        "refunded": True,
        "because": "PermissionError: the card was declined",
    }
    assert [(a["node_id"], a["status"], a["exit_name"]) for a in shown["attempts"]] == [
        ("charge", "failed", None),
        ("charge", "failed", "error"),
        ("refund", "completed", "ok"),
    ]
    stopped = ok(lab.cli("show", looped))
    assert "failed: stepLimit" in stopped
    assert "stopped after 6 steps" in stopped and "max_steps=6" in stopped


# -- input -----------------------------------------------------------------------------------
def test_input_from_a_file_and_from_stdin(lab: Lab) -> None:
    (lab.base / "big.json").write_text(json.dumps({"n": 42, "pad": "x" * 300_000}), encoding="utf-8")
    from_file = ok(lab.cli("start", "routed", "--input", "@big.json")).strip()
    assert lab.client.store.get_run(from_file).input["n"] == 42  # type: ignore[index, union-attr]
    piped = subprocess.run(
        [str(TETHER), "--store", lab.url, "--folder", str(lab.folder), "start", "routed", "--input", "-"],
        cwd=lab.base,
        env=clean_env(),
        input='{"n": 7}',
        capture_output=True,
        text=True,
        timeout=60,
    )
    run_id = ok(piped).strip()
    assert lab.client.store.get_run(run_id).input == {"n": 7}  # type: ignore[union-attr]
    refused(lab.cli("start", "routed", "--input", "@missing.json"), 4, "--input: cannot read missing.json")


# -- errors in the user's terms --------------------------------------------------------------
def test_unknown_ids_and_filters_are_errors(lab: Lab) -> None:
    lab.start("healthy")
    before = lab.fingerprint()
    refused(lab.cli("events", "--run-id", "nope"), 3, "Workflow run not found: nope")
    refused(lab.cli("effects", "--run-id", "nope"), 3, "Workflow run not found: nope")
    refused(lab.cli("decisions", "--run-id", "nope"), 3, "Workflow run not found: nope")
    refused(lab.cli("effects", "--status", "bogus"), 4, "--status must be one of pending, applying")
    refused(lab.cli("events", "--after", "-1"), 4, "--after must be 0 or a positive event number")
    assert lab.changes_since(before) == {}


def test_a_reused_run_id_is_explained(lab: Lab) -> None:
    lab.start("healthy", run_id="run-taken")
    refused(
        lab.cli("start", "healthy", "--run-id", "run-taken", "--input", "1"),
        5,
        "Run id run-taken is already used by a run with a different input",
    )
    refused(
        lab.cli("start", "routed", "--run-id", "run-taken"), 5, "already used by a run of workflow healthy"
    )


def test_submit_refuses_an_answer_that_breaks_the_schema(lab: Lab) -> None:
    run_id = lab.start("form", session_id="session-a")
    drain(lab)
    [request] = lab.client.store.requests(run_id=run_id, status="pending")
    before = lab.fingerprint()
    refused(
        lab.cli("submit", request.request_id, '{"name": ""}', "--session", "session-a"),
        4,
        "does not match the request's schema",
    )
    assert lab.changes_since(before) == {}
    assert "validating" in ok(
        lab.cli("submit", request.request_id, '{"name": "Ada"}', "--session", "session-a")
    )


def test_the_interview_example_asks_for_a_session_and_its_hint_names_it(lab: Lab) -> None:
    refused(lab.cli("run", "interview", folder=EXAMPLES), 4, "pass --session NAME")
    out = ok(lab.cli("run", "interview", "--session", "chat-1", "--poll-ms", "50", folder=EXAMPLES))
    assert "--session chat-1" in out
    assert "tether submit request-" in out


# -- readable output -------------------------------------------------------------------------
def test_runs_has_headers_and_one_human_status_per_run(lab: Lab) -> None:
    waiting = lab.start("approval", run_id="run-waiting")
    lab.start("healthy", run_id="run-done")
    drain(lab)
    lab.start("healthy", run_id="run-queued")
    lines = ok(lab.cli("runs")).splitlines()
    assert lines[0].split() == ["RUN", "WORKFLOW", "STATUS", "CREATED"]
    by_run = {line.split()[0]: line for line in lines[1:]}
    [decision] = lab.client.decisions(waiting)
    assert f"waiting for decision {decision.decision_id}" in by_run["run-waiting"]
    assert " completed " in by_run["run-done"]
    assert "no live worker has workflow healthy" in by_run["run-queued"]
    page = json.loads(ok(lab.cli("runs", "--json")))
    summaries = {r["run_id"]: (r["summary"], r["action"]) for r in page["runs"]}
    assert summaries["run-waiting"] == (
        f"waiting for decision {decision.decision_id}",
        f"tether answer {decision.decision_id} ANSWER",
    )


def test_inbox_lists_what_waits_for_a_person_with_the_command_for_each(lab: Lab) -> None:
    approval = lab.start("approval")
    form = lab.start("form", session_id="session-i")
    lab.release("open")
    drain(lab)
    failed = lab.start("steps", {"latch": "never"})
    ok(lab.cli("cancel", failed))
    [decision] = lab.client.decisions(approval)
    [request] = lab.client.store.requests(run_id=form, status="pending")
    out = ok(lab.cli("inbox"))
    assert f"tether answer {decision.decision_id} approve|reject" in out
    assert f"tether submit {request.request_id} JSON --session session-i" in out
    items = json.loads(ok(lab.cli("inbox", "--json")))
    assert [i["kind"] for i in items] == ["input", "decision"] or [i["kind"] for i in items] == [
        "decision",
        "input",
    ]
    assert all(i["action"].startswith("tether ") for i in items)
    assert [i["at"] for i in items] == sorted((i["at"] for i in items), reverse=True)


def test_show_prints_input_result_steps_and_the_failing_steps_traceback(lab: Lab) -> None:
    done = lab.start("routed", {"n": 3})
    drain(lab)
    out = ok(lab.cli("show", done))
    assert 'input: {"n": 3}' in out
    assert 'result: {"node": "small"' in out
    header = next(line for line in out.splitlines() if line.startswith("STEP"))
    assert header.split() == ["STEP", "STATUS", "ATTEMPT", "DURATION", "EXIT", "OUTPUT"]
    shown = json.loads(ok(lab.cli("show", done, "--json")))
    assert shown["input"] == {"n": 3} and shown["run"]["summary"] == "completed"
    retried = lab.start("patient")
    drain(lab)
    out = ok(lab.cli("show", retried))
    assert "flaky #1 failed:" in out
    assert "Traceback (most recent call last)" in out and "ConnectionError: the first try fails" in out


def _on_a_terminal(lab: Lab, *argv: str, **env: str) -> str:
    """The output of a ``tether`` command whose stdout is a terminal."""
    import os
    import pty

    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [str(TETHER), "--store", lab.url, *argv],
        cwd=lab.base,
        env=clean_env(TERM="xterm-256color", **env),
        stdout=follower,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode("utf-8", "replace")


def test_colour_on_a_terminal_and_none_with_no_color(lab: Lab) -> None:
    lab.start("healthy")
    drain(lab)
    assert "\x1b[" in _on_a_terminal(lab, "runs")
    plain = _on_a_terminal(lab, "runs", NO_COLOR="1")
    assert "completed" in plain and "\x1b[" not in plain.replace("\x1b[?25", "")


def test_inbox_lists_a_run_parked_for_an_operator_with_its_command(lab: Lab) -> None:
    result = lab.cli("run", "broken", "--lease-ms", "1500", "--poll-ms", "50", timeout=60)
    assert result.returncode == 1
    [view] = lab.client.store.list_run_views().runs
    items = json.loads(ok(lab.cli("inbox", "--json")))
    assert [(i["kind"], i["run_id"], i["action"]) for i in items] == [
        ("parked", view.run_id, f"tether resume {view.run_id}")
    ]
    assert "parked: no progress (poison limit)" in items[0]["title"]


def test_runs_says_until_when_a_run_sleeps(lab: Lab) -> None:
    from tests.integration.support import wait_for

    (lab.folder / "sleepy.py").write_text(
        "from tether.engine.graph import Workflow, compute, sleep\n"
        "sleepy = Workflow('sleepy', start='nap', nodes=[sleep('nap', 600), compute('after', lambda ctx: 1)],"
        " edges={'nap': 'after'})\n",
        encoding="utf-8",
    )
    run_id = lab.start("sleepy")
    worker = lab.worker("sleeper")
    wait_for(lambda: lab.view(run_id).status == "parked", what="the run to start its durable sleep")
    worker.kill()  # the sleep is committed: no worker is needed to read it
    worker.wait(timeout=30)
    line = next(line for line in ok(lab.cli("runs")).splitlines() if line.startswith(run_id))
    assert "sleeping until " in line and " UTC (in 9 min " in line
