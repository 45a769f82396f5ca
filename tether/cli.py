"""The ``tether`` command line: a thin layer over ``tether.client``.

The options that name a ``TETHER_*`` variable in their help read their default from it. Errors print
as one line on stderr and map to exit codes in one place (``EXIT_CODES``). Output for people is
rendered by ``tether.clioutput`` (Rich tables; colour only on a terminal); ``--json`` prints the
stable shape documented in docs/cli.md.

Commands that only read or answer (``runs``, ``show``, ``answer``, ``cancel``, ``effects``, ...) do
not load the workflows folder, so one broken workflow file cannot disable them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from tether.client import DEFAULT_STORE, Tether, WaitTimeout
from tether.clioutput import (
    LiveView,
    Status,
    ago,
    console,
    conversation_lines,
    display_url,
    mapping,
    mask_urls,
    print_rows,
    run_status,
    statuses,
    styled,
    table,
    to_json,
    usage_lines,
    waits_for_an_event,
)
from tether.describe import duration, progress_text, summary
from tether.engine.registry import DEFAULT_FOLDER
from tether.engine.runner import Abandoned, Runner, RunnerConfig
from tether.engine.schema import errors as schema_errors
from tether.engine.tracing import configure_from_environment
from tether.errors import (
    ClaimLost,
    Conflict,
    DeadlinePassed,
    IllegalTransition,
    InconsistentState,
    InvalidInput,
    NotFound,
    StoreBusy,
    TetherError,
)
from tether.logs import use_json
from tether.store import ChildRun, Lineage, RunView, RunViewPage, ScheduleRecord, open_store, schema_version

#: Exit status per error type (the first match in order wins); 2 is argparse's usage error.
EXIT_CODES: list[tuple[type[TetherError], int]] = [
    (NotFound, 3),
    (InvalidInput, 4),
    (DeadlinePassed, 5),
    (Conflict, 5),
    (IllegalTransition, 5),
    (InconsistentState, 5),
    (ClaimLost, 5),
    (WaitTimeout, 6),
    (StoreBusy, 7),
    (TetherError, 1),
]


def exit_code(error: TetherError) -> int:
    return next(code for kind, code in EXIT_CODES if isinstance(error, kind))


def emit(args: argparse.Namespace, value: Any, render: Callable[[Console], None]) -> None:
    """Print ``value`` as JSON with ``--json``, else the human form ``render`` prints."""
    if getattr(args, "json", False):
        print(to_json(value))
    else:
        render(console())


def say(text: str) -> Callable[[Console], None]:
    return lambda out: out.print(text, markup=False)


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidInput(f"{what} is not valid JSON: {error.msg} at position {error.pos}") from None
    except RecursionError:
        raise InvalidInput(f"{what} nests too deeply") from None


def parse_input(text: str, what: str) -> Any:
    """JSON given inline, ``@file.json`` (read from the file) or ``-`` (read from stdin)."""
    if text == "-":
        try:
            content = sys.stdin.read()
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidInput(f"{what}: cannot read stdin: {error}") from None
        return parse_json(content, f"{what} (from stdin)")
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            content = path.read_text(encoding="utf-8")
        except OSError as error:
            raise InvalidInput(f"{what}: cannot read {path}: {error.strerror}") from None
        except (UnicodeDecodeError, ValueError):
            raise InvalidInput(f"{what}: {path} is not UTF-8 text") from None
        return parse_json(content, f"{what} (from {path})")
    return parse_json(text, what)


def client(args: argparse.Namespace, *, load: bool = False) -> Tether:
    """A client on the store; ``load`` also loads the workflows (the folder and any ``--module``:
    only commands that start, execute or describe workflows need them, so a broken workflow file
    cannot block the others)."""
    return Tether(
        args.store,
        folder=workflow_folder(args) if load else None,
        modules=(getattr(args, "module", None) or ()) if load else (),
        project=args.project,
        migrate=not args.no_migrate,
    )


def workflow_folder(args: argparse.Namespace) -> str | None:
    """The workflows folder to load: the one named, or the default (``./workflows``) when it
    exists (a client given a folder that does not exist refuses it)."""
    if args.folder == DEFAULT_FOLDER and not Path(args.folder).is_dir():
        return None
    return str(args.folder)


def module_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--module",
        action="append",
        default=[],
        metavar="NAME",
        help="also load the workflows of this importable module (myapp.workflows); repeatable",
    )


def cmd_db(args: argparse.Namespace) -> int:
    """``upgrade`` applies pending migrations (creating the store if need be); ``status`` only reads."""
    if args.action == "upgrade":
        open_store(args.store, project=None).close()
    current, latest = schema_version(args.store)
    where = display_url(args.store)
    state = {"store": where, "version": current, "latest": latest, "current": current == latest}
    emit(args, state, say(f"store {where}\nschema version {current}; this Tether's latest is {latest}"))
    return 0 if current == latest else 1


def runner_config(args: argparse.Namespace) -> RunnerConfig:
    return RunnerConfig(
        lease_ms=args.lease_ms,
        poll_ms=args.poll_ms,
        concurrency=args.concurrency,
        max_takeovers=args.max_takeovers,
        tracing=getattr(args, "trace", False),
    )


# -- commands --------------------------------------------------------------------------------
def cmd_workflows(args: argparse.Namespace) -> int:
    tether = client(args, load=True)
    rows = [
        {
            "name": n,
            "digest": tether.registry.get(n).digest,
            "description": tether.registry.get(n).description,
        }
        for n in tether.registry.names()
    ]
    emit(
        args,
        rows,
        lambda out: print_rows(
            out,
            ("WORKFLOW", "DESCRIPTION"),
            ((r["name"], r["description"]) for r in rows),
            f"no workflows found in {os.path.abspath(args.folder)}",
        ),
    )
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    workflow = client(args, load=True).registry.get(args.workflow)
    print(workflow.mermaid() if args.mermaid else workflow.text())
    return 0


def _needs_session(workflow: Any, session: str | None) -> None:
    """A workflow with an ``input`` step asks its origin session: refuse to start it without one."""
    if session is None and any(node.kind == "input" for node in workflow.nodes.values()):
        raise InvalidInput(
            f"Workflow {workflow.name} asks its origin session for input: pass --session NAME "
            "(or TETHER_SESSION), the session that answers with `tether submit ... --session NAME`"
        )


def _start(args: argparse.Namespace, tether: Tether) -> Any:
    workflow = tether.registry.get(args.workflow)
    _needs_session(workflow, args.session)
    given = parse_input(args.input, "--input")
    if args.run_id is not None:
        existing = tether.store.get_run_view(args.run_id)
        if existing is not None and existing.workflow_name != workflow.name:
            raise Conflict(
                f"Run id {args.run_id} is already used by a run of workflow {existing.workflow_name}: "
                "choose another --run-id (reusing one returns the existing run only for the same "
                "workflow and input)"
            )
    try:
        return tether.start(workflow.name, given, run_id=args.run_id, session_id=args.session)
    except Conflict as error:
        if "preparation conflicts" not in str(error):
            raise
        raise Conflict(
            f"Run id {args.run_id} is already used by a run with a different input or definition: "
            "choose another --run-id (reusing one returns the existing run only for the same "
            "workflow and input)"
        ) from None


def cmd_start(args: argparse.Namespace) -> int:
    run = _start(args, client(args, load=True))
    emit(args, run, say(run.run_id))
    return 0


def _child_goes_on(tether: Tether, run_id: str) -> bool:
    """Whether a child run that ``run_id`` waits for (or one it waits for in turn) can go on
    without a person: a runner has work for the family."""
    for kid in tether.children(run_id):
        if kid.waits and kid.status not in ("done", "failed", "cancelled"):
            waiting = kid.run_state_status == "waiting" and kid.status == "parked"
            if not waiting or _child_goes_on(tether, kid.run_id):
                return True
    return False


def _waiting_lines(tether: Tether, run_id: str) -> list[str]:
    lines = []
    for kid in tether.children(run_id):
        if kid.waits and kid.status not in ("done", "failed", "cancelled"):
            lines.append(f"  child run {kid.run_id} waits:")
            lines.extend(f"  {line}" for line in _waiting_lines(tether, kid.run_id))
    for decision in tether.decisions(run_id):
        asked = mapping(decision.request)
        options = asked.get("options")
        answer = "|".join(options) if options else "JSON"
        lines.append(f"  decision {decision.decision_id}: {asked.get('question')}")
        lines.append(f"    answer: tether answer {decision.decision_id} {answer}")
    for request in tether.store.requests(run_id=run_id, status="pending"):
        lines.append(f"  input {request.request_id}: {mapping(request.payload).get('prompt')}")
        lines.append(
            f"    answer: tether submit {request.request_id} JSON --session {request.target_session_id}"
        )
    return lines


#: Exit status of ``run`` and ``watch`` for a run that timed out (its deadline passed).
TIMED_OUT_EXIT = 8


def outcome_code(result: Any) -> int:
    """Exit status of ``run`` and ``watch``: 0 only for a completed run, ``TIMED_OUT_EXIT`` for a
    run that timed out, else 1."""
    if result.status == "done":
        return 0
    return TIMED_OUT_EXIT if result.run_state_status == "timed_out" else 1


def cmd_run(args: argparse.Namespace) -> int:
    """Start a run and execute it in this process with a live view."""
    tether = client(args, load=True)
    workflow = tether.registry.get(args.workflow)
    run = _start(args, tether)
    out = console()
    if not args.json:
        out.print(workflow.text(), markup=False)
        out.print(f"\nrun {run.run_id}", markup=False)
    runner = Runner(tether.store, tether.registry, config=runner_config(args))

    def settled() -> bool:
        view = tether.store.get_run_view(run.run_id)
        return (
            view is None
            or view.status in ("done", "failed", "cancelled")
            # Waiting for a person (its own decision or input, or a child run's it waits for).
            or (
                view.run_state_status == "waiting"
                and view.status == "parked"
                and not _child_goes_on(tether, view.run_id)
            )
            # Parked for an operator (no progress, source changed): no runner will claim it.
            or (view.status == "parked" and view.error_code is not None)
        )

    worker = threading.Thread(target=runner.run, kwargs={"stop_when": settled}, daemon=True)
    live = LiveView(out, quiet=args.json, workflow=workflow)
    worker.start()
    seq = 0
    try:
        while worker.is_alive() or seq < tether.store.last_event_seq():
            for event in tether.store.events_after(seq, run_id=run.run_id, limit=500):
                seq = event.seq
                live.event(event)
            if not worker.is_alive():
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        # Ctrl-C: hand the run back at once (a worker continues it), not after its lease lapses.
        runner.abandon()
        print(f"\nrun {run.run_id} handed back; `tether worker` continues it", file=sys.stderr)
        return 130
    worker.join()
    result = tether.result(run.run_id)
    if result.run_state_status == "waiting" and not result.finished:
        if args.json:
            print(to_json(result))
            return 0
        out.print(f"\nrun {run.run_id} is waiting for a person:", markup=False)
        for line in _waiting_lines(tether, run.run_id):
            out.print(line, markup=False)
        out.print("  then `tether worker` continues it", markup=False)
        return 0
    if args.json:
        print(to_json(result))
    else:
        live.outcome(tether.view(run.run_id), result)
    return outcome_code(result)


def cmd_worker(args: argparse.Namespace) -> int:
    if args.log_format == "json":
        use_json()
    if args.trace:
        configure_from_environment()
    tether = client(args, load=True)
    if not len(tether.registry):
        raise InvalidInput(
            f"No workflows found in {os.path.abspath(args.folder)!r}: a worker executes only the "
            "workflows it loaded, so it would never take a run. Pass --folder (or TETHER_WORKFLOWS) "
            "naming the folder of your workflow files, or --module naming an importable module"
        )
    runner = Runner(tether.store, tether.registry, runner_id=args.runner_id, config=runner_config(args))
    if args.metrics_port is not None:
        serve_metrics(runner, args.metrics_port)
    runner.install_signal_handlers()
    print(
        f"worker {runner.label} on {display_url(args.store)} ({len(tether.registry)} workflows; "
        f"instance {runner.runner_id})",
        flush=True,
    )
    try:
        runner.run(stop_when=runner.idle_for_good if args.until_idle else None)
    except Abandoned:
        return 130  # a second signal: every run was handed back at once
    return 0


def serve_metrics(runner: Runner, port: int) -> None:
    """Serve the worker's counts on 127.0.0.1:PORT (``tether.console.metrics``)."""
    if not 0 < port < 65536:
        raise InvalidInput(f"--metrics-port must be a port number from 1 to 65535, not {port}")
    try:
        from tether.console.metrics import serve_worker_metrics
    except ImportError:
        raise InvalidInput("--metrics-port needs the server extra: pip install 'tether[server]'") from None
    try:
        serve_worker_metrics(runner, port)
    except OSError as error:
        raise InvalidInput(
            f"--metrics-port {port}: cannot listen there ({error.strerror or error})"
        ) from None


def run_json(view: RunView, status: Status) -> dict[str, Any]:
    return {**dataclasses.asdict(view), "summary": status.text, "action": status.action}


def cmd_runs(args: argparse.Namespace) -> int:
    tether = client(args)
    if args.limit < 1 or args.offset < 0:
        raise InvalidInput("--limit must be 1 or more and --offset 0 or more")
    page = (
        _runs_waiting_for_an_event(tether, args.offset, args.limit)
        if args.waiting_for_event
        else tether.store.list_run_views(offset=args.offset, limit=args.limit)
    )
    found = statuses(tether, page.runs)
    value = {"total": page.total, "runs": [run_json(v, found[v.run_id]) for v in page.runs]}

    def render(out: Console) -> None:
        print_rows(
            out,
            ("RUN", "WORKFLOW", "STATUS", "CREATED"),
            ((v.run_id, v.workflow_name, styled(found[v.run_id]), ago(v.created_at)) for v in page.runs),
            "no runs waiting for an event" if args.waiting_for_event else "no runs",
        )
        if page.total > args.offset + len(page.runs):
            out.print(f"({page.total} runs; --offset and --limit show the others)", markup=False)

    emit(args, value, render)
    return 0


def _runs_waiting_for_an_event(tether: Tether, offset: int, limit: int) -> RunViewPage:
    """The runs parked at a ``wait_for_event`` node, newest first: one page of them, with
    their count in ``total`` (every run is looked through; only the waiting ones read more)."""
    matched: list[RunView] = []
    seen = 0
    while True:
        page = tether.store.list_run_views(offset=seen, limit=500)
        matched += [v for v in page.runs if waits_for_an_event(tether, v)]
        seen += len(page.runs)
        if not page.runs or seen >= page.total:
            return dataclasses.replace(page, total=len(matched), runs=matched[offset : offset + limit])


def cmd_show(args: argparse.Namespace) -> int:
    tether = client(args)
    view = tether.view(args.run_id)
    record = tether.store.get_run(args.run_id)
    attempts = tether.store.attempts(args.run_id)
    result = tether.result(args.run_id)
    lineage = tether.lineage(args.run_id)
    progress = tether.progress(args.run_id)
    parent = tether.parent(args.run_id)
    children = tether.children(args.run_id)
    status = statuses(tether, [view])[view.run_id]
    # The running steps' latest progress (a finished step's report is history).
    running = {
        a.node_id: progress[a.node_id]
        for a in attempts
        if a.status == "running" and a.node_id in progress and progress[a.node_id].attempt == a.attempt_number
    }
    given = None if record is None else record.input
    value = {
        "run": run_json(view, status),
        "input": given,
        "attempts": attempts,
        "result": result,
        "lineage": lineage,
        "progress": {
            node: {**dataclasses.asdict(p), "seconds_left": p.seconds_left} for node, p in running.items()
        },
        "parent": parent,
        "children": children,
    }
    messages = tether.conversation(args.run_id) if args.conversation else []
    used = tether.usage(args.run_id) if args.conversation else {}
    if args.conversation:
        value["conversation"] = messages
        value["usage"] = {node: dataclasses.asdict(u) for node, u in used.items()}
    # A fork's first attempts are the ones it took over from its parent (in path order).
    reused = len(lineage.copied)

    def render(out: Console) -> None:
        out.print(
            Text(f"run {view.run_id}  ", style="bold") + Text(view.workflow_name + "  ") + styled(status)
        )
        out.print(f"created {ago(view.created_at)}", markup=False)
        for line in _lineage_lines(lineage):
            out.print(line, markup=False)
        if parent is not None:
            out.print(f"child of {parent.parent_run_id} at node {parent.node_id}", markup=False)
        for line in _children_lines(children):
            out.print(line, markup=False)
        if status.kind in ("person", "operator", "later") and view.status not in ("done", "failed"):
            out.print(f"waiting: {status.text}", markup=False)
        if status.action:
            out.print(f"next: {status.action}", markup=False)
        out.print(f"input: {summary(given, 200) or 'null'}", markup=False)
        if view.status == "done":
            out.print(f"result: {summary(result.output, 400) or 'null'}", markup=False)
        if view.error_code:
            out.print(Text(f"error {view.error_code}: {view.error_message}", style="red"))
        grid = table("STEP", "STATUS", "ATTEMPT", "DURATION", "EXIT", "OUTPUT")
        for index, a in enumerate(attempts):
            style = "red" if a.status in ("failed", "timed_out") else ""
            grid.add_row(
                a.node_id,
                Text(a.status, style=style),
                f"#{a.attempt_number}",
                "reused" if index < reused else _took(a),
                a.exit_name or "",
                summary(a.output) if a.status == "completed" else "",
            )
        if attempts:
            out.print(grid)
        for node_id, report in running.items():
            out.print(Text(f"progress of {node_id}: {progress_text(report)}", style="cyan"))
        for a in attempts:
            if a.status in ("failed", "timed_out") and a.error_message:
                # A failed step's story: its exception, message and traceback.
                out.print(Text(f"\n{a.node_id} #{a.attempt_number} {a.status}:", style="bold red"))
                out.print("\n".join(f"      {line}" for line in a.error_message.splitlines()), markup=False)
        if args.conversation:
            for said in conversation_lines(messages) or [Text("\nno agent conversation recorded")]:
                out.print(said)
            for said in usage_lines(used):
                out.print(said)

    emit(args, value, render)
    return 0


def _lineage_lines(lineage: Lineage) -> list[str]:
    """Where the run stands in its restart family, one line per link."""
    lines = []
    if lineage.parent_run_id is not None and lineage.from_node is not None:
        reused = ", ".join(lineage.copied) or "nothing"
        lines.append(f"forked from {lineage.parent_run_id} at {lineage.from_node} (reused: {reused})")
    elif lineage.parent_run_id is not None:
        lines.append(f"restart of {lineage.parent_run_id}")
    if lineage.child_run_id is not None and lineage.child_from_node is not None:
        lines.append(f"forked as {lineage.child_run_id} at {lineage.child_from_node}")
    elif lineage.child_run_id is not None:
        lines.append(f"restarted as {lineage.child_run_id}")
    return lines


def _children_lines(children: list[ChildRun]) -> list[str]:
    """The child runs the run's nodes started, one line each with its status."""
    if not children:
        return []
    lines = ["children:"]
    for c in children:
        how = "waited for" if c.waits else "detached"
        lines.append(f"  {c.run_id}  {c.workflow_name}  {c.status}  (node {c.node_id}, {how})")
    return lines


def _took(attempt: Any) -> str:
    """How long an attempt ran (so far, for one still running)."""
    end = attempt.finished_at or datetime.now(UTC)
    return duration((end - attempt.started_at).total_seconds() * 1000)


def _event_line(event: Any) -> str:
    stamp = event.recorded_at.strftime("%H:%M:%S.%f")[:-3]
    return f"#{event.seq:<6} {stamp} {event.run_id:<40} {event.type:<24} {json.dumps(event.payload)}"


def _known_run(tether: Tether, run_id: str | None) -> None:
    if run_id is not None:
        tether.view(run_id)


def cmd_events(args: argparse.Namespace) -> int:
    tether = client(args)
    if args.after < 0:
        raise InvalidInput("--after must be 0 or a positive event number (the `#` column of `tether events`)")
    _known_run(tether, args.run_id)
    for event in tether.events(args.after, run_id=args.run_id, follow=args.follow):
        print(to_json(event, indent=None) if args.json else _event_line(event), flush=True)
    return 0


def _workflow_if_loadable(args: argparse.Namespace, name: str) -> Any:
    """The workflow from the folder when it loads (the live view then shows retry delays), else
    None with a warning: watching a run does not need its workflow."""
    if not Path(args.folder).is_dir():
        return None
    try:
        return client(args, load=True).registry.get(name)
    except TetherError as error:
        print(f"tether: warning: {mask_urls(str(error))}", file=sys.stderr)
        return None


def cmd_watch(args: argparse.Namespace) -> int:
    tether = client(args)
    view = tether.view(args.run_id)
    workflow = None if args.json else _workflow_if_loadable(args, view.workflow_name)
    live = LiveView(console(), quiet=args.json, workflow=workflow)
    for event in tether.events(0, run_id=args.run_id, follow=True, poll_s=0.5):
        if args.json:
            print(to_json(event, indent=None), flush=True)
        else:
            live.event(event)
        if event.type in ("run.queue_done", "run.queue_failed", "run.queue_cancelled"):
            break
    result = tether.result(args.run_id)
    if not args.json:
        live.outcome(tether.view(args.run_id), result)
    return outcome_code(result)


def cmd_inbox(args: argparse.Namespace) -> int:
    items = inbox(client(args), since_hours=args.hours)

    def render(out: Console) -> None:
        if not items:
            out.print("nothing waits for a person", markup=False)
            return
        for item in items:
            out.print(Text(f"{item['kind']:<10} ", style=INBOX_STYLES[item["kind"]]) + Text(item["title"]))
            for line in item["details"]:
                out.print(f"           {line}", markup=False)
            out.print(Text(f"           → {item['action']}", style="bold"))

    emit(args, items, render)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    outcome = client(args).cancel(args.run_id)
    emit(args, {"run_id": args.run_id, "outcome": outcome}, say(f"{args.run_id}: {outcome}"))
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    client(args).pause(args.run_id)
    emit(args, {"run_id": args.run_id, "paused": True}, say(f"{args.run_id}: paused"))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    tether = client(args, load=args.accept_changes)
    tether.resume(args.run_id, accept_changes=args.accept_changes)
    if args.accept_changes:
        digest = tether.view(args.run_id).definition_digest
        emit(
            args,
            {"run_id": args.run_id, "resumed": True, "definition_digest": digest},
            say(f"{args.run_id}: resumed on the new definition ({digest[:19]}...)"),
        )
        return 0
    emit(args, {"run_id": args.run_id, "resumed": True}, say(f"{args.run_id}: resumed"))
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    tether = client(args, load=True)
    given = None if args.input is None else parse_input(args.input, "--input")
    run = tether.restart(args.run_id, input=given, new_run_id=args.new_run_id, from_node=args.from_node)
    emit(args, run, say(run.run_id))
    return 0


def cmd_decisions(args: argparse.Namespace) -> int:
    tether = client(args)
    _known_run(tether, args.run_id)
    decisions = tether.decisions(args.run_id, open_only=not args.all)

    def render(out: Console) -> None:
        print_rows(
            out,
            ("DECISION", "RUN", "STEP", "QUESTION", "OPTIONS", "DEADLINE", "OUTCOME"),
            (
                (
                    d.decision_id,
                    d.run_id,
                    d.node_id,
                    str(mapping(d.request).get("question") or ""),
                    ", ".join(mapping(d.request).get("options") or []) or "JSON",
                    ago(d.deadline_at),
                    d.outcome or "open",
                )
                for d in decisions
            ),
            "no open decisions" if not args.all else "no decisions",
        )

    emit(args, decisions, render)
    return 0


def cmd_answer(args: argparse.Namespace) -> int:
    tether = client(args)
    found = tether.store.decisions(decision_id=args.decision_id)
    if not found:
        raise NotFound(f"Decision not found: {args.decision_id}")
    options = found[0].request.get("options") if found and isinstance(found[0].request, dict) else None
    response = args.response if options else parse_input(args.response, "the answer")
    decision = tether.answer(args.decision_id, response, actor_id=args.actor)
    emit(args, decision, say(f"{decision.decision_id}: {decision.outcome} ({decision.provenance})"))
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    tether = client(args)
    payload = parse_input(args.payload, "the payload")
    schema = _request_schema(tether, args.request_id, args.session)
    if schema is not None:
        problems = schema_errors(payload, schema)
        if problems:
            raise InvalidInput(f"The payload does not match the request's schema: {'; '.join(problems)}")
    submission = tether.submit(args.request_id, args.session, payload)
    emit(args, submission, say(f"{submission.submission_id}: {submission.outcome}"))
    return 0


def _request_schema(tether: Tether, request_id: str, session_id: str) -> Any:
    """The schema of the session's request (the store refuses another session's request)."""
    for request in tether.store.requests(session_id=session_id):
        if request.request_id == request_id:
            return mapping(request.payload).get("schema")
    return None


def cmd_messages(args: argparse.Namespace) -> int:
    session = client(args).session(args.session)
    messages = session.messages(pending_only=not args.all)
    if args.ack:
        for message in messages:
            session.ack(message.message_id)
    emit(
        args,
        messages,
        lambda out: print_rows(
            out,
            ("MESSAGE", "KIND", "PAYLOAD"),
            ((m.message_id, m.kind, summary(m.payload, 200)) for m in messages),
            "no messages",
        ),
    )
    return 0


#: Seconds per unit of a ``--older-than`` duration.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_duration(text: str) -> timedelta:
    """A duration like ``30d``, ``12h``, ``90m``, ``45s`` or ``2w``."""
    number, unit = text.strip()[:-1], text.strip()[-1:].lower()
    if unit not in DURATION_UNITS or not number.isdigit():
        raise InvalidInput(
            f"--older-than must be a whole number of s, m, h, d or w (for example 30d), not {text!r}"
        )
    try:
        return timedelta(seconds=int(number) * DURATION_UNITS[unit])
    except OverflowError:
        raise InvalidInput(f"--older-than {text} is longer than any store's history") from None


def cmd_prune(args: argparse.Namespace) -> int:
    """Delete finished runs older than ``--older-than`` (``--dry-run``: only count them)."""
    age = parse_duration(args.older_than)
    statuses = [part.strip() for part in args.status.split(",") if part.strip()]
    store = open_store(args.store, project=args.project, migrate=not args.no_migrate)
    try:
        try:
            cutoff = store.now() - age
        except OverflowError:
            raise InvalidInput(f"--older-than {args.older_than} is longer than any store's history") from None
        report = store.prune(finished_before=cutoff, statuses=statuses, dry_run=args.dry_run)
    finally:
        store.close()
    counts = report.counts()
    verb = "would delete" if report.dry_run else "deleted"
    runs = counts.pop("runs")
    emit(
        args,
        {"runs": runs, **counts, "dry_run": report.dry_run, "finished_before": cutoff},
        say(
            f"{verb} {runs} runs finished before {cutoff.isoformat()}: "
            + ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in counts.items())
        ),
    )
    return 0


def schedule_json(schedule: ScheduleRecord) -> dict[str, Any]:
    return dataclasses.asdict(schedule)


def cmd_schedule(args: argparse.Namespace) -> int:
    """Add, list, pause, resume or remove cron schedules."""
    # Only ``add`` loads the workflows (it checks the workflow it schedules); the others read or
    # change stored schedules, so a broken workflow file cannot block them.
    tether = client(args, load=args.action == "add")
    if args.action == "add":
        added = tether.add_schedule(
            args.workflow,
            args.cron,
            tz=args.tz,
            input=parse_input(args.input, "--input"),
            name=args.name,
            catch_up=args.catch_up,
        )
        emit(args, added, say(f"{added.name}: next run at {added.next_due_at.isoformat()}"))
        return 0
    if args.action == "list":
        found = tether.schedules(workflow=args.workflow)
        emit(
            args,
            [schedule_json(s) for s in found],
            lambda out: print_rows(
                out,
                ("NAME", "WORKFLOW", "CRON", "ZONE", "CATCH-UP", "NEXT", "LAST RUN"),
                (
                    (
                        s.name,
                        s.workflow_name,
                        s.cron,
                        s.timezone,
                        s.catch_up,
                        Text("paused", style="yellow") if s.paused else s.next_due_at.isoformat(),
                        s.last_run_id or "",
                    )
                    for s in found
                ),
                "no schedules (declare them on a workflow, or: tether schedule add WORKFLOW CRON)",
            ),
        )
        return 0
    if args.action == "remove":
        tether.remove_schedule(args.name)
        emit(args, {"name": args.name, "removed": True}, say(f"{args.name}: removed"))
        return 0
    paused = args.action == "pause"
    changed = tether.pause_schedule(args.name) if paused else tether.resume_schedule(args.name)
    state = "paused" if paused else "resumed"
    note = "" if changed else f" (it was {'paused' if paused else 'not paused'} already)"
    emit(args, {"name": args.name, "paused": paused, "changed": changed}, say(f"{args.name}: {state}{note}"))
    return 0


def cmd_event(args: argparse.Namespace) -> int:
    """Send an event into a run (its wait_for_event node takes it)."""
    sent = client(args).send_event(
        args.run_id, args.name, parse_input(args.payload, "--payload"), actor_id=args.actor
    )
    emit(args, sent, say(f"{sent.event_id}: sent to {sent.run_id} ({sent.name})"))
    return 0


EFFECT_STATUSES = ("pending", "applying", "applied", "rejected", "ambiguous", "cancelled")


def cmd_effects(args: argparse.Namespace) -> int:
    tether = client(args)
    if args.resolve:
        effect = tether.resolve_effect(args.resolve[0], args.resolve[1], actor_id=args.actor)
        emit(args, effect, say(f"{effect.effect_id}: {effect.status}"))
        return 0
    if args.status is not None and args.status not in EFFECT_STATUSES:
        raise InvalidInput(f"--status must be one of {', '.join(EFFECT_STATUSES)}, not {args.status!r}")
    _known_run(tether, args.run_id)
    effects = tether.store.effects(run_id=args.run_id, status=args.status)
    emit(
        args,
        effects,
        lambda out: print_rows(
            out,
            ("EFFECT", "RUN", "TYPE", "STATUS", "ATTEMPTS"),
            (
                (
                    e.effect_id,
                    e.run_id,
                    e.effect_type,
                    Text(e.status, style="bold magenta" if e.status == "ambiguous" else ""),
                    e.attempt_count,
                )
                for e in effects
            ),
            "no effects",
        ),
    )
    return 0


INBOX_STYLES = {
    "decision": "bold cyan",
    "input": "bold cyan",
    "effect": "bold magenta",
    "parked": "bold magenta",
    "stranded": "bold magenta",
    "failed": "bold red",
}


def inbox(tether: Tether, *, since_hours: float = 24.0) -> list[dict[str, Any]]:
    """Everything that waits for a person, newest first; each item names the command acting on it."""
    items: list[dict[str, Any]] = []
    for d in tether.decisions(None):
        request = mapping(d.request)
        options = request.get("options")
        details = [f"run {d.run_id}, step {d.node_id}"]
        details.append(f"options: {', '.join(options)}" if options else "answer: JSON matching its schema")
        if d.deadline_at is not None:
            details.append(f"deadline: {d.deadline_at:%Y-%m-%d %H:%M:%S} UTC ({ago(d.deadline_at)})")
        items.append(
            {
                "kind": "decision",
                "id": d.decision_id,
                "run_id": d.run_id,
                "title": f"{d.decision_id}: {request.get('question')}",
                "details": details,
                "at": d.created_at,
                "action": f"tether answer {d.decision_id} {'|'.join(options) if options else 'JSON'}",
            }
        )
    for r in tether.store.requests(status="pending"):
        items.append(
            {
                "kind": "input",
                "id": r.request_id,
                "run_id": r.run_id,
                "title": f"{r.request_id}: {mapping(r.payload).get('prompt')}",
                "details": [f"run {r.run_id}, session {r.target_session_id}"],
                "at": r.created_at,
                "action": f"tether submit {r.request_id} JSON --session {r.target_session_id}",
            }
        )
    for e in tether.store.effects(status="ambiguous"):
        items.append(
            {
                "kind": "effect",
                "id": e.effect_id,
                "run_id": e.run_id,
                "title": f"{e.effect_id}: {e.effect_type} may or may not have happened",
                "details": [f"run {e.run_id}" + (f": {e.error_message}" if e.error_message else "")],
                "at": e.created_at,
                "action": f"tether effects --resolve {e.effect_id} applied|rejected|retry",
            }
        )
    now = datetime.now(UTC)
    offset = 0
    while True:
        page = tether.store.list_run_views(offset=offset, limit=200)
        notes = tether.waiting_notes(page.runs)
        for view in page.runs:
            if view.status == "queued" and view.run_state_status == "waiting" and view.run_id in notes:
                # Answered (or its event came) while no live worker has its definition any more.
                status = run_status(view, note=notes[view.run_id])
                items.append(
                    {
                        "kind": "stranded",
                        "id": view.run_id,
                        "run_id": view.run_id,
                        "title": f"{view.run_id} ({view.workflow_name}): {status.text}",
                        "details": [
                            "its answer is in: start a worker with its definition, "
                            "or move it onto the one loaded now"
                        ],
                        "at": view.updated_at,
                        "action": status.action,
                    }
                )
                continue
            parked = view.status == "parked" and view.error_code in (
                "workflowSourceChanged",
                "poisonRun",
                "runnerNoProgress",
            )
            recent = (
                view.finished_at is not None and (now - view.finished_at).total_seconds() < since_hours * 3600
            )
            if not parked and not (view.status == "failed" and recent):
                continue
            status = run_status(view)
            items.append(
                {
                    "kind": "parked" if parked else "failed",
                    "id": view.run_id,
                    "run_id": view.run_id,
                    "title": f"{view.run_id} ({view.workflow_name}): {status.text}",
                    "details": [f"{view.error_code}: {view.error_message}"],
                    "at": view.updated_at,
                    "action": status.action if parked else f"tether show {view.run_id}",
                }
            )
        offset += len(page.runs)
        if not page.runs or offset >= page.total:
            break
    items.sort(key=lambda item: item["at"], reverse=True)
    return items


def cmd_serve(args: argparse.Namespace) -> int:
    """The console (HTTP API and web pages) under uvicorn; needs ``pip install 'tether[server]'``."""
    try:
        import uvicorn

        from tether.console import ConsoleConfig, create_app
        from tether.console.auth import new_token
    except ImportError as error:
        raise TetherError(
            f"tether serve needs the server extra: pip install 'tether[server]' ({error})"
        ) from None
    operator = tuple(t for t in (os.environ.get("TETHER_API_TOKEN", "").strip(),) if t)
    readers = tuple(t for t in (os.environ.get("TETHER_API_READ_TOKEN", "").strip(),) if t)
    if not operator:
        operator = (new_token(),)
        print(f"operator token (shown once; set TETHER_API_TOKEN to choose one): {operator[0]}", flush=True)
    hosts = tuple(h.strip() for h in args.allowed_hosts.split(",") if h.strip())
    if args.host not in hosts and args.host not in ("0.0.0.0", "::"):
        hosts += (args.host,)
    public_url = (
        args.public_url
        or f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
    )
    webhooks = None
    if args.webhook:
        from pathlib import Path

        from tether.console.notify import WebhookConfig

        webhooks = WebhookConfig(
            urls=tuple(args.webhook),
            secret=os.environ.get("TETHER_WEBHOOK_SECRET", ""),
            state_path=Path(args.notify_state),
            public_url=public_url,
            slack=args.webhook_format == "slack",
        )
    config = ConsoleConfig(
        store=args.store,
        folder=workflow_folder(args),
        project=args.project,
        migrate=not args.no_migrate,
        operator_tokens=operator,
        read_tokens=readers,
        allowed_hosts=hosts,
        public_url=public_url,
        secure_cookies=public_url.startswith("https://"),
        webhooks=webhooks,
    )
    app = create_app(config)
    print(f"console on {public_url} (store {display_url(args.store)})", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=str(args.log_level).lower(), access_log=False)
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve the tools over the Model Context Protocol on stdin/stdout; needs
    ``pip install 'tether[mcp]'``."""
    import contextlib

    try:
        from tether.mcp.server import serve as serve_mcp
    except ImportError as error:
        raise TetherError(f"tether mcp needs the mcp extra: pip install 'tether[mcp]' ({error})") from None
    # stdout carries the protocol: what a workflow module prints while it loads goes to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        tether = client(args, load=True)
    mode = ", read-only" if args.read_only else ""
    print(
        f"tether mcp on {display_url(args.store)} ({len(tether.registry)} workflows{mode}): "
        "an MCP client talks to it on stdin and stdout",
        file=sys.stderr,
        flush=True,
    )
    try:
        serve_mcp(tether, read_only=args.read_only, actor=args.actor)
    finally:
        tether.close()
    return 0


# -- parser ----------------------------------------------------------------------------------
def _env(name: str, default: Any) -> Any:
    # A string default goes through the option's ``type`` like a command-line value, so a bad
    # TETHER_* value gets the same one-line usage error as a bad option.
    return os.environ.get(f"TETHER_{name}", default)


#: Examples shown at the end of each command's ``--help``.
EXAMPLES: dict[str, list[str]] = {
    "tether": [
        "tether --folder examples run pipeline --input '{\"count\": 3}'",
        "tether inbox",
        "tether runs",
    ],
    "db": ["tether db status", "tether --store postgresql://tether@db/tether db upgrade"],
    "workflows": ["tether --folder examples workflows", "tether workflows --json"],
    "graph": ["tether --folder examples graph pipeline", "tether graph pipeline --mermaid"],
    "start": [
        "tether start pipeline --input '{\"count\": 5}'",
        "tether start pipeline --input @input.json --run-id order-42",
        "echo '{\"count\": 5}' | tether start pipeline --input -",
        "tether start interview --session chat-7",
    ],
    "run": [
        "tether --folder examples run pipeline --input '{\"count\": 5}'",
        "tether run release --input @release.json",
    ],
    "worker": ["tether worker", "tether worker --concurrency 8 --until-idle"],
    "runs": [
        "tether runs",
        "tether runs --limit 10 --offset 10",
        "tether runs --waiting-for-event",
        "tether runs --json",
    ],
    "show": ["tether show RUN_ID", "tether show RUN_ID --json", "tether show RUN_ID --conversation"],
    "watch": ["tether watch RUN_ID"],
    "inbox": ["tether inbox", "tether inbox --hours 72 --json"],
    "cancel": ["tether cancel RUN_ID"],
    "pause": ["tether pause RUN_ID"],
    "resume": ["tether resume RUN_ID", "tether resume RUN_ID --accept-changes"],
    "restart": [
        "tether restart RUN_ID",
        "tether restart RUN_ID --input @fixed.json",
        "tether restart RUN_ID --from summarize",
    ],
    "events": ["tether events --run-id RUN_ID", "tether events --after 120 --follow --json"],
    "decisions": ["tether decisions", "tether decisions --run-id RUN_ID --all"],
    "answer": ["tether answer DECISION_ID approve", "tether answer DECISION_ID '{\"size\": 3}'"],
    "submit": [
        'tether submit REQUEST_ID \'{"answer": "invoices"}\' --session chat-7',
        "tether submit REQUEST_ID @answer.json --session chat-7",
    ],
    "messages": ["tether messages --session chat-7", "tether messages --session chat-7 --ack"],
    "effects": [
        "tether effects --status ambiguous",
        "tether effects --resolve EFFECT_ID applied",
    ],
    "schedule": [
        "tether schedule add report '0 9 * * 1-5' --tz Europe/Paris --input '{\"team\": \"ops\"}'",
        "tether schedule list --json",
        "tether schedule pause report",
        "tether schedule remove report",
    ],
    "event": [
        'tether event send RUN_ID approved --payload \'{"by": "ann"}\'',
        "tether event send RUN_ID shipped --payload @tracking.json --json",
    ],
    "serve": ["TETHER_API_TOKEN=... tether serve --port 8080"],
    "prune": [
        "tether prune --older-than 30d --dry-run",
        "tether prune --older-than 12h --status done,cancelled --json",
    ],
    "mcp": ["tether --folder workflows mcp", "tether mcp --read-only"],
}


def _epilog(name: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[name])


def tether_version() -> str:
    try:
        return metadata.version("tether")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tether",
        description="Durable workflow runs for Python",
        epilog=_epilog("tether"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tether {tether_version()}")
    parser.add_argument("--store", default=_env("STORE", DEFAULT_STORE), help="store URL (TETHER_STORE)")
    parser.add_argument(
        "--folder", default=_env("WORKFLOWS", DEFAULT_FOLDER), help="workflows folder (TETHER_WORKFLOWS)"
    )
    parser.add_argument("--project", default=_env("PROJECT", "default"), help="project name (TETHER_PROJECT)")
    parser.add_argument(
        "--log-level", default=_env("LOG_LEVEL", "WARNING"), help="log level (TETHER_LOG_LEVEL)"
    )
    parser.add_argument(
        "--no-migrate",
        action="store_true",
        default=bool(os.environ.get("TETHER_NO_MIGRATE")),
        help="refuse a store that needs `tether db upgrade` instead of upgrading it (TETHER_NO_MIGRATE)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(
        name: str, handler: Callable[[argparse.Namespace], int], help: str, json_output: bool = False
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=help,
            description=help,
            epilog=_epilog(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(handler=handler)
        if json_output:
            sub.add_argument("--json", action="store_true", help="print JSON")
        return sub

    def runner_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--lease-ms", type=int, default=_env("LEASE_MS", 30_000), help="lease length (TETHER_LEASE_MS)"
        )
        sub.add_argument(
            "--poll-ms", type=int, default=_env("POLL_MS", 1000), help="longest idle poll (TETHER_POLL_MS)"
        )
        sub.add_argument(
            "--concurrency",
            type=int,
            default=_env("CONCURRENCY", 4),
            help="runs in parallel (TETHER_CONCURRENCY)",
        )
        sub.add_argument(
            "--max-takeovers",
            type=int,
            default=_env("MAX_TAKEOVERS", 3),
            help="poison-run limit (TETHER_MAX_TAKEOVERS)",
        )

    sub = add("db", cmd_db, "upgrade the store's schema, or show its version (exit 1: upgrade needed)", True)
    sub.add_argument("action", choices=("upgrade", "status"))
    add("workflows", cmd_workflows, "list the workflows in the workflows folder", True)
    sub = add("graph", cmd_graph, "show a workflow's graph as text or Mermaid")
    sub.add_argument("workflow")
    sub.add_argument("--mermaid", action="store_true", help="print a Mermaid flowchart")
    for name, handler, text in (
        ("start", cmd_start, "reserve a run for a worker to execute"),
        ("run", cmd_run, "start a run and execute it here with a live view"),
    ):
        sub = add(name, handler, text, True)
        sub.add_argument("workflow")
        sub.add_argument(
            "--input",
            default="null",
            help="the run's input: JSON, @FILE to read it from a file, or - for stdin (checked "
            "against the workflow's input schema when it declares one)",
        )
        sub.add_argument("--run-id", default=None, help="idempotent run id (reuse adopts the existing run)")
        sub.add_argument(
            "--session",
            default=_env("SESSION", None),
            help="origin session for an interactive run (TETHER_SESSION)",
        )
        module_option(sub)
        if name == "run":
            runner_options(sub)
    sub = add("worker", cmd_worker, "claim and execute runs until stopped (SIGTERM/SIGINT hand runs off)")
    sub.add_argument(
        "--runner-id",
        default=_env("RUNNER_ID", None),
        help="runner id, host-<uuid> by default (TETHER_RUNNER_ID)",
    )
    sub.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once nothing it could execute is queued or coming due (retries and sleeps count; "
        "runs waiting for a person do not)",
    )
    module_option(sub)
    sub.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=_env("LOG_FORMAT", "text"),
        help="log lines as text or as one JSON object each, with run_id, node and attempt fields "
        "(TETHER_LOG_FORMAT)",
    )
    sub.add_argument(
        "--trace",
        action="store_true",
        default=os.environ.get("TETHER_TRACE") == "1",
        help="OpenTelemetry spans for every run and step, exported as the OTEL_* variables say "
        "(OTEL_TRACES_EXPORTER otlp or console); needs pip install 'tether[otel]' (TETHER_TRACE=1)",
    )
    sub.add_argument(
        "--metrics-port",
        type=int,
        default=_env("METRICS_PORT", None),
        help="serve this worker's counts (runs claimed, takeovers, stale writes refused, leases lost) "
        "in Prometheus' format at http://127.0.0.1:PORT/metrics; needs pip install 'tether[server]' "
        "(TETHER_METRICS_PORT)",
    )
    runner_options(sub)
    sub = add("runs", cmd_runs, "list runs, newest first", True)
    sub.add_argument("--offset", type=int, default=0, help="skip this many of the newest runs")
    sub.add_argument("--limit", type=int, default=50, help="list at most this many runs")
    sub.add_argument(
        "--waiting-for-event",
        action="store_true",
        help="only runs parked at a wait_for_event node (they wait for a system, not in the inbox)",
    )
    sub = add(
        "inbox",
        cmd_inbox,
        "everything that waits for a person, newest first, with the command that acts on it",
        True,
    )
    sub.add_argument(
        "--hours", type=float, default=24.0, help="list runs that failed in this many hours (24)"
    )
    for name, handler, text in (
        ("show", cmd_show, "show a run, its attempts and result"),
        ("watch", cmd_watch, "follow a run's events until it finishes"),
        ("cancel", cmd_cancel, "cancel a run (no step of it begins once the cancel is committed)"),
        ("pause", cmd_pause, "pause a run waiting for its session's input (its deadline stops)"),
        ("resume", cmd_resume, "resume a paused or parked run"),
    ):
        sub = add(name, handler, text, True)
        sub.add_argument("run_id")
        if name == "show":
            sub.add_argument(
                "--conversation",
                action="store_true",
                help="also print its agent steps' conversations: prompts, model responses, "
                "tool calls and results, and the tokens they used",
            )
    sub.add_argument(
        "--accept-changes",
        action="store_true",
        help="move a run reserved on an older definition onto the workflow as loaded now, "
        "continuing after its last completed node (or its answered decision or event)",
    )
    sub = add("restart", cmd_restart, "start a new run linked to a finished one", True)
    sub.add_argument("run_id")
    sub.add_argument(
        "--input", default=None, help="new input: JSON, @FILE or - for stdin (default: the parent's)"
    )
    sub.add_argument("--new-run-id", default=None, help="the new run's id (default: RUN_ID-rN)")
    sub.add_argument(
        "--from",
        dest="from_node",
        metavar="NODE",
        default=None,
        help="fork at NODE: reuse the outputs of the nodes the run completed before it first "
        "entered NODE (they are not run again) and start there, on the workflow as loaded now",
    )
    sub = add("events", cmd_events, "print the event journal", True)
    sub.add_argument("--after", type=int, default=0, help="only events after this sequence number")
    sub.add_argument("--run-id", default=None, help="only this run's events")
    sub.add_argument("--follow", action="store_true", help="keep printing new events")
    sub = add("decisions", cmd_decisions, "list open decisions", True)
    sub.add_argument("--run-id", default=None, help="only this run's decisions")
    sub.add_argument("--all", action="store_true", help="include resolved decisions")
    sub = add("answer", cmd_answer, "answer a decision (an option name, or JSON for a schema)", True)
    sub.add_argument("decision_id")
    sub.add_argument("response", help="an option name, or JSON (@FILE, - for stdin) for a schema")
    sub.add_argument("--actor", default=_env("ACTOR", "human"), help="who answers (TETHER_ACTOR)")
    sub = add("submit", cmd_submit, "submit a session's JSON answer to an input request", True)
    sub.add_argument("request_id")
    sub.add_argument("payload", help="the answer: JSON, @FILE or - for stdin")
    sub.add_argument(
        "--session",
        required=os.environ.get("TETHER_SESSION") is None,
        default=_env("SESSION", None),
        help="the origin session (TETHER_SESSION)",
    )
    sub = add("messages", cmd_messages, "a session's pending messages", True)
    sub.add_argument(
        "--session",
        required=os.environ.get("TETHER_SESSION") is None,
        default=_env("SESSION", None),
        help="the origin session (TETHER_SESSION)",
    )
    sub.add_argument("--all", action="store_true", help="include delivered and cancelled messages")
    sub.add_argument("--ack", action="store_true", help="acknowledge the listed messages")
    sub = add("prune", cmd_prune, "delete finished runs older than a given age, with all they recorded", True)
    sub.add_argument("--older-than", required=True, help="age of the runs to delete: 30d, 12h, 90m, 45s, 2w")
    sub.add_argument(
        "--status", default="done,cancelled,failed", help="finished statuses to delete (comma-separated)"
    )
    sub.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    sub = add("effects", cmd_effects, "list effects, or resolve an ambiguous one", True)
    sub.add_argument("--run-id", default=None, help="only this run's effects")
    sub.add_argument("--status", default=None, choices=None, help=f"one of {', '.join(EFFECT_STATUSES)}")
    sub.add_argument(
        "--resolve", nargs=2, metavar=("EFFECT_ID", "OUTCOME"), help="OUTCOME: applied, rejected or retry"
    )
    sub.add_argument("--actor", default=_env("ACTOR", "operator"), help="who resolves (TETHER_ACTOR)")
    sub = add("schedule", cmd_schedule, "add, list, pause, resume or remove cron schedules that start runs")
    actions = sub.add_subparsers(dest="action", metavar="ACTION", required=True)
    action = actions.add_parser(
        "add",
        help="start a run of WORKFLOW at every tick of CRON (workers that loaded it fire it)",
        description="start a run of WORKFLOW at every tick of CRON (workers that loaded it fire it)",
    )
    action.add_argument("workflow")
    action.add_argument(
        "cron", help="five fields: minute hour day-of-month month day-of-week ('0 9 * * 1-5')"
    )
    action.add_argument("--tz", default="UTC", help="the IANA time zone CRON is read in (UTC, Europe/Paris)")
    action.add_argument("--input", default="null", help="each run's input: JSON, @FILE or - for stdin")
    action.add_argument("--name", default=None, help="the schedule's name (default: the workflow's)")
    action.add_argument(
        "--catch-up",
        choices=("skip", "one"),
        default="skip",
        help="ticks missed while no worker ran: skip them, or start one run for all of them",
    )
    module_option(action)
    action.add_argument("--json", action="store_true", help="print JSON")
    text = "list the schedules (declared ones once a worker that loaded their workflow started)"
    action = actions.add_parser("list", help=text, description=text)
    action.add_argument("--workflow", default=None, help="only this workflow's schedules")
    action.add_argument("--json", action="store_true", help="print JSON")
    for verb, text in (
        ("pause", "pause a schedule (no tick fires until it is resumed)"),
        ("resume", "resume a schedule from its next tick"),
        ("remove", "delete a schedule added with `schedule add` (its runs stay)"),
    ):
        action = actions.add_parser(verb, help=text, description=text)
        action.add_argument("name")
        action.add_argument("--json", action="store_true", help="print JSON")
    sub = add("event", cmd_event, "send events into runs (a wait_for_event node takes them)")
    actions = sub.add_subparsers(dest="action", metavar="ACTION", required=True)
    text = "send an event into a run: kept until its wait_for_event node for NAME takes it"
    action = actions.add_parser("send", help=text, description=text)
    action.add_argument("run_id")
    action.add_argument("name", help="the event's name, as the run's wait_for_event node names it")
    action.add_argument("--payload", default="null", help="the event's payload: JSON, @FILE or - for stdin")
    action.add_argument("--actor", default=_env("ACTOR", "operator"), help="who sends it (TETHER_ACTOR)")
    action.add_argument("--json", action="store_true", help="print JSON")
    sub = add("serve", cmd_serve, "serve the console: the HTTP API and web pages (TETHER_API_TOKEN)")
    sub.add_argument("--host", default=_env("HOST", "127.0.0.1"), help="address to bind (TETHER_HOST)")
    sub.add_argument("--port", type=int, default=_env("PORT", 8080), help="port (TETHER_PORT)")
    sub.add_argument(
        "--allowed-hosts",
        default=_env("ALLOWED_HOSTS", "127.0.0.1,localhost,::1"),
        help="host names the Host and Origin headers may carry, comma-separated (TETHER_ALLOWED_HOSTS)",
    )
    sub.add_argument(
        "--public-url",
        default=_env("PUBLIC_URL", None),
        help="the console's address for people (TETHER_PUBLIC_URL)",
    )
    sub.add_argument(
        "--webhook",
        action="append",
        default=[u for u in os.environ.get("TETHER_WEBHOOKS", "").split(",") if u],
        help="POST notifications to this URL (repeatable; TETHER_WEBHOOKS, comma-separated; "
        "signed with TETHER_WEBHOOK_SECRET)",
    )
    sub.add_argument(
        "--webhook-format",
        choices=("json", "slack"),
        default=_env("WEBHOOK_FORMAT", "json"),
        help="the message shape (TETHER_WEBHOOK_FORMAT)",
    )
    sub.add_argument(
        "--notify-state",
        default=_env("NOTIFY_STATE", ".tether/notify-outbox.json"),
        help="the webhook outbox file (TETHER_NOTIFY_STATE)",
    )
    sub = add("mcp", cmd_mcp, "serve the workflows to an agent over the Model Context Protocol on stdio")
    sub.add_argument(
        "--read-only",
        action="store_true",
        default=os.environ.get("TETHER_MCP_READ_ONLY") == "1",
        help="offer only the tools that read (workflows, runs, what waits for a person) "
        "(TETHER_MCP_READ_ONLY=1)",
    )
    sub.add_argument(
        "--actor",
        default=_env("ACTOR", "agent"),
        help="who answers and cancels, in the journal (TETHER_ACTOR)",
    )
    module_option(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if str(args.log_level).upper() not in logging.getLevelNamesMapping():
        parser.error(f"--log-level must be one of {', '.join(sorted(logging.getLevelNamesMapping()))}")
    logging.basicConfig(
        level=str(args.log_level).upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(MaskUrls())
    try:
        return int(args.handler(args))
    except TetherError as error:
        print(f"tether: {mask_urls(str(error))}", file=sys.stderr)
        return exit_code(error)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`tether runs | head -1`): stop quietly, and keep Python from
        # complaining again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


class MaskUrls(logging.Filter):
    """Masks URL passwords in log lines (a store URL may reach a log message)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = mask_urls(record.getMessage())
        record.args = None
        return True


if __name__ == "__main__":
    sys.exit(main())
