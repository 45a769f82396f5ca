"""Tether ships its types (``py.typed``): an application checked with ``mypy --strict`` sees them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

APP = Path(__file__).parent.parent / "typing_app" / "expenses.py"


def mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    # Outside the repository, so that mypy finds tether only as an installed package.
    (tmp_path / "app.py").write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "app.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_typing__a_typed_application_passes_mypy_strict(tmp_path: Path) -> None:
    checked = mypy(tmp_path, APP.read_text())
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.slow
def test_typing__mypy_sees_tethers_types_and_reports_a_misuse(tmp_path: Path) -> None:
    # A misspelt attribute of a record and a wrong argument type: found only if the types are seen.
    source = APP.read_text() + (
        "\n\ndef misuse(client: Tether) -> str:\n"
        "    run = client.start('expenses', run_id=42)\n"
        "    return run.run_idd\n"
    )
    checked = mypy(tmp_path, source)
    assert checked.returncode == 1
    assert 'Argument "run_id" to "start" of "Tether" has incompatible type "int"' in checked.stdout
    assert '"Started" has no attribute "run_idd"' in checked.stdout


def test_typing__the_marker_is_shipped_with_the_package() -> None:
    import tether

    assert (Path(tether.__file__).parent / "py.typed").is_file()
