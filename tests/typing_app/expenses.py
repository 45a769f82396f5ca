"""A small typed application over Tether's public API; the suite checks it with ``mypy --strict``."""

from __future__ import annotations

from tether import Context, RunRecord, RunResult, Tether, TetherError, Workflow, compute, decision
from tether.values import Json


def check(ctx: Context) -> Json:
    amount = ctx.input["amount"] if isinstance(ctx.input, dict) else 0
    return {"amount": amount, "small": isinstance(amount, int) and amount < 100}


expenses = Workflow(
    "expenses",
    start="check",
    nodes=[
        compute("check", check),
        decision("approve", "Pay this expense?", options=["approve", "reject"]),
    ],
    edges={"check": "approve"},
)


def submit_expense(client: Tether, expense_id: str, amount: int) -> str:
    try:
        run: RunRecord = client.start(expenses, {"amount": amount}, run_id=expense_id)
    except TetherError as error:
        return f"refused: {error.message}"
    return run.run_id


def outcome(client: Tether, run_id: str) -> str | None:
    result: RunResult = client.result(run_id)
    return result.error_message if result.finished else None
