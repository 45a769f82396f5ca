"""Every ``tether`` command through a real subprocess, on a temporary store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.integration.support import EXAMPLES, TETHER, Lab, clean_env, wait_for
from tether.engine.registry import load_folder


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    assert "Traceback" not in result.stderr
    return result.stdout


def drain(lab: Lab) -> str:
    """One ``worker --until-idle`` pass (a worker logs a failing run's traceback on stderr)."""
    result = lab.cli("worker", "--until-idle", "--lease-ms", "1500", "--poll-ms", "50")
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def test_workflows_lists_the_folder_in_text_and_json(lab: Lab) -> None:
    text = ok(lab.cli("workflows"))
    registry = load_folder(lab.folder)
    header, *rows = text.splitlines()
    assert header.split() == ["WORKFLOW", "DESCRIPTION"]
    assert [line.split()[0] for line in rows] == registry.names()
    steps = next(line for line in rows if line.startswith("steps "))
    assert steps.split(None, 1)[1].strip() == "Two steps, a gate that waits for a latch file, a last step"
    rows = json.loads(ok(lab.cli("workflows", "--json")))
    assert [r["name"] for r in rows] == registry.names()
    assert {r["name"]: r["digest"] for r in rows} == {n: registry.get(n).digest for n in registry.names()}


def test_workflows_in_an_empty_folder_says_so(lab: Lab) -> None:
    empty = lab.base / "empty"
    empty.mkdir()
    assert ok(lab.cli("workflows", folder=empty)).strip() == f"no workflows found in {empty}"


def test_graph_prints_the_text_form_and_a_mermaid_flowchart(lab: Lab) -> None:
    registry = load_folder(EXAMPLES)
    text = ok(lab.cli("graph", "pipeline", folder=EXAMPLES))
    assert text.rstrip("\n") == registry.get("pipeline").text()
    assert "    fetch/get [compute]: * -> fetch/check" in text
    mermaid = ok(lab.cli("graph", "pipeline", "--mermaid", folder=EXAMPLES))
    assert mermaid.rstrip("\n") == registry.get("pipeline").mermaid()
    lines = mermaid.splitlines()
    assert lines[:2] == ["flowchart TD", "    start((start)) --> fetch__get"]
    assert '    subgraph fetch ["fetch (include fetch)"]' in lines
    assert "    checksum --> summarize" in lines


def test_run_executes_the_pipeline_example_here_and_prints_done(lab: Lab) -> None:
    # As `make demo` does, on the default store under the working directory.
    started = time.monotonic()
    result = subprocess.run(
        [str(TETHER), "--folder", str(EXAMPLES), "run", "pipeline", "--input", '{"count": 4}'],
        cwd=lab.base,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    elapsed = time.monotonic() - started
    out = ok(result)
    assert out.startswith("pipeline (start: fetch)\n")
    last = out.splitlines()[-1]
    assert last.startswith("completed in ") and '"records": 4, "total": 30}' in last
    shown = [line.split()[2:4] for line in out.splitlines() if line.startswith("[")]
    assert ["✗", "fetch/get"] in shown
    assert ["✓", "summarize"] in shown
    assert "ConnectionError: upstream timed out" in out
    assert (lab.base / ".tether" / "tether.db").exists()
    # The run needs about a second (retry backoff and a durable sleep); the command must not
    # linger a whole lease-renew interval (10 s with the default lease) after it.
    assert elapsed < 9, f"tether run took {elapsed:.1f} s"


def test_run_reports_a_run_parked_for_an_operator_instead_of_waiting_forever(lab: Lab) -> None:
    result = lab.cli("run", "broken", "--lease-ms", "1500", "--poll-ms", "50", timeout=30)
    assert result.returncode == 1
    assert "\nparked: no progress (poison limit)" in result.stdout
    assert "error runnerNoProgress: Workflow runner failed before it committed workflow progress: " in (
        result.stdout
    )
    assert "next: tether resume run-" in result.stdout


def test_start_reserves_runs_that_worker_until_idle_completes(lab: Lab) -> None:
    big = ok(lab.cli("start", "routed", "--input", '{"n": 20}')).strip()
    record = json.loads(
        ok(lab.cli("start", "routed", "--input", '{"n": 1}', "--json", "--run-id", "run-small"))
    )
    assert (record["run_id"], record["status"], record["input"]) == ("run-small", "queued", {"n": 1})
    assert "claim_token" not in record
    # The same run id and input adopts the existing run.
    assert (
        ok(lab.cli("start", "routed", "--input", '{"n": 1}', "--run-id", "run-small")).strip() == "run-small"
    )
    assert lab.client.store.list_run_views().total == 2

    out = drain(lab)
    assert out.startswith("worker host-") and f"on {lab.url} (" in out
    assert lab.client.result(big).output == {"node": "big", "pid": lab.executions(big, "big")[0]["pid"]}
    assert [x["node_id"] for x in lab.sink_lines("run-small")] == ["choose", "small"]
    assert {lab.view(big).status, lab.view("run-small").status} == {"done"}


def test_runs_lists_newest_first_in_text_and_json(lab: Lab) -> None:
    assert ok(lab.cli("runs")).strip() == "no runs"
    first = lab.start("healthy", run_id="run-first")
    second = lab.start("healthy", run_id="run-second")
    header, *lines = ok(lab.cli("runs")).splitlines()
    assert header.split() == ["RUN", "WORKFLOW", "STATUS", "CREATED"]
    assert [line.split()[:2] for line in lines] == [[second, "healthy"], [first, "healthy"]]
    # No worker runs yet: each queued run says why it waits.
    assert all("no live worker has workflow healthy at this definition (sha256:" in line for line in lines)
    page = json.loads(ok(lab.cli("runs", "--json", "--limit", "1", "--offset", "1")))
    assert page["total"] == 2
    assert [r["run_id"] for r in page["runs"]] == [first]


def test_show_prints_the_run_its_attempts_and_its_result(lab: Lab) -> None:
    run_id = lab.start("routed", {"n": 3})
    drain(lab)
    text = ok(lab.cli("show", run_id)).splitlines()
    assert text[0].split() == ["run", run_id, "routed", "completed"]
    steps = text[text.index(next(line for line in text if line.startswith("STEP"))) + 1 :]
    assert [line.split()[:3] + line.split()[5:6] for line in steps] == [
        ["choose", "completed", "#1", "small"],
        ["small", "completed", "#1", "ok"],
    ]
    shown = json.loads(ok(lab.cli("show", run_id, "--json")))
    assert shown["run"]["status"] == "done"
    assert [a["node_id"] for a in shown["attempts"]] == ["choose", "small"]
    assert shown["attempts"][0]["output"] == {"n": 3}
    assert shown["result"]["output"]["node"] == "small"


def test_show_prints_the_error_of_a_failed_run(lab: Lab) -> None:
    run_id = lab.start("steps", {"latch": "never"})
    ok(lab.cli("cancel", run_id))
    text = ok(lab.cli("show", run_id))
    assert text.splitlines()[0].split()[-1] == "cancelled"
    assert "error cancelled: Workflow run cancelled" in text.splitlines()


def test_watch_follows_a_run_until_it_finishes(lab: Lab) -> None:
    run_id = lab.start("healthy")
    watcher = subprocess.Popen(
        [str(TETHER), "--store", lab.url, "--folder", str(lab.folder), "watch", run_id],
        cwd=lab.base,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lab.processes.append(watcher)  # type: ignore[arg-type]
    first = watcher.stdout.readline()  # type: ignore[union-attr]
    assert "queued" in first
    assert watcher.poll() is None, "watch keeps following an unfinished run"
    drain(lab)
    out, err = watcher.communicate(timeout=20)
    assert watcher.returncode == 0, err
    lines = [first, *out.splitlines()]
    assert lines[-1].startswith("completed in ")
    assert any("✓ two" in line for line in lines)
    as_json = [json.loads(line) for line in ok(lab.cli("watch", run_id, "--json")).splitlines()]
    assert [e["type"] for e in as_json] == lab.event_types(run_id)


def test_events_prints_the_journal_as_json_lines_after_a_sequence(lab: Lab) -> None:
    one = lab.start("healthy")
    two = lab.start("healthy")
    drain(lab)
    events = [json.loads(line) for line in ok(lab.cli("events", "--json")).splitlines()]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
    assert {e["run_id"] for e in events} == {one, two}
    assert set(events[0]) == {"seq", "recorded_at", "run_id", "workflow_ref", "type", "runner_id", "payload"}
    middle = seqs[len(seqs) // 2]
    later = [
        json.loads(line) for line in ok(lab.cli("events", "--json", "--after", str(middle))).splitlines()
    ]
    assert [e["seq"] for e in later] == [s for s in seqs if s > middle]
    only = [json.loads(line) for line in ok(lab.cli("events", "--json", "--run-id", two)).splitlines()]
    assert {e["run_id"] for e in only} == {two} and len(only) == len(lab.events(two))
    text = ok(lab.cli("events", "--after", str(seqs[-2]))).splitlines()
    assert len(text) == 1 and text[0].startswith(f"#{seqs[-1]}")
    assert ok(lab.cli("events", "--after", str(seqs[-1]))) == ""


def test_cancel_finishes_an_unclaimed_run_at_once(lab: Lab) -> None:
    run_id = lab.start("healthy")
    assert ok(lab.cli("cancel", run_id)).strip() == f"{run_id}: cancelled"
    assert json.loads(ok(lab.cli("cancel", lab.start("healthy", run_id="run-json"), "--json"))) == {
        "run_id": "run-json",
        "outcome": "cancelled",
    }
    drain(lab)
    assert lab.view(run_id).status == "cancelled"
    assert lab.sink_lines(run_id) == []


def test_resume_puts_a_run_parked_for_no_progress_back_in_the_queue(lab: Lab) -> None:
    run_id = lab.start("broken")
    drain(lab)
    view = lab.view(run_id)
    assert (view.status, view.error_code) == ("parked", "runnerNoProgress")
    drain(lab)
    assert len(lab.executions(run_id, "bad")) == 1, "workers leave a no-progress run to an operator"

    lab.release("fixed")
    assert ok(lab.cli("resume", run_id)).strip() == f"{run_id}: resumed"
    assert (lab.view(run_id).status, lab.view(run_id).error_code) == ("queued", None)
    drain(lab)
    assert lab.client.result(run_id).output == {"fixed": True}
    assert lab.view(run_id).status == "done"
    assert len(lab.executions(run_id, "a")) == 1
    assert len(lab.executions(run_id, "bad")) == 2


def test_restart_starts_a_linked_run_with_the_parents_or_a_new_input(lab: Lab) -> None:
    parent = lab.start("routed", {"n": 50}, run_id="run-parent")
    drain(lab)
    child = ok(lab.cli("restart", parent)).strip()
    assert child == "run-parent-r1"
    record = lab.client.store.get_run(child)
    assert record is not None
    assert (record.parent_run_id, record.lineage_kind, record.restart_number) == (parent, "restart", 1)
    assert record.input == {"n": 50}
    drain(lab)
    grandchild = json.loads(ok(lab.cli("restart", child, "--input", '{"n": 2}', "--json")))
    assert (grandchild["run_id"], grandchild["input"], grandchild["restart_number"]) == (
        "run-parent-r2",
        {"n": 2},
        2,
    )
    assert grandchild["root_run_id"] == parent
    drain(lab)
    assert [x["node_id"] for x in lab.sink_lines(parent)] == ["choose", "big"]
    assert [x["node_id"] for x in lab.sink_lines(child)] == ["choose", "big"]
    assert [x["node_id"] for x in lab.sink_lines("run-parent-r2")] == ["choose", "small"]
    named = ok(lab.cli("restart", "run-parent-r2", "--new-run-id", "run-named")).strip()
    assert named == "run-named"


def test_decisions_and_answer_route_a_waiting_run(lab: Lab) -> None:
    approve = lab.start("approval", run_id="run-approve")
    size = lab.start("sizing", run_id="run-size")
    drain(lab)
    assert lab.view(approve).run_state_status == "waiting"
    header, *listed = ok(lab.cli("decisions")).splitlines()
    assert header.split() == ["DECISION", "RUN", "STEP", "QUESTION", "OPTIONS", "DEADLINE", "OUTCOME"]
    assert len(listed) == 2
    decisions = {d["run_id"]: d for d in json.loads(ok(lab.cli("decisions", "--json")))}
    ask = decisions[approve]
    assert ask["request"]["options"] == ["approve", "reject"]
    row = next(line for line in listed if line.startswith(ask["decision_id"]))
    assert row.split() == [ask["decision_id"], approve, "ask", "Ship", "it?", "approve,", "reject", "open"]
    only = json.loads(ok(lab.cli("decisions", "--run-id", size, "--json")))
    assert [d["run_id"] for d in only] == [size]

    answered = ok(lab.cli("answer", ask["decision_id"], "approve", "--actor", "reviewer"))
    assert answered.strip() == f"{ask['decision_id']}: accepted (human)"
    sized = json.loads(ok(lab.cli("answer", decisions[size]["decision_id"], "7", "--json")))
    assert (sized["response"], sized["outcome"]) == (7, "accepted")
    drain(lab)

    assert [x["node_id"] for x in lab.sink_lines(approve)] == ["shipped"]
    assert lab.client.result(size).status == "done"
    assert {a.node_id: a.output for a in lab.client.store.attempts(size)}["size"] == {
        "response": 7,
        "provenance": "human",
    }
    assert ok(lab.cli("decisions")).strip() == "no open decisions"
    resolved = json.loads(ok(lab.cli("decisions", "--all", "--json")))
    assert {(d["run_id"], d["outcome"], d["actor_id"]) for d in resolved} == {
        (approve, "accepted", "reviewer"),
        (size, "accepted", "human"),
    }


def test_submit_and_messages_carry_an_input_through_its_session(lab: Lab) -> None:
    run_id = lab.start("form", session_id="session-form")
    drain(lab)
    assert ok(lab.cli("messages", "--session", "session-other")).strip() == "no messages"
    header, *text = ok(lab.cli("messages", "--session", "session-form")).splitlines()
    assert header.split() == ["MESSAGE", "KIND", "PAYLOAD"]
    assert len(text) == 1 and " step " in text[0]
    [step] = json.loads(ok(lab.cli("messages", "--session", "session-form", "--json")))
    request_id = step["payload"]["requestId"]
    assert step["payload"]["prompt"] == "Your name?"

    # An answer that breaks the request's schema is refused at once, and nothing is written.
    refused = lab.cli("submit", request_id, '{"name": ""}', "--session", "session-form", "--json")
    assert refused.returncode == 4
    assert refused.stderr.startswith("tether: The payload does not match the request's schema: ")
    assert lab.client.store.submissions(request_id) == []
    assert lab.view(run_id).run_state_status == "waiting"
    ok(lab.cli("submit", request_id, '{"name": "Grace"}', "--session", "session-form"))
    drain(lab)
    assert lab.client.result(run_id).status == "done"
    assert lab.executions(run_id, "greet")

    # Session from the environment; --ack acknowledges what it lists.
    env_call = subprocess.run(
        [str(TETHER), "--store", lab.url, "messages", "--ack", "--json"],
        cwd=lab.base,
        env=clean_env(TETHER_SESSION="session-form"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    acked = json.loads(ok(env_call))
    assert "notification" in [m["kind"] for m in acked]
    assert ok(lab.cli("messages", "--session", "session-form")).strip() == "no messages"
    everything = json.loads(ok(lab.cli("messages", "--session", "session-form", "--all", "--json")))
    assert len(everything) >= len(acked)


def test_effects_lists_and_resolves_an_effect_left_ambiguous_by_a_crash(lab: Lab) -> None:
    run_id = lab.start("crashing")
    crashed = lab.cli("worker", "--until-idle", "--lease-ms", "1000", "--poll-ms", "50")
    assert crashed.returncode == -signal.SIGKILL
    [effect] = lab.client.store.effects(run_id=run_id)
    assert effect.status == "applying"
    wait_for(
        lambda: lab.lease(run_id)["expires_at"] < time.time() * 1000 - 50,
        what="the dead worker's lease to expire",
    )
    drain(lab)
    view = lab.view(run_id)
    assert (view.status, view.run_state_status, view.error_code) == ("parked", "waiting", "effectAmbiguous")

    listed = ok(lab.cli("effects")).splitlines()
    assert listed[0].split() == ["EFFECT", "RUN", "TYPE", "STATUS", "ATTEMPTS"]
    assert listed[1].split()[:4] == [effect.effect_id, run_id, "workflow.pub", "ambiguous"]
    assert (
        json.loads(ok(lab.cli("effects", "--status", "ambiguous", "--json")))[0]["effect_id"]
        == effect.effect_id
    )
    assert ok(lab.cli("effects", "--status", "applied")).strip() == "no effects"
    refused = lab.cli("resume", run_id)
    assert refused.returncode == 5
    assert refused.stderr.strip() == (
        f"tether: Workflow run {run_id} cannot be resumed: "
        f"effect {effect.effect_id} is ambiguous: resolve it first"
    )

    resolved = ok(lab.cli("effects", "--resolve", effect.effect_id, "applied", "--actor", "ops"))
    assert resolved.strip() == f"{effect.effect_id}: applied"
    # Resolving puts the run back in the queue: no separate resume.
    assert lab.view(run_id).status == "queued"
    drain(lab)
    assert lab.client.result(run_id).status == "done"
    assert len(lab.executions(run_id, "pub")) == 1, "a resolved effect is not applied again"
    assert len(lab.executions(run_id, "after")) == 1


def test_worker_until_idle_exits_promptly_with_the_default_lease(lab: Lab) -> None:
    run_id = lab.start("healthy")
    started = time.monotonic()
    ok(lab.cli("worker", "--until-idle"))
    assert lab.view(run_id).status == "done"
    # The default renew interval is 10 s; exiting must not wait it out.
    assert time.monotonic() - started < 9, "the worker waited out a renew interval before exiting"


def test_worker_stops_on_sigint_like_sigterm(lab: Lab) -> None:
    worker = lab.worker("host-sigint")
    wait_for(lambda: (lab.base / "host-sigint.out").read_text(), what="the worker banner")
    os.kill(worker.pid, signal.SIGINT)
    assert worker.wait(timeout=10) == 0
    assert (lab.base / "host-sigint.out").read_text().startswith("worker host-sigint on ")


def test_prune_deletes_finished_runs_older_than_the_age_given(lab: Lab) -> None:
    done = lab.start("healthy", run_id="run-done")
    drain(lab)
    waiting = lab.start("healthy", run_id="run-queued")
    assert lab.view(done).status == "done"
    # Nothing finished a day ago: nothing goes.
    assert json.loads(ok(lab.cli("prune", "--older-than", "1d", "--json")))["runs"] == 0
    counted = json.loads(ok(lab.cli("prune", "--older-than", "0s", "--dry-run", "--json")))
    assert (counted["runs"], counted["dry_run"]) == (1, True) and counted["events"] > 0
    assert lab.client.store.get_run(done) is not None
    text = ok(lab.cli("prune", "--older-than", "0s", "--status", "done"))
    assert text.startswith("deleted 1 runs finished before ") and " attempts, " in text
    assert lab.client.store.get_run(done) is None
    assert lab.client.store.get_run(waiting) is not None


def test_prune_refuses_bad_ages_and_statuses_with_a_clear_message(lab: Lab) -> None:
    for arguments, message in (
        (("--older-than=-1d",), "--older-than must be a whole number of s, m, h, d or w"),
        (("--older-than", "30 days"), "--older-than must be a whole number of s, m, h, d or w"),
        (("--older-than", "30d", "--status", "done,finished"), "unknown status 'finished'"),
        (("--older-than", "30d", "--status", ","), "no status given"),
    ):
        result = lab.cli("prune", *arguments)
        assert result.returncode == 4, (arguments, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr


def test_example_order__the_commands_of_its_docstring(tmp_path: Path) -> None:
    """examples/orders.py's own instructions, as a user types them: fan-out, a child run and an
    event, across two worker sessions."""
    env = clean_env(TETHER_STORE=f"sqlite:///{tmp_path / 'orders.db'}")

    def tether(*argv: str) -> str:
        done = subprocess.run(
            [str(TETHER), "--folder", str(EXAMPLES), *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"tether {' '.join(argv)}: {done.stdout} {done.stderr}"
        assert "Traceback" not in done.stderr
        return done.stdout

    run_id = tether("start", "order", "--input", '{"order": "A-17", "lines": ["mug", "tea", "card"]}').strip()
    tether("worker", "--until-idle", "--poll-ms", "50")
    waiting = tether("show", run_id)
    assert "waiting for event delivered" in waiting
    assert f"{run_id}.ship" in waiting  # the child run, listed with its parent
    tether("event", "send", run_id, "delivered", "--payload", '{"signed_by": "R. Diaz"}')
    tether("worker", "--until-idle", "--poll-ms", "50")
    shown = json.loads(tether("show", run_id, "--json"))
    assert shown["run"]["summary"] == "completed"
    assert shown["result"]["output"] == {"order": "A-17", "tracking": "TRK-A-17-3", "signed_by": "R. Diaz"}


def test_example_research__the_commands_of_its_docstring(tmp_path: Path) -> None:
    """examples/research.py's own instructions, as a user types them: an approval, then a review."""
    env = clean_env(
        TETHER_STORE=f"sqlite:///{tmp_path / 'research.db'}", TETHER_REPORTS=str(tmp_path / "out")
    )

    def tether(*argv: str) -> str:
        done = subprocess.run(
            [str(TETHER), "--folder", str(EXAMPLES), *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"tether {' '.join(argv)}: {done.stdout} {done.stderr}"
        assert "Traceback" not in done.stderr
        return done.stdout

    run_id = tether("start", "research", "--input", '{"topic": "durable workflows"}').strip()
    tether("worker", "--until-idle", "--poll-ms", "50")
    [approval] = json.loads(tether("inbox", "--json"))
    assert "write_report" in approval["title"] + " ".join(approval["details"])
    tether("answer", approval["id"], "approve")
    tether("worker", "--until-idle", "--poll-ms", "50")
    [review] = json.loads(tether("inbox", "--json"))
    assert "Publish the report at" in review["title"] + " ".join(review["details"])
    tether("answer", review["id"], "publish")
    tether("worker", "--until-idle", "--poll-ms", "50")
    shown = json.loads(tether("show", run_id, "--json"))
    assert shown["run"]["summary"] == "completed"
    assert (tmp_path / "out" / "durable-workflows.md").exists()
    assert "calls write_report(" in tether("show", run_id, "--conversation")
