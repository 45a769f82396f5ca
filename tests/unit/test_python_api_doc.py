"""Every Python example in docs/python-api.md runs: each fenced ``python`` block is executed as a
script of its own in an empty folder (its stores are SQLite files there)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.MULTILINE | re.DOTALL)


def test_doc__has_examples() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc__example_runs(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"example_{index}.py"
    script.write_text(BLOCKS[index])
    ran = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert ran.returncode == 0, f"example {index} of {DOC.name} failed:\n{ran.stdout}\n{ran.stderr}"
