"""claim_next walks the partial index of claimable runs, so finished runs never slow it down."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether import open_store


@pytest.mark.parametrize(
    ("query", "index"),
    [("run_claim_next", "run_queue_claimable"), ("run_claim_next_global", "run_queue_claimable_all")],
)
# A runner names the definitions it loaded (a JSON list of digests); other callers name none.
@pytest.mark.parametrize("digests", [None, '["' + "ab" * 32 + '"]'])
def test_claim_next_query__uses_the_claimable_index(
    tmp_path: Path, query: str, index: str, digests: str | None
) -> None:
    store = open_store(f"sqlite:///{tmp_path}/plan.db")
    params = {
        "project_id": store.project_id,
        "now": 0,
        "runner_id": "host-x",
        "exclude": None,
        "digests": digests,
    }
    with store.db._connection() as connection:  # type: ignore[attr-defined]
        (statement,) = store.db.queries[query]
        plan = connection.execute("EXPLAIN QUERY PLAN " + statement, params).fetchall()
    details = " | ".join(str(row[3]) for row in plan)
    assert f"USING INDEX {index}" in details or f"USING COVERING INDEX {index}" in details, details
    assert "SCAN q" not in details.replace(f"SCAN q USING INDEX {index}", "")
    assert "USE TEMP B-TREE FOR ORDER BY" not in details, details
    store.close()
