"""The console in a real browser: Playwright drives Debian's Chromium (``/usr/bin/chromium``,
installed by ``.ci/run``) against the console served by uvicorn, while a real ``Runner`` in a thread
executes the runs. SQLite only: the API and page tests cover both backends; here the browser is
what is under test.

With ``TETHER_CONSOLE_SCREENSHOTS=DIR`` the tests save the screenshots the documentation shows
(``docs/console/``) into DIR; otherwise into the test's temporary folder.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.console import workflows
from tests.console.conftest import HOSTS, OPERATOR, READER, wait_until
from tests.engine.conftest import Engine
from tether import open_store
from tether.console import ConsoleConfig, create_app

CHROMIUM = "/usr/bin/chromium"
WAIT_MS = 15_000

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
    reason=f"the browser tests need Debian's Chromium at {CHROMIUM} (apt-get install chromium)",
)


class Served:
    """The console served by uvicorn on a free local port, in a thread."""

    def __init__(self, engine: Engine) -> None:
        import uvicorn

        config = ConsoleConfig(operator_tokens=(OPERATOR,), read_tokens=(READER,), allowed_hosts=HOSTS)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                create_app(config, engine.client),
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                timeout_graceful_shutdown=1,
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, what="the console to listen")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, Engine]]:
    store = open_store(f"sqlite:///{tmp_path}/tether.db")
    engine = Engine(store, tmp_path)
    engine.register(*workflows.ALL)
    engine.runner()
    server = Served(engine)
    try:
        yield server, engine
    finally:
        server.stop()
        engine.stop_all()
        store.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("TETHER_CONSOLE_SCREENSHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def signed_in(browser: Any, served: Served, path: str, **context: Any) -> Any:
    """A page signed in through the login form, at ``path``."""
    page = browser.new_context(**context).new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(served.url + path)
    assert "/login" in page.url
    page.fill("input[name=token]", OPERATOR)
    page.click("form button")
    page.wait_for_url(served.url + path)
    return page


def test_answer_a_decision_in_the_inbox_and_watch_the_run_finish(
    served: tuple[Served, Engine], browser: Any, shots: Path
) -> None:
    from playwright.sync_api import expect

    server, engine = served
    client = engine.client
    client.start("hostile", run_id="nightly-report")
    run = client.start("approval", {"version": "2.4.0"}, run_id="release-2.4.0")
    sized = client.start("sized", run_id="restock-42")
    client.start("asked", run_id="onboarding-ada", session_id="chat-ada")
    wait_until(lambda: client.decisions(run.run_id) and client.decisions(sized.run_id), what="two decisions")
    wait_until(lambda: client.store.requests(status="pending"), what="an input request")

    inbox = signed_in(browser, server, "/inbox")
    expect(inbox.locator("#inbox article.question")).to_have_count(3)
    inbox.screenshot(path=str(shots / "inbox.png"), full_page=True)

    watcher = inbox.context.new_page()
    watcher.set_default_timeout(WAIT_MS)
    watcher.goto(f"{server.url}/runs/{run.run_id}")
    expect(watcher.locator("#run-status")).to_have_text("parked")
    watcher.evaluate("window.notReloaded = true")

    # A dismissed confirmation sends nothing.
    inbox.once("dialog", lambda dialog: dialog.dismiss())
    inbox.click("#inbox button[value=approve]")
    time.sleep(0.3)
    assert client.decisions(run.run_id)[0].outcome is None

    inbox.once("dialog", lambda dialog: dialog.accept())
    inbox.click("#inbox button[value=approve]")
    inbox.wait_for_url("**/inbox?notice=answered")
    expect(inbox.locator(".notice")).to_have_text("answered")

    expect(watcher.locator("#run-status")).to_have_text("done")
    expect(watcher.locator("li.step[data-state=completed]")).to_have_count(3)
    expect(watcher.locator("#timeline li", has_text="run.queue_done")).to_have_count(1)
    assert watcher.evaluate("window.notReloaded") is True
    watcher.screenshot(path=str(shots / "run.png"), full_page=True)

    runs = inbox.context.new_page()
    runs.goto(server.url + "/")
    expect(runs.locator("tr[data-run]")).to_have_count(4)
    runs.screenshot(path=str(shots / "runs.png"), full_page=True)

    phone = signed_in(browser, server, "/inbox", viewport={"width": 390, "height": 844}, is_mobile=True)
    phone.screenshot(path=str(shots / "inbox-phone.png"), full_page=True)
    for path in ("/inbox", f"/runs/{run.run_id}", "/"):
        phone.goto(server.url + path)
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{path} scrolls sideways on a phone ({width} px)"


def test_cancel_a_run_from_its_page_and_the_list_follows(served: tuple[Served, Engine], browser: Any) -> None:
    from playwright.sync_api import expect

    server, engine = served
    run = engine.client.start("napping", run_id="long-nap")
    wait_until(lambda: engine.statuses(run.run_id)[0] == "parked", what="the run to sleep")

    runs = signed_in(browser, server, "/")
    expect(runs.locator("tr[data-run=long-nap] .badge")).to_have_text("parked")
    runs.evaluate("window.notReloaded = true")

    page = runs.context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{server.url}/runs/{run.run_id}")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button.danger")
    expect(page.locator("#run-status")).to_have_text("cancelled")
    assert engine.statuses(run.run_id)[0] == "cancelled"

    # The list page updates itself, a new run included.
    expect(runs.locator("tr[data-run=long-nap] .badge")).to_have_text("cancelled")
    engine.client.start("napping", run_id="second-nap")
    expect(runs.locator("tr[data-run=second-nap]")).to_have_count(1)
    assert runs.evaluate("window.notReloaded") is True


def test_schedules_page_pauses_resumes_and_removes_a_schedule(
    served: tuple[Served, Engine], browser: Any, shots: Path
) -> None:
    from playwright.sync_api import expect

    server, engine = served
    client = engine.client
    client.add_schedule("napping", "0 9 * * 1-5", tz="Europe/Paris", name="weekday-nap")
    client.add_schedule("hostile", "30 2 * * *", name="nightly-report")
    run = client.start("shipping", run_id="order-A-17")
    wait_until(lambda: client.store.event_wait(run.run_id) is not None, what="the run to wait for its event")

    runs = signed_in(browser, server, "/")
    expect(runs.locator("tr[data-run=order-A-17] .summary")).to_contain_text("waiting for event delivered")
    runs.click("nav a[href='/schedules']")
    runs.wait_for_url(server.url + "/schedules")
    page = runs
    row = page.locator("tr[data-schedule=weekday-nap]")
    expect(page.locator("tr[data-schedule]")).to_have_count(2)
    expect(row.locator("td.next time")).to_have_count(1)
    page.screenshot(path=str(shots / "schedules.png"), full_page=True)

    # A dismissed confirmation changes nothing.
    page.once("dialog", lambda dialog: dialog.dismiss())
    row.locator("button", has_text="Pause").click()
    time.sleep(0.3)
    assert not client.schedule("weekday-nap").paused

    page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button", has_text="Pause").click()
    page.wait_for_url("**/schedules?notice=*")
    expect(page.locator(".notice")).to_have_text("weekday-nap: paused")
    expect(row.locator("td.next .badge")).to_have_text("paused")
    assert client.schedule("weekday-nap").paused

    page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button", has_text="Resume").click()
    expect(page.locator(".notice")).to_have_text("weekday-nap: resumed")
    expect(row.locator("td.next time")).to_have_count(1)
    assert not client.schedule("weekday-nap").paused

    page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button.danger").click()
    expect(page.locator(".notice")).to_have_text("weekday-nap: removed")
    expect(page.locator("tr[data-schedule]")).to_have_count(1)
    assert [s.name for s in client.schedules()] == ["nightly-report"]

    phone = signed_in(browser, server, "/schedules", viewport={"width": 390, "height": 844}, is_mobile=True)
    width = phone.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"/schedules scrolls sideways on a phone ({width} px)"


def test_the_run_page_shows_a_models_text_as_it_streams(served: tuple[Served, Engine], browser: Any) -> None:
    from playwright.sync_api import expect

    from tests.engine.test_streaming_turns import _SlowServer
    from tether.engine.graph import Workflow, agent
    from tether.engine.providers import OpenAICompatibleProvider

    server, engine = served
    slow = _SlowServer()
    try:
        model = OpenAICompatibleProvider(base_url=slow.url + "/v1", model="m", api_key="k", timeout_s=30)
        schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
        engine.register(
            Workflow(
                "tides", start="think", nodes=[agent("think", model, "Tides?", schema=schema, max_turns=3)]
            )
        )
        run = engine.client.start("tides", run_id="tides-1")
        page = signed_in(browser, server, f"/runs/{run.run_id}")
        page.evaluate("window.notReloaded = true")
        # The server holds the rest of the answer back: its start shows while the turn runs.
        expect(page.locator("li.streaming .live-text")).to_contain_text('{"answ')
        slow.release.set()
        expect(page.locator("#run-status")).to_have_text("done")
        # The recorded turn replaces the streamed text, without reloading the page.
        expect(page.locator("li.streaming")).to_have_count(0)
        expect(page.locator(".conversation li", has_text="The tide comes in")).to_have_count(1)
        assert page.evaluate("window.notReloaded") is True
    finally:
        slow.close()
