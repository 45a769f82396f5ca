"""Typed workflow input (``Workflow(input_schema=...)``): a JSON Schema or a pydantic model class,
checked when the workflow is built, part of its definition, and checked by every way a run
starts (the client, its asyncio twin, a restart with new input) before anything is written."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.engine.conftest import Engine
from tether import AsyncTether, InvalidInput, Workflow, compute
from tether.engine.graph import Node

ORDER = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "minLength": 1},
        "quantity": {"type": "integer", "minimum": 1},
    },
    "required": ["sku", "quantity"],
    "additionalProperties": False,
}


def seen(ctx: Any) -> Any:
    return {"input": ctx.input}


def typed(schema: Any = ORDER, name: str = "order", nodes: list[Node] | None = None) -> Workflow:
    return Workflow(name, start="take", nodes=nodes or [compute("take", seen)], input_schema=schema)


def footprint(engine: Engine) -> dict[str, int]:
    """Row counts of the tables a start writes."""
    return {
        table: engine.sql(f"SELECT count(*) FROM {table}")[0][0]
        for table in ("runs", "run_queue", "events", "blobs", "workflow_definitions")
    }


# -- building --------------------------------------------------------------------------------
def test_input_schema__is_checked_when_the_workflow_is_built() -> None:
    with pytest.raises(InvalidInput, match="unknown keywords: minLenght"):
        typed({"type": "object", "properties": {"sku": {"type": "string", "minLenght": 1}}})
    with pytest.raises(InvalidInput, match="not valid JSON Schema"):
        typed({"type": "objekt"})
    with pytest.raises(InvalidInput, match="JSON Schema object or a pydantic model class"):
        typed("an order")


def test_input_schema__is_part_of_the_definition_and_its_digest() -> None:
    plain = Workflow("order", start="take", nodes=[compute("take", seen)])
    assert "inputSchema" not in plain.snapshot()
    assert typed().snapshot()["inputSchema"] == ORDER
    looser = {**ORDER, "required": ["sku"]}
    assert len({plain.digest, typed().digest, typed(looser).digest}) == 3
    assert typed().digest == typed().digest


def test_check_input__names_every_wrong_field() -> None:
    with pytest.raises(InvalidInput) as refused:
        typed().check_input({"sku": "", "quantity": "2", "colour": "red"})
    message = str(refused.value)
    assert message.startswith("Input of workflow order does not match its input schema: ")
    for problem in ("$.sku: shorter than 1 characters", "$.quantity: expected integer, got str"):
        assert problem in message
    assert "$.colour: not allowed" in message
    with pytest.raises(InvalidInput, match=r"\(no input was given\): \$: expected object"):
        typed().check_input(None)
    assert typed().check_input({"sku": "A-1", "quantity": 2}) == {"sku": "A-1", "quantity": 2}


# -- starting --------------------------------------------------------------------------------
def test_start__a_wrong_input_is_refused_naming_the_field_and_writes_nothing(engine: Engine) -> None:
    engine.register(typed())
    engine.client.start("order", {"sku": "A-1", "quantity": 1}, run_id="first")
    before = footprint(engine)
    with pytest.raises(InvalidInput, match=r"\$\.quantity: less than 1"):
        engine.client.start("order", {"sku": "A-1", "quantity": 0}, run_id="second")
    with pytest.raises(InvalidInput, match=r"\$\.quantity: required"):
        engine.client.start("order", {"sku": "A-1"})
    assert footprint(engine) == before
    assert [r.run_id for r in engine.client.runs()] == ["first"]


def test_start__an_accepted_input_reaches_the_step(engine: Engine) -> None:
    engine.register(typed())
    engine.runner()
    run = engine.client.start("order", {"sku": "A-1", "quantity": 3})
    assert engine.wait(run.run_id).output == {"input": {"sku": "A-1", "quantity": 3}}


def test_start__the_async_client_refuses_a_wrong_input_before_writing(engine: Engine) -> None:
    engine.register(typed())
    before = footprint(engine)

    async def main() -> str:
        async with AsyncTether(engine.client) as client:
            with pytest.raises(InvalidInput, match=r"\$\.sku: expected string, got int"):
                await client.start("order", {"sku": 7, "quantity": 1})
            assert footprint(engine) == before
            return (await client.start("order", {"sku": "B-2", "quantity": 1})).run_id

    started = engine.store.get_run(asyncio.run(main()))
    assert started is not None and started.input == {"sku": "B-2", "quantity": 1}


def test_restart__new_input_is_checked_too(engine: Engine) -> None:
    engine.register(typed())
    engine.runner()
    run = engine.client.start("order", {"sku": "A-1", "quantity": 1})
    engine.wait(run.run_id)
    before = footprint(engine)
    with pytest.raises(InvalidInput, match=r"\$\.quantity: less than 1"):
        engine.client.restart(run.run_id, input={"sku": "A-1", "quantity": 0})
    assert footprint(engine) == before
    again = engine.client.restart(run.run_id, input={"sku": "A-1", "quantity": 5})
    assert engine.wait(again.run_id).output == {"input": {"sku": "A-1", "quantity": 5}}


# -- pydantic --------------------------------------------------------------------------------
def test_pydantic_model__its_validated_dump_is_the_input_steps_get(engine: Engine) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Order(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        sku: str = pydantic.Field(min_length=1)
        quantity: int = 1
        gift: bool = False

        @pydantic.field_validator("sku")  # type: ignore[misc]
        @classmethod
        def upper_case(cls, value: str) -> str:
            if value != value.upper():
                raise ValueError("use capitals")
            return value

    workflow = typed(Order)
    assert workflow.input_model is Order
    assert workflow.snapshot()["inputSchema"] == Order.model_json_schema()
    assert workflow.snapshot()["inputModel"].startswith("test_pydantic_model__")
    engine.register(workflow)
    before = footprint(engine)
    # The schema names the field; so do the model's own validators.
    with pytest.raises(InvalidInput, match=r"\$\.quantity: expected integer, got str"):
        engine.client.start("order", {"sku": "A-1", "quantity": "two"})
    with pytest.raises(InvalidInput, match=r"\$\.sku: Value error, use capitals"):
        engine.client.start("order", {"sku": "a-1"})
    assert footprint(engine) == before
    engine.runner()
    run = engine.client.start("order", {"sku": "A-1"})
    stored = {"sku": "A-1", "quantity": 1, "gift": False}
    record = engine.store.get_run(run.run_id)
    assert record is not None and record.input == stored
    assert engine.wait(run.run_id).output == {"input": stored}
    # The same call again adopts the run: the stored input is what the model dumps each time.
    assert engine.client.start("order", {"sku": "A-1"}, run_id=run.run_id).adopted
