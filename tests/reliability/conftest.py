"""Fixtures of the reliability suite: a printed, replayable seed per harness, the soak switch, and
the store contract suite's backends (``store_url``) for the harnesses that run on every backend.

``TETHER_SEED=<n>`` replays a harness; ``--soak`` (when this folder is named on the command line)
or ``TETHER_SOAK=1`` scales every harness up; ``TETHER_SOAK_REPORT=<file>`` collects their counts.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from datetime import date

import pytest

from tests.reliability.support import REPORT_ENV, soak_enabled
from tests.store.conftest import pg_database, store_url  # noqa: F401 - fixtures shared with the contract suite


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False, help="run the larger reliability sizes")


@pytest.fixture
def soak(request: pytest.FixtureRequest) -> bool:
    return soak_enabled(request.config)


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """The harness's seed: TETHER_SEED when set (a replay), else a fresh one; always printed."""
    raw = os.environ.get("TETHER_SEED", "").strip()
    value = int(raw) if raw else random.SystemRandom().randrange(1, 2**31)
    print(f"\n{request.node.nodeid}: seed {value} (replay with TETHER_SEED={value})")
    request.node.user_properties.append(("seed", value))
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    seeds = [value for name, value in item.user_properties if name == "seed"]
    if seeds and report.failed:  # type: ignore[attr-defined]
        report.sections.append(("seed", f"replay with TETHER_SEED={seeds[0]}"))  # type: ignore[attr-defined]
    return report


_started = time.monotonic()
_failed: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _failed.append(f"{report.nodeid} ({report.when})")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    if not os.path.exists(path):  # no harness reported (all failed early): the title still goes in
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8") as report:
            report.write(f"# Reliability soak {date.today().isoformat()}\n\n")
    with open(path, "a", encoding="utf-8") as report:
        report.write(
            f"## Session\n\nexit status {int(exitstatus)}, {session.testscollected} tests, "
            f"{time.monotonic() - _started:.0f} s wall clock on {os.cpu_count()} cores\n\n"
        )
        report.write("".join(f"- failed: {nodeid}\n" for nodeid in _failed) or "- every test passed\n")
