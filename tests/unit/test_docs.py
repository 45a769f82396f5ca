"""Generated reference pages must match the code they describe."""

from __future__ import annotations

import pytest

from tether.docgen import DOCS, PAGES


@pytest.mark.parametrize("name", sorted(PAGES))
def test_generated_page__matches_the_code(name: str) -> None:
    assert (DOCS / name).read_text(encoding="utf-8") == PAGES[name](), (
        f"docs/{name} is stale: run `python -m tether.docgen`"
    )


def test_state_machine_page__names_every_status_edge() -> None:
    from tether.store.states import QUEUE_TRANSITIONS

    page = (DOCS / "state-machine.md").read_text(encoding="utf-8")
    for source, targets in QUEUE_TRANSITIONS.items():
        for target in targets:
            if source != target:
                assert f"{source.value} --> {target.value}" in page
