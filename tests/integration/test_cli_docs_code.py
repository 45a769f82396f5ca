"""The code in the docs runs: docs/workflows.md's and docs/troubleshooting.md's Python blocks, the
README's workflow and client examples and its `tether` commands, and every example in the
commands' help (docs/cli.md) parses."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.support import EXAMPLES, REPO, TETHER, clean_env
from tether.cli import EXAMPLES as HELP_EXAMPLES
from tether.cli import build_parser

PYTHON = REPO / ".venv" / "bin" / "python"


def blocks(path: Path, language: str) -> list[str]:
    """The fenced code blocks of a Markdown page whose info string is ``language``."""
    found: list[str] = []
    current: list[str] | None = None
    kind = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if current is None and line.startswith("```"):
            current, kind = [], line[3:].strip()
        elif current is not None and line == "```":
            if kind == language:
                found.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    return found


def run_python(code: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    script = cwd / "doc_code.py"
    script.write_text(code, encoding="utf-8")
    return subprocess.run(
        [str(PYTHON), str(script)],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("page", ["workflows.md", "troubleshooting.md", "agents.md"])
def test_the_python_blocks_of_a_docs_page_run(page: str, tmp_path: Path) -> None:
    code = blocks(REPO / "docs" / page, "python")
    assert code, f"docs/{page} has no Python block"
    result = run_python("\n".join(code), tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_workflow_guide_covers_what_a_newcomer_needs() -> None:
    text = (REPO / "docs" / "workflows.md").read_text(encoding="utf-8")
    for needle in (
        "ctx.cancelled",
        "ctx.outputs",
        "`include(id, workflow)`",
        "ScriptedProvider",
        "--accept-changes",
        "cancellation-and-versioning.md",
    ):
        assert needle in text
    kinds = (
        "compute",
        "shell",
        "effect",
        "decision",
        "input",
        "agent",
        "notify",
        "sleep",
        "include",
        "child",
    )
    for kind in kinds:
        assert f"| `{kind}(" in text, f"the node table misses {kind}"


def test_the_readme_python_examples_run(tmp_path: Path) -> None:
    # The workflow, the client, and the runner embedded beside the client (it goes on from there).
    workflow, client, embedded = blocks(REPO / "README.md", "python")
    result = run_python(workflow + "\nassert release.name == 'release'\n", tmp_path)
    assert result.returncode == 0, result.stderr
    # The client example waits for a worker: one runs beside it on the same store.
    worker = subprocess.Popen(
        [str(TETHER), "--folder", str(EXAMPLES), "worker", "--poll-ms", "50"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        code = client.replace('folder="examples"', f"folder={str(EXAMPLES)!r}")
        code += "\nassert result.status == 'done', result\n" + embedded
        code += "\nassert runner.stopping and runner.join(5)\n"
        result = run_python(code, tmp_path)
        assert result.returncode == 0, result.stderr
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_the_readme_commands_run_against_a_temporary_store(tmp_path: Path) -> None:
    """The README's "Running" block, in order: ids filled in, the worker stopping when idle and
    the journal printed rather than followed."""
    [running] = [b for b in blocks(REPO / "README.md", "") if "tether --folder examples start" in b]
    env = clean_env(TETHER_STORE=f"sqlite:///{tmp_path / 'readme.db'}")
    ids: dict[str, str] = {}
    for line in running.splitlines():
        argv = shlex.split(line.split("  #")[0])
        assert argv[0] == "tether"
        argv = [str(TETHER), *(str(EXAMPLES) if a == "examples" else ids.get(a, a) for a in argv[1:])]
        if "worker" in argv:
            argv += ["--until-idle", "--poll-ms", "50"]
        if "--follow" in argv:
            argv.remove("--follow")
        result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert "Traceback" not in result.stderr
        if "--accept-changes" in argv:
            # The run was cancelled just before: nothing to resume, said in one line.
            assert result.returncode == 5 and result.stderr.startswith("tether: "), result.stderr
            continue
        assert result.returncode == 0, f"{line}: {result.stderr}"
        if "start" in argv:
            ids["RUN_ID"] = result.stdout.strip()
        if "inbox" in argv:
            ids["DECISION_ID"] = re.findall(r"tether answer (\S+)", result.stdout)[0]
    assert {"RUN_ID", "DECISION_ID"} <= set(ids)


def test_the_readme_names_only_real_environment_variables() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    parser = build_parser()
    helps = parser.format_help() + "".join(
        sub.format_help()
        for action in parser._actions
        if isinstance(action, type(parser._subparsers._actions[-1]))  # type: ignore[union-attr]
        for sub in action.choices.values()  # type: ignore[union-attr]
    )
    in_parser = set(re.findall(r"TETHER_[A-Z_]+", helps))
    in_readme = set(re.findall(r"TETHER_[A-Z_]+", readme)) - {"TETHER_SOAK", "TETHER_SOAK_REPORT"}
    assert in_readme <= in_parser, in_readme - in_parser
    # Every variable of a global or worker option is named there; serve's are listed in docs/cli.md.
    serve = {"TETHER_HOST", "TETHER_PORT", "TETHER_ALLOWED_HOSTS", "TETHER_PUBLIC_URL", "TETHER_WEBHOOKS"}
    serve |= {"TETHER_WEBHOOK_SECRET", "TETHER_WEBHOOK_FORMAT", "TETHER_NOTIFY_STATE", "TETHER_API_TOKEN"}
    assert in_parser - serve <= in_readme, (in_parser - serve) - in_readme
    assert "Every CLI option has a `TETHER_*`" not in readme


@pytest.mark.parametrize("command", sorted(HELP_EXAMPLES))
def test_every_help_example_parses(command: str) -> None:
    for example in HELP_EXAMPLES[command]:
        argv = shlex.split(example.rsplit(" | ", 1)[-1])
        while "=" in argv[0]:  # an environment assignment before the command
            argv.pop(0)
        assert argv[0] == "tether"
        if argv[1:]:
            args = build_parser().parse_args(argv[1:])
            assert command == "tether" or args.command == command


def test_the_main_help_example_runs(tmp_path: Path) -> None:
    [example] = [e for e in HELP_EXAMPLES["tether"] if " run " in e]
    argv = shlex.split(example.replace("examples", str(EXAMPLES)))
    result = subprocess.run(
        [str(TETHER), *argv[1:], "--poll-ms", "50"],
        cwd=tmp_path,
        env=clean_env(TETHER_STORE=f"sqlite:///{tmp_path / 'help.db'}"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("completed in ")
    assert os.path.exists(tmp_path / "help.db") and sys.platform
