"""Render the command-line reference (docs/cli.md) from the ``tether`` argument parser.

``python -m tether.clidoc docs/cli.md`` (``make docs``) rewrites the page; a test fails when the
page is stale or misses a command. Each section is exactly what ``tether COMMAND --help`` prints
in a terminal 100 columns wide, with no ``TETHER_*`` variable set.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

#: argparse wraps at the terminal width minus 2; the page is rendered for 100 columns.
COLUMNS = 100

HEADER = """\
# The `tether` command line

Generated from the argument parser by `make docs` (`python -m tether.clidoc docs/cli.md`);
do not edit by hand. An option whose help names a `TETHER_*` variable also reads its default
from that environment variable.
"""


JSON_OUTPUT = """\
## JSON output

`--json` prints one JSON document (`events --json` and `watch --json` print one JSON object per
line). Times are ISO 8601 in UTC (`2026-12-03T15:40:00.123Z`); keys are sorted. The shapes are
stable: fields may be added, none is renamed or removed without a note here.

- `runs`: `{"total": N, "runs": [RUN, ...]}`, newest first (with `--waiting-for-event`: only the
  runs parked at a `wait_for_event` node, `total` counting them).
- `show`: `{"run": RUN, "input": JSON, "attempts": [ATTEMPT, ...], "result": RESULT}`.
- `inbox`: `[{"kind", "id", "run_id", "title", "details": [str], "at", "action"}, ...]`, newest
  first; `kind` is `decision`, `input`, `effect`, `parked`, `stranded` (a run whose decision was
  answered or whose event came while it is queued on a definition no live worker has) or
  `failed`; `action` is the command that acts on the item.
- `workflows`: `[{"name", "digest", "description"}, ...]`.
- `decisions`: `[{"decision_id", "run_id", "node_id", "request", "deadline_at", "outcome",
  "response", "provenance", ...}, ...]`.
- `effects`: `[{"effect_id", "run_id", "effect_type", "status", "attempt_count",
  "error_message", ...}, ...]`.
- `messages`: `[{"message_id", "run_id", "kind", "status", "payload", ...}, ...]`.
- `events`, `watch`: one `{"seq", "recorded_at", "run_id", "workflow_ref", "type", "runner_id",
  "payload"}` per line.
- `start`, `restart`: the run record, `{"run_id", "workflow_name", "status", "input", ...}`.
- `run`: RESULT.
- `db`: `{"store", "version", "latest", "current"}` (the store URL with any password masked).
- `cancel`, `pause`, `resume`: `{"run_id", "outcome"}`, `{"run_id", "paused"}`,
  `{"run_id", "resumed"}`.
- `schedule list`: `[SCHEDULE, ...]` by name; `schedule add`: the SCHEDULE added;
  `schedule pause`, `schedule resume`: `{"name", "paused", "changed"}` (`changed` false: it was so
  already); `schedule remove`: `{"name", "removed"}`.
- `event send`: `{"event_id", "run_id", "name", "payload", "sent_by", "sent_at", "taken_at",
  "taken_by_attempt_id"}`.

- RUN: `{"run_id", "workflow_name", "status", "run_state_status", "paused", "error_code",
  "error_message", "created_at", "started_at", "finished_at", "definition_digest", ...,
  "summary", "action"}`. `summary` is the human status `tether runs` prints ("completed",
  "waiting for decision d-…", "waiting for event delivered (times out at 2026-12-03 21:00:00 UTC,
  in 2 h 0 min)", "waiting for a slot of customer_id=acme (1 of 1 in use)", "effect needs
  resolution", "workflow changed", "no live worker has workflow X …"); `action` is the command
  that acts on the run, or `null`. A run waiting for an event is not in `inbox` (a system sends
  the event, not a person); `runs --waiting-for-event` lists those runs.
- ATTEMPT: `{"node_id", "attempt_number", "status", "output", "exit_name", "error_message",
  "elapsed_ms", "started_at", "finished_at", ...}`; a failed attempt's `error_message` holds its
  traceback.
- RESULT: `{"run_id", "status", "run_state_status", "output", "error_code", "error_message"}`.
- SCHEDULE: `{"name", "workflow_name", "origin", "cron", "timezone", "input", "catch_up",
  "paused", "next_due_at", "last_tick_at", "last_run_id", "created_at", "updated_at"}`; `origin`
  is `declared` (in a workflow's code, named `<workflow>:<name>`) or `added` (`schedule add`).
"""


def exit_statuses() -> str:
    """The exit-status table, from ``tether.cli.EXIT_CODES``."""
    from tether.cli import EXIT_CODES, TIMED_OUT_EXIT

    rows = ["| Status | Meaning |", "| --- | --- |", "| 0 | success |", "| 2 | usage error (bad arguments) |"]
    for kind, code in EXIT_CODES:
        meaning = " ".join((kind.__doc__ or kind.__name__).split())
        rows.append(f"| {code} | `{kind.__name__}`: {meaning} |")
    rows.append("| 1 | `tether run`, `tether watch`: the run did not complete (failed, cancelled, parked) |")
    rows.append(
        f"| {TIMED_OUT_EXIT} | `tether run`, `tether watch`: the run timed out "
        "(its `Workflow(timeout_s=...)` deadline passed) |"
    )
    rows.append("| 141 | the output's reader went away (`tether runs \\| head -1`) |")
    rows.append("| 130 | interrupted (Ctrl-C) |")
    return "## Exit status\n\n" + "\n".join(rows) + "\n"


@contextmanager
def _without_tether_environment() -> Iterator[None]:
    """Options' requiredness follows ``TETHER_*`` variables; the page shows the bare defaults."""
    saved = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith("TETHER_")}
    try:
        yield
    finally:
        os.environ.update(saved)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(parser: argparse.ArgumentParser) -> str:
    kind = parser.formatter_class
    parser.formatter_class = functools.partial(kind, width=COLUMNS - 2)  # type: ignore[call-arg]
    return parser.format_help().rstrip("\n")


def command_names() -> list[str]:
    """The subcommands of ``tether``, in the order ``tether --help`` lists them."""
    from tether.cli import build_parser

    with _without_tether_environment():
        return list(_subcommands(build_parser()))


def render() -> str:
    """The Markdown page: ``tether --help``, then each subcommand's ``--help``."""
    from tether.cli import build_parser

    with _without_tether_environment():
        parser = build_parser()
    sections = [HEADER, exit_statuses(), JSON_OUTPUT, "## tether\n\n```text\n" + _help(parser) + "\n```\n"]
    for name, sub in _subcommands(parser).items():
        sections.append(f"## tether {name}\n\n```text\n{_help(sub)}\n```\n")
        # A command with actions of its own (``schedule add``) documents each of them too.
        for action, command in _subcommands(sub).items():
            sections.append(f"### tether {name} {action}\n\n```text\n{_help(command)}\n```\n")
    return "\n".join(sections)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    text = render()
    if args:
        Path(args[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
