"""Fixtures of the integration suite: a lab (store, workflows folder, sink) per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import pg
from tests.integration.support import Lab

pg_database = pg.pg_database
store_url = pg.store_url


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.shutdown()


@pytest.fixture
def any_lab(tmp_path: Path, store_url: str) -> Iterator[Lab]:
    """A lab on each backend: SQLite in the lab folder, or the emptied PostgreSQL test database."""
    lab = Lab(tmp_path, url=store_url)
    try:
        yield lab
    finally:
        lab.shutdown()
