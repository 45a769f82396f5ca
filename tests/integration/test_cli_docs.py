"""docs/cli.md is generated from the argument parser and must match it exactly."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.integration.support import REPO, TETHER, clean_env
from tether import clidoc
from tether.cli import build_parser

PAGE = REPO / "docs" / "cli.md"
STALE = "docs/cli.md is stale: run `make docs` and commit the result"


def sections(text: str) -> dict[str, str]:
    """The help text of each ``## tether ...`` section of the page."""
    found = re.findall(r"^## (tether(?: [a-z-]+)?)\n\n```text\n(.*?)\n```$", text, flags=re.M | re.S)
    return dict(found)


def test_cli_reference_page_is_up_to_date() -> None:
    assert PAGE.exists(), STALE
    assert PAGE.read_text(encoding="utf-8") == clidoc.render(), STALE


def test_every_subcommand_has_a_section_and_every_section_a_subcommand() -> None:
    documented = sections(PAGE.read_text(encoding="utf-8"))
    commands = clidoc.command_names()
    assert len(commands) >= 18
    assert [name for name in documented if name != "tether"] == [f"tether {c}" for c in commands], STALE
    # The parser, not the page generator, is the source of the command list.
    parser_commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert sorted(parser_commands) == sorted(commands)


def test_each_section_is_what_the_command_prints_for_help() -> None:
    documented = sections(PAGE.read_text(encoding="utf-8"))
    probe = (
        "import contextlib, io, sys\n"
        "from tether.cli import main\n"
        "for name in sys.argv[1:]:\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "        main([*name.split()[1:], '--help'])\n"
        "    print(out.getvalue().rstrip('\\n'), end='\\n\\x00\\n')\n"
    )
    result = subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), "-c", probe, *documented],
        env=clean_env(COLUMNS=str(clidoc.COLUMNS)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    printed = result.stdout.split("\n\x00\n")[:-1]
    assert dict(zip(documented, printed, strict=True)) == documented


def test_the_tether_command_prints_the_documented_help() -> None:
    documented = sections(PAGE.read_text(encoding="utf-8"))
    result = subprocess.run(
        [str(TETHER), "submit", "--help"],
        env=clean_env(COLUMNS=str(clidoc.COLUMNS)),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert result.stdout.rstrip("\n") == documented["tether submit"]
    assert "--session SESSION" in documented["tether submit"]


def test_rendering_ignores_tether_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = clidoc.render()
    monkeypatch.setenv("TETHER_SESSION", "session-from-env")
    monkeypatch.setenv("TETHER_STORE", "sqlite:///elsewhere.db")
    assert clidoc.render() == plain


def test_the_exit_status_table_follows_the_cli_mapping() -> None:
    table = clidoc.exit_statuses()
    for needle in ("| 3 | `NotFound`:", "| 4 | `InvalidInput`:", "| 5 | `Conflict`:", "| 7 | `StoreBusy`:"):
        assert needle in table


def test_a_new_subcommand_makes_the_page_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    import tether.cli

    def with_extra_command():  # type: ignore[no-untyped-def]
        parser = build_parser()
        commands = next(a for a in parser._actions if a.dest == "command")
        commands.add_parser("frobnicate", help="a command the page does not know")  # type: ignore[attr-defined]
        return parser

    monkeypatch.setattr(tether.cli, "build_parser", with_extra_command)
    assert "frobnicate" in clidoc.command_names()
    assert "tether frobnicate" not in sections(PAGE.read_text(encoding="utf-8"))
    assert clidoc.render() != PAGE.read_text(encoding="utf-8")


def test_make_docs_regenerates_the_page_with_the_module(tmp_path: Path) -> None:
    plan = subprocess.run(
        ["make", "-n", "docs"], cwd=REPO, capture_output=True, text=True, timeout=30, check=True
    )
    assert ".venv/bin/python -m tether.clidoc docs/cli.md" in plan.stdout
    target = tmp_path / "cli.md"
    subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), "-m", "tether.clidoc", str(target)],
        cwd=REPO,
        env=clean_env(TETHER_SESSION="ignored"),
        timeout=30,
        check=True,
    )
    assert target.read_text(encoding="utf-8") == PAGE.read_text(encoding="utf-8")
