"""The example workflows run end to end from their folder, and a folder's file identity is what
source-change detection compares."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tether.client import Tether
from tether.engine.registry import Registry, WorkflowLoadError, load_folder

from .conftest import Engine, wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def examples(engine: Engine) -> Engine:
    engine.client = Tether(engine.store, folder=EXAMPLES)
    return engine


def test_examples__are_loaded_with_their_file_identity(examples: Engine) -> None:
    registry = examples.client.registry
    assert {"pipeline", "fetch", "release", "interview"} <= set(registry.names())
    source = registry.source("pipeline")
    content = (EXAMPLES / "pipeline.py").read_bytes()
    assert source["root"] == {
        "kind": "file",
        "path": str(EXAMPLES / "pipeline.py"),
        "hash": "sha256:" + hashlib.sha256(content).hexdigest(),
    }
    assert [m["workflowName"] for m in source["mounted"]] == ["fetch"]


def test_example_pipeline__retries_sleeps_and_summarises(examples: Engine) -> None:
    examples.runner()
    run = examples.client.start("pipeline", {"count": 3})
    result = examples.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output["records"] == 3
    assert result.output["total"] == 1 + 4 + 9
    assert len(result.output["checksum"]) == 16
    get_attempts = examples.attempts(run.run_id, "fetch/get")
    assert [a.status for a in get_attempts] == ["failed", "completed"]


def test_example_release__publishes_after_approval(
    examples: Engine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TETHER_RELEASES", str(tmp_path / "releases"))
    examples.runner()
    run = examples.client.start("release", {"version": "2.0.0"})
    decision = wait_until(lambda: examples.client.decisions(run.run_id), what="the approval")[0]
    examples.client.answer(decision.decision_id, "approve")
    result = examples.wait(run.run_id)
    assert result.status == "done", result.error_message
    published = json.loads((tmp_path / "releases" / "2.0.0.json").read_text())
    assert published["key"] == f"{run.run_id}:publish:1"
    (effect,) = examples.store.effects(run_id=run.run_id)
    assert (effect.effect_type, effect.status) == ("release.publish", "applied")


def test_example_interview__asks_the_session_and_replies(examples: Engine) -> None:
    examples.runner()
    session = examples.client.session("session-interview")
    run = session.start("interview")
    (request,) = wait_until(session.pending_inputs, what="the interview question")
    session.submit(request.request_id, {"answer": "nightly backups"})
    result = examples.wait(run.run_id)
    assert result.status == "done", result.error_message
    notifications = [m.payload for m in session.messages() if m.kind == "notification"]
    assert notifications == [{"text": "The user wants: nightly backups"}]


def test_folder__an_edited_file_parks_runs_reserved_before(engine: Engine, tmp_path: Path) -> None:
    folder = tmp_path / "workflows"
    folder.mkdir()
    flow = folder / "flow.py"
    body = (
        "from tether.engine.graph import Workflow, compute\n"
        "def work(ctx):\n    return {{'version': {version}}}\n"
        "flow = Workflow('flow', start='work', nodes=[compute('work', work)])\n"
    )
    flow.write_text(body.format(version=1))
    engine.client = Tether(engine.store, folder=folder)
    run = engine.client.start("flow")

    flow.write_text(body.format(version=2))
    edited = load_folder(folder)
    assert edited.source("flow")["root"]["hash"] != run.workflow_source["root"]["hash"]
    engine.runner(registry=edited)
    wait_until(
        lambda: engine.store.get_run_view(run.run_id).error_code == "workflowSourceChanged",  # type: ignore[union-attr]
        what="the run to park for the edited file",
    )
    assert engine.attempts(run.run_id) == []


def test_folder__a_broken_file_raises_workflow_load_error(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('nope')\n")
    with pytest.raises(WorkflowLoadError, match=r"Cannot load workflows from .*broken.py: nope"):
        load_folder(tmp_path)
    assert len(load_folder(tmp_path / "missing")) == 0
    assert isinstance(load_folder(tmp_path / "missing"), Registry)
