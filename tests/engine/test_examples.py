"""The example workflows run end to end from their folder, and a folder's file identity is what
source-change detection compares."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tether.client import Tether
from tether.engine.registry import WorkflowLoadError, load_folder
from tether.errors import InvalidInput, NotFound

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
    assert source["root"] == {"kind": "file", "path": "pipeline.py", "hash": registry.get("pipeline").digest}
    assert [m["workflowName"] for m in source["mounted"]] == ["fetch"]


def test_example_pipeline__retries_sleeps_and_summarises(examples: Engine) -> None:
    examples.runner()
    run = examples.client.start("pipeline", {"count": 3})
    result = examples.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output["records"] == 3
    assert result.output["total"] == 1 + 4 + 9
    # The records reached the command on its standard input, JSON-encoded.
    records = json.dumps([{"id": n, "value": n * n} for n in (1, 2, 3)])
    expected = subprocess.run(["cksum"], input=records, capture_output=True, text=True, check=True)
    assert result.output["checksum"] == expected.stdout.strip()
    get_attempts = examples.attempts(run.run_id, "fetch/get")
    assert [a.status for a in get_attempts] == ["failed", "completed"]


def test_example_release__publishes_after_approval(
    examples: Engine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TETHER_RELEASES", str(tmp_path / "releases"))
    examples.runner()
    # The release announces to its session (notify nodes): it is started with one.
    run = examples.client.start("release", {"version": "2.0.0"}, session_id="release-desk")
    decision = wait_until(lambda: examples.client.decisions(run.run_id), what="the approval")[0]
    assert decision.request["question"] == "Publish release 2.0.0?"  # type: ignore[index]
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
    # The person sees the question the model drafted (the prompt is a function of the context).
    assert request.payload["prompt"] == "What should this workflow automate?"  # type: ignore[index]
    session.submit(request.request_id, {"answer": "nightly backups"})
    result = examples.wait(run.run_id)
    assert result.status == "done", result.error_message
    notifications = [m.payload for m in session.messages() if m.kind == "notification"]
    assert notifications == [{"text": "The user wants: nightly backups"}]


FLOW = (
    "from tether.engine.graph import Workflow, compute\n"
    "def work(ctx):\n    return {{'version': {version}}}\n"
    "flow = Workflow('flow', start='work', nodes=[compute('work', work)])\n"
)


def test_folder__a_code_edit_leaves_runs_for_a_worker_with_their_definition(
    engine: Engine, tmp_path: Path
) -> None:
    folder = tmp_path / "workflows"
    folder.mkdir()
    flow = folder / "flow.py"
    flow.write_text(FLOW.format(version=1))
    engine.client = Tether(engine.store, folder=folder)
    original = load_folder(folder)
    run = engine.client.start("flow")

    flow.write_text(FLOW.format(version=2))
    edited = load_folder(folder)
    assert edited.get("flow").digest != run.definition_digest
    engine.runner(registry=edited)
    view = engine.store.get_run_view(run.run_id)
    assert view is not None
    note = wait_until(
        lambda: engine.client.waiting_notes([view]).get(run.run_id), what="the run to say why it waits"
    )
    assert note.startswith("no live worker has workflow flow at this definition")
    assert engine.statuses(run.run_id) == ("queued", "queued")
    assert engine.attempts(run.run_id) == [], "the edited definition never ran the run"

    engine.runner(registry=original)
    result = engine.wait(run.run_id)
    assert (result.status, result.output) == ("done", {"version": 1})


def test_folder__comments_and_layout_are_not_part_of_a_definition(tmp_path: Path) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW.format(version=1))
    before = load_folder(tmp_path).get("flow").digest
    flow.write_text("# a new comment\n" + FLOW.format(version=1).replace("(ctx):", "(ctx):  # same") + "\n\n")
    assert load_folder(tmp_path).get("flow").digest == before
    flow.write_text(FLOW.format(version=1).replace("'version'", "'release'"))
    assert load_folder(tmp_path).get("flow").digest != before


def test_folder__the_path_a_folder_is_loaded_through_is_not_part_of_a_definition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "flow.py").write_text(FLOW.format(version=1))
    monkeypatch.chdir(tmp_path)
    relative, absolute = load_folder("flows"), load_folder(tmp_path / "flows")
    assert relative.get("flow").digest == absolute.get("flow").digest
    assert relative.source("flow") == absolute.source("flow")
    assert relative.get("flow").snapshot() == absolute.get("flow").snapshot()


def test_folder__a_broken_file_raises_workflow_load_error(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('nope')\n")
    with pytest.raises(WorkflowLoadError, match=r"Cannot load workflows from .*broken.py: nope"):
        load_folder(tmp_path)
    with pytest.raises(NotFound, match=r"Workflow folder not found: .*missing"):
        load_folder(tmp_path / "missing")


def test_example_order__fans_out_ships_as_a_child_and_waits_for_delivery(examples: Engine) -> None:
    examples.runner()
    run_id = examples.client.start("order", {"order": "A-17", "lines": ["mug", "tea", "card"]}).run_id
    # Packed, shipped by its child run, then parked until the carrier's event comes.
    wait_until(
        lambda: (
            examples.client.view(run_id).run_state_status == "waiting"
            and [c.status for c in examples.client.children(run_id)] == ["done"]
            and any(a.node_id == "delivered" for a in examples.attempts(run_id))
        ),
        what="the order to wait for its delivery event",
    )
    with pytest.raises(InvalidInput, match="signed_by"):
        examples.client.send_event(run_id, "delivered", {"who": "nobody"})  # refused by the schema
    examples.client.send_event(run_id, "delivered", {"signed_by": "R. Diaz"})
    result = examples.wait(run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"order": "A-17", "tracking": "TRK-A-17-3", "signed_by": "R. Diaz"}
    assert [box["box"] for box in result.outputs["pack"]] == ["A-17-mug", "A-17-tea", "A-17-card"]  # type: ignore[union-attr]
    packed = [a.node_id for a in examples.attempts(run_id) if a.node_id.startswith("pack[")]
    assert sorted(packed) == ["pack[0]", "pack[1]", "pack[2]"]  # each line packed once
    [shipped] = examples.client.children(run_id)
    assert examples.client.parent(shipped.run_id).parent_run_id == run_id  # type: ignore[union-attr]


def test_example_research__approves_the_write_then_reviews_the_report(
    examples: Engine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TETHER_REPORTS", str(tmp_path / "reports"))
    examples.runner()
    run_id = examples.client.start("research", {"topic": "durable workflows"}).run_id
    # The model searched, then asked to write its report: a person approves the call first.
    [approval] = wait_until(lambda: examples.client.decisions(run_id), what="the write's approval")
    assert approval.request["toolCall"]["tool"] == "write_report"  # type: ignore[index]
    assert not (tmp_path / "reports").exists()  # nothing written before the approval
    examples.client.answer(approval.decision_id, "approve")
    review = wait_until(
        lambda: [d for d in examples.client.decisions(run_id) if d.node_id == "review"], what="the review"
    )[0]
    report = tmp_path / "reports" / "durable-workflows.md"
    assert review.request["question"] == f"Publish the report at {report}?"  # type: ignore[index]
    assert "[durable workflows: an overview](kb://overview)" in report.read_text()
    examples.client.answer(review.decision_id, "publish")
    result = examples.wait(run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"published": str(report)}
    tools = [m.body.get("name") for m in examples.client.conversation(run_id) if m.role == "tool"]
    assert tools == ["search", "write_report"]
    (written,) = examples.store.effects(run_id=run_id)
    assert written.status == "applied"
