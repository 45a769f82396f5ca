"""The ``tether`` command line: a thin layer over ``tether.client``.

Every option has a ``TETHER_*`` environment variable. Errors print as one line on stderr and map to
exit codes in one place (``EXIT_CODES``).
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
from datetime import datetime, timedelta
from typing import Any

from tether.client import DEFAULT_STORE, Tether, WaitTimeout
from tether.engine.runner import Abandoned, Runner, RunnerConfig
from tether.errors import (
    ClaimLost,
    Conflict,
    IllegalTransition,
    InconsistentState,
    InvalidInput,
    NotFound,
    StoreBusy,
    TetherError,
)
from tether.logs import use_json
from tether.store import open_store, schema_version

#: Exit status per error type (the first match in order wins); 2 is argparse's usage error.
EXIT_CODES: list[tuple[type[TetherError], int]] = [
    (NotFound, 3),
    (InvalidInput, 4),
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


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: v for k, v in dataclasses.asdict(value).items() if k != "claim_token"}
    raise TypeError(type(value).__name__)


def emit(args: argparse.Namespace, value: Any, text: Callable[[], str]) -> None:
    """Print ``value`` as JSON with ``--json``, else the human form."""
    if getattr(args, "json", False):
        print(json.dumps(value, default=_json_default, indent=2, sort_keys=True))
    else:
        print(text())


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidInput(f"{what} is not valid JSON: {error.msg} at position {error.pos}") from None
    except RecursionError:
        raise InvalidInput(f"{what} nests too deeply") from None


def client(args: argparse.Namespace) -> Tether:
    return Tether(
        args.store,
        folder=args.folder,
        modules=getattr(args, "module", None) or (),
        project=args.project,
        migrate=not args.no_migrate,
    )


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
    state = {"version": current, "latest": latest, "current": current == latest}
    emit(args, state, lambda: f"schema version {current}; this Tether's latest is {latest}")
    return 0 if current == latest else 1


def runner_config(args: argparse.Namespace) -> RunnerConfig:
    return RunnerConfig(
        lease_ms=args.lease_ms,
        poll_ms=args.poll_ms,
        concurrency=args.concurrency,
        max_takeovers=args.max_takeovers,
    )


# -- commands --------------------------------------------------------------------------------
def cmd_workflows(args: argparse.Namespace) -> int:
    tether = client(args)
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
        lambda: "\n".join(f"{r['name']:<20} {r['description']}" for r in rows) or "no workflows found",
    )
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    workflow = client(args).registry.get(args.workflow)
    print(workflow.mermaid() if args.mermaid else workflow.text())
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    tether = client(args)
    run = tether.start(
        args.workflow, parse_json(args.input, "--input"), run_id=args.run_id, session_id=args.session
    )
    emit(args, run, lambda: run.run_id)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Start a run and execute it in this process with a live view."""
    tether = client(args)
    workflow = tether.registry.get(args.workflow)
    run = tether.start(
        workflow.name, parse_json(args.input, "--input"), run_id=args.run_id, session_id=args.session
    )
    print(workflow.text())
    print(f"\nrun {run.run_id}")
    runner = Runner(tether.store, tether.registry, config=runner_config(args))

    def settled() -> bool:
        view = tether.store.get_run_view(run.run_id)
        return (
            view is None
            or view.status in ("done", "failed", "cancelled")
            or view.run_state_status == "waiting"
            # Parked for an operator (no progress, source changed): no runner will claim it.
            or (view.status == "parked" and view.error_code is not None)
        )

    worker = threading.Thread(target=runner.run, kwargs={"stop_when": settled}, daemon=True)
    started = time.monotonic()
    worker.start()
    seq = 0
    try:
        while worker.is_alive() or seq < tether.store.last_event_seq():
            for event in tether.store.events_after(seq, run_id=run.run_id, limit=500):
                seq = event.seq
                node = event.payload.get("nodeId", "") if isinstance(event.payload, dict) else ""
                print(f"[{time.monotonic() - started:7.2f}s] {event.type:<22} {node}")
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
        print(f"\nrun {run.run_id} is waiting for a person:")
        for decision in tether.decisions(run.run_id):
            print(
                f"  decision {decision.decision_id}: {decision.request.get('question')}"
                "  (tether answer ID VALUE)"
            )
        for request in tether.store.requests(run_id=run.run_id, status="pending"):
            print(f"  input {request.request_id}: {request.payload.get('prompt')}  (tether submit ID JSON)")
        print("  then `tether worker` continues it")
        return 0
    emit(
        args,
        result,
        lambda: f"\n{result.status} ({result.run_state_status}) output: {json.dumps(result.output)}",
    )
    if result.status == "failed" or (result.status == "parked" and result.error_code):
        print(f"error {result.error_code}: {result.error_message}", file=sys.stderr)
        return 1
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    if args.log_format == "json":
        use_json()
    tether = client(args)
    if not len(tether.registry):
        raise InvalidInput(
            f"No workflows found in {args.folder!r}: a worker executes only the workflows it "
            "loaded, so it would never take a run. Pass --folder (or TETHER_WORKFLOWS) naming "
            "the folder of your workflow files, or --module naming an importable module"
        )
    runner = Runner(tether.store, tether.registry, runner_id=args.runner_id, config=runner_config(args))
    runner.install_signal_handlers()
    print(
        f"worker {runner.label} on {args.store} ({len(tether.registry)} workflows; "
        f"instance {runner.runner_id})",
        flush=True,
    )
    try:
        runner.run(stop_when=runner.idle_for_good if args.until_idle else None)
    except Abandoned:
        return 130  # a second signal: every run was handed back at once
    return 0


def _run_line(view: Any, note: str | None = None) -> str:
    paused = " paused" if view.paused else ""
    waits = f"  ({note})" if note else ""
    return (
        f"{view.run_id:<42} {view.workflow_name:<16} {view.status:<10} {view.run_state_status:<10}"
        f"{paused}{waits}"
    )


def cmd_runs(args: argparse.Namespace) -> int:
    tether = client(args)
    page = tether.store.list_run_views(offset=args.offset, limit=args.limit)
    notes = tether.waiting_notes(page.runs)
    emit(
        args,
        page,
        lambda: "\n".join(_run_line(v, notes.get(v.run_id)) for v in page.runs) or "no runs",
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    tether = client(args)
    view = tether.view(args.run_id)
    attempts = tether.store.attempts(args.run_id)
    value = {"run": view, "attempts": attempts, "result": tether.result(args.run_id)}
    note = tether.waiting_notes([view]).get(view.run_id)

    def text() -> str:
        lines = [_run_line(view)]
        if note:
            lines.append(f"waiting: {note}")
        if view.error_code:
            lines.append(f"error {view.error_code}: {view.error_message}")
        for a in attempts:
            lines.append(f"  {a.node_id:<24} #{a.attempt_number} {a.status:<11} {a.exit_name or ''}")
            if a.status in ("failed", "timed_out") and a.error_message:
                # A failed step's story: its exception, message and traceback.
                lines += [f"      {line}" for line in a.error_message.splitlines()]
        return "\n".join(lines)

    emit(args, value, text)
    return 0


def _print_event(args: argparse.Namespace, event: Any) -> None:
    if args.json:
        print(json.dumps(event, default=_json_default, sort_keys=True), flush=True)
    else:
        stamp = event.recorded_at.strftime("%H:%M:%S.%f")[:-3]
        print(
            f"#{event.seq:<6} {stamp} {event.run_id:<40} {event.type:<24} {json.dumps(event.payload)}",
            flush=True,
        )


def cmd_events(args: argparse.Namespace) -> int:
    tether = client(args)
    for event in tether.events(args.after, run_id=args.run_id, follow=args.follow):
        _print_event(args, event)
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    tether = client(args)
    tether._view(args.run_id)
    for event in tether.events(0, run_id=args.run_id, follow=True):
        _print_event(args, event)
        if event.type in ("run.queue_done", "run.queue_failed", "run.queue_cancelled"):
            break
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    outcome = client(args).cancel(args.run_id)
    emit(args, {"run_id": args.run_id, "outcome": outcome}, lambda: f"{args.run_id}: {outcome}")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    client(args).pause(args.run_id)
    emit(args, {"run_id": args.run_id, "paused": True}, lambda: f"{args.run_id}: paused")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    tether = client(args)
    tether.resume(args.run_id, accept_changes=args.accept_changes)
    if args.accept_changes:
        digest = tether.view(args.run_id).definition_digest
        emit(
            args,
            {"run_id": args.run_id, "resumed": True, "definition_digest": digest},
            lambda: f"{args.run_id}: resumed on the new definition ({digest[:19]}...)",
        )
        return 0
    emit(args, {"run_id": args.run_id, "resumed": True}, lambda: f"{args.run_id}: resumed")
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    tether = client(args)
    given = None if args.input is None else parse_json(args.input, "--input")
    run = tether.restart(args.run_id, input=given, new_run_id=args.new_run_id)
    emit(args, run, lambda: run.run_id)
    return 0


def cmd_decisions(args: argparse.Namespace) -> int:
    decisions = client(args).decisions(args.run_id, open_only=not args.all)

    def text() -> str:
        return (
            "\n".join(
                f"{d.decision_id} run={d.run_id} node={d.node_id} {d.outcome or 'open'}: "
                f"{d.request.get('question')}"
                f" options={d.request.get('options')}"
                for d in decisions
            )
            or "no open decisions"
        )

    emit(args, decisions, text)
    return 0


def cmd_answer(args: argparse.Namespace) -> int:
    tether = client(args)
    found = tether.store.decisions(decision_id=args.decision_id)
    if not found:
        raise NotFound(f"Decision not found: {args.decision_id}")
    options = found[0].request.get("options") if found and isinstance(found[0].request, dict) else None
    response = args.response if options else parse_json(args.response, "the answer")
    decision = tether.answer(args.decision_id, response, actor_id=args.actor)
    emit(args, decision, lambda: f"{decision.decision_id}: {decision.outcome} ({decision.provenance})")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    submission = client(args).submit(args.request_id, args.session, parse_json(args.payload, "the payload"))
    emit(args, submission, lambda: f"{submission.submission_id}: {submission.outcome}")
    return 0


def cmd_messages(args: argparse.Namespace) -> int:
    session = client(args).session(args.session)
    messages = session.messages(pending_only=not args.all)
    if args.ack:
        for message in messages:
            session.ack(message.message_id)
    emit(
        args,
        messages,
        lambda: (
            "\n".join(f"{m.message_id} {m.kind:<12} {json.dumps(m.payload)}" for m in messages)
            or "no messages"
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
    emit(
        args,
        {**counts, "dry_run": report.dry_run, "finished_before": cutoff},
        lambda: (
            f"{verb} {counts.pop('runs')} runs finished before {cutoff.isoformat()}: "
            + ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in counts.items())
        ),
    )
    return 0


def cmd_effects(args: argparse.Namespace) -> int:
    tether = client(args)
    if args.resolve:
        effect = tether.resolve_effect(args.resolve[0], args.resolve[1], actor_id=args.actor)
        emit(args, effect, lambda: f"{effect.effect_id}: {effect.status}")
        return 0
    effects = tether.store.effects(run_id=args.run_id, status=args.status)
    emit(
        args,
        effects,
        lambda: (
            "\n".join(f"{e.effect_id} {e.run_id} {e.effect_type:<24} {e.status}" for e in effects)
            or "no effects"
        ),
    )
    return 0


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
        folder=args.folder,
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
    print(f"console on {public_url} (store {args.store})", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=str(args.log_level).lower(), access_log=False)
    return 0


# -- parser ----------------------------------------------------------------------------------
def _env(name: str, default: Any) -> Any:
    # A string default goes through the option's ``type`` like a command-line value, so a bad
    # TETHER_* value gets the same one-line usage error as a bad option.
    return os.environ.get(f"TETHER_{name}", default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tether", description="Durable workflow runs for Python")
    parser.add_argument("--store", default=_env("STORE", DEFAULT_STORE), help="store URL (TETHER_STORE)")
    parser.add_argument(
        "--folder", default=_env("WORKFLOWS", "workflows"), help="workflows folder (TETHER_WORKFLOWS)"
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
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, handler: Callable[[argparse.Namespace], int], help: str, json_output: bool = False
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
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
        sub.add_argument("--input", default="null", help="the run's input as JSON")
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
    runner_options(sub)
    sub = add("runs", cmd_runs, "list runs, newest first", True)
    sub.add_argument("--offset", type=int, default=0)
    sub.add_argument("--limit", type=int, default=50)
    for name, handler, text in (
        ("show", cmd_show, "show a run, its attempts and result"),
        ("watch", cmd_watch, "follow a run's events until it finishes"),
        ("cancel", cmd_cancel, "cancel a run (no step of it begins once the cancel is committed)"),
        ("pause", cmd_pause, "pause a run waiting for its session's input (its deadline stops)"),
        ("resume", cmd_resume, "resume a paused or parked run"),
    ):
        sub = add(name, handler, text, True)
        sub.add_argument("run_id")
    sub.add_argument(
        "--accept-changes",
        action="store_true",
        help="move a run reserved on an older definition onto the workflow as loaded now, "
        "continuing after its last completed node",
    )
    sub = add("restart", cmd_restart, "start a new run linked to a finished one", True)
    sub.add_argument("run_id")
    sub.add_argument("--input", default=None, help="new input as JSON (default: the parent's)")
    sub.add_argument("--new-run-id", default=None)
    sub = add("events", cmd_events, "print the event journal", True)
    sub.add_argument("--after", type=int, default=0, help="only events after this sequence number")
    sub.add_argument("--run-id", default=None)
    sub.add_argument("--follow", action="store_true", help="keep printing new events")
    sub = add("decisions", cmd_decisions, "list open decisions", True)
    sub.add_argument("--run-id", default=None)
    sub.add_argument("--all", action="store_true", help="include resolved decisions")
    sub = add("answer", cmd_answer, "answer a decision (an option name, or JSON for a schema)", True)
    sub.add_argument("decision_id")
    sub.add_argument("response")
    sub.add_argument("--actor", default=_env("ACTOR", "human"), help="who answers (TETHER_ACTOR)")
    sub = add("submit", cmd_submit, "submit a session's JSON answer to an input request", True)
    sub.add_argument("request_id")
    sub.add_argument("payload")
    sub.add_argument(
        "--session", required=os.environ.get("TETHER_SESSION") is None, default=_env("SESSION", None)
    )
    sub = add("messages", cmd_messages, "a session's pending messages", True)
    sub.add_argument(
        "--session", required=os.environ.get("TETHER_SESSION") is None, default=_env("SESSION", None)
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
    sub.add_argument("--run-id", default=None)
    sub.add_argument("--status", default=None)
    sub.add_argument(
        "--resolve", nargs=2, metavar=("EFFECT_ID", "OUTCOME"), help="OUTCOME: applied, rejected or retry"
    )
    sub.add_argument("--actor", default=_env("ACTOR", "operator"))
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if str(args.log_level).upper() not in logging.getLevelNamesMapping():
        parser.error(f"--log-level must be one of {', '.join(sorted(logging.getLevelNamesMapping()))}")
    logging.basicConfig(
        level=str(args.log_level).upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    try:
        return int(args.handler(args))
    except TetherError as error:
        print(f"tether: {error}", file=sys.stderr)
        return exit_code(error)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
