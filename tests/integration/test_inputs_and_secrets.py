"""Typed input and secrets as a user meets them, on both backends: ``tether start`` and ``tether
run`` refuse an input that does not match the workflow's schema (exit 4, the field named, no run
written); a ``shell`` step's ``env_from`` variable reaches the command from a real ``tether
worker``'s environment and its value is nowhere in the database."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.integration.support import Lab
from tests.store.conftest import rows

TYPED = r"""
import sys

import pydantic

from tether.engine.graph import Workflow, compute, shell


class Order(pydantic.BaseModel):
    sku: str = pydantic.Field(min_length=1)
    quantity: int = 1


ORDER = {
    "type": "object",
    "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1}},
    "required": ["sku", "quantity"],
}

def echo(ctx):
    return ctx.input


typed = Workflow("typed", start="take", nodes=[compute("take", echo)], input_schema=ORDER)
modelled = Workflow("modelled", start="take", nodes=[compute("take", echo)], input_schema=Order)

# The command proves it got the token by its digest: its output is stored, the token must not be.
DIGEST = "import hashlib, os; print(hashlib.sha256(os.environ['DEPLOY_TOKEN'].encode()).hexdigest())"
deploy = Workflow(
    "deploy",
    start="push",
    nodes=[shell("push", [sys.executable, "-c", DIGEST], env_from=["DEPLOY_TOKEN"], retries=2)],
)
"""

SECRET = "tok-7c1e9a52-never-stored"


def with_typed(lab: Lab) -> Lab:
    (lab.folder / "typed.py").write_text(TYPED)
    return lab


def runs_count(lab: Lab) -> int:
    return len(rows(lab.client.store, "SELECT run_id FROM runs"))


def test_cli__a_wrong_input_is_refused_naming_the_field_and_no_run_is_written(any_lab: Lab) -> None:
    lab = with_typed(any_lab)
    before = runs_count(lab)
    for command in ("start", "run"):
        result = lab.cli(command, "typed", "--input", '{"sku": "A-1", "quantity": 0}')
        assert result.returncode == 4, result.stderr
        assert result.stderr.startswith("tether: Input of workflow typed does not match its input schema: ")
        assert "$.quantity: less than 1" in result.stderr
        assert "Traceback" not in result.stderr
    missing = lab.cli("start", "typed")
    assert missing.returncode == 4
    assert "(no input was given): $: expected object" in missing.stderr
    assert runs_count(lab) == before == 0


def test_cli__an_accepted_input_reaches_the_step_and_a_model_fills_its_defaults(any_lab: Lab) -> None:
    lab = with_typed(any_lab)
    ran = lab.cli("run", "typed", "--input", '{"sku": "A-1", "quantity": 2}', "--poll-ms", "50")
    assert ran.returncode == 0, ran.stderr
    [typed] = lab.client.runs(workflow="typed")
    assert lab.client.result(typed.run_id).output == {"sku": "A-1", "quantity": 2}
    started = lab.cli("start", "modelled", "--input", '{"sku": "B-2"}', "--run-id", "modelled-1")
    assert started.returncode == 0, started.stderr
    record = lab.client.store.get_run("modelled-1")
    assert record is not None and record.input == {"sku": "B-2", "quantity": 1}
    refused = lab.cli("start", "modelled", "--input", '{"sku": ""}')
    assert refused.returncode == 4 and "$.sku: shorter than 1 characters" in refused.stderr


def stored_bytes(lab: Lab, tmp_path: Path) -> bytes:
    """What the database holds: the SQLite files byte for byte, or on PostgreSQL the stored
    definitions and every blob (outputs, inputs, event bodies)."""
    if lab.url.startswith("sqlite"):
        files = [lab.db, lab.db.with_name(lab.db.name + "-wal")]
        return b"".join(path.read_bytes() for path in files if path.exists())
    definitions = rows(
        lab.client.store,
        "SELECT b.content FROM workflow_definitions d JOIN blobs b ON b.blob_hash = d.definition_hash",
    )
    blobs = rows(lab.client.store, "SELECT content FROM blobs")
    return b"\n".join(bytes(row[0]) for row in [*definitions, *blobs])


def test_worker__env_from_reads_the_worker_environment_and_the_value_is_never_stored(
    any_lab: Lab, tmp_path: Path
) -> None:
    lab = with_typed(any_lab)
    # A worker without the variable: the step fails at once, naming it (no retries spent).
    lacking = lab.start("deploy")
    bare = lab.worker("bare", "--until-idle")
    assert bare.wait(timeout=60) == 0, lab.worker_log("bare")
    failed = lab.wait_finished(lacking)
    assert failed.status == "failed"
    assert "the worker's environment lacks DEPLOY_TOKEN (named in env_from)" in (failed.error_message or "")
    assert [a.status for a in lab.client.store.attempts(lacking)] == ["failed"]

    # A worker with it: the command gets the value.
    run_id = lab.start("deploy")
    keyed = lab.worker("keyed", "--until-idle", env={"DEPLOY_TOKEN": SECRET})
    assert keyed.wait(timeout=60) == 0, lab.worker_log("keyed")
    result = lab.wait_finished(run_id)
    assert result.status == "done", result.error_message
    assert result.output["stdout"].strip() == hashlib.sha256(SECRET.encode()).hexdigest()

    stored = stored_bytes(lab, tmp_path)
    assert b"DEPLOY_TOKEN" in stored, "the definition (with the variable's name) is read"
    assert SECRET.encode() not in stored
    shown = lab.cli("show", run_id, "--json")
    assert shown.returncode == 0 and SECRET not in shown.stdout
    assert json.loads(shown.stdout)
