"""Reference pages generated from the code: the store API and the state machines.

``python -m tether.docgen`` rewrites them; tests fail when a page is stale.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from tether.store import Store
from tether.store.states import QUEUE_TRANSITIONS, RUN_TRANSITIONS, mermaid

DOCS = Path(__file__).resolve().parent.parent / "docs"


def store_reference() -> str:
    lines = [
        "# Store reference",
        "",
        "Generated from the code by `python -m tether.docgen`; do not edit by hand.",
        "",
        '`tether.open_store(url, *, project="default")` returns a `Store`. Every method below is one',
        "transaction (or joins the caller's `store.transaction()`); a `False` or `None` return means",
        "nothing was written; refusals raise `tether.errors.TetherError` subclasses.",
        "",
    ]
    for name, member in sorted(inspect.getmembers(Store, inspect.isfunction)):
        if name.startswith("_"):
            continue
        signature = str(inspect.signature(member)).replace("(self, ", "(").replace("(self)", "()")
        doc = inspect.getdoc(member) or "(no description)"
        lines += [f"## `{name}{signature}`", "", doc, ""]
    return "\n".join(lines)


def state_machine() -> str:
    return "\n".join(
        [
            "# State machines",
            "",
            "Generated from `tether/store/states.py` by `python -m tether.docgen`; do not edit by hand.",
            "Every status write takes its allowed sources from these tables.",
            "",
            "## Queue status (who may execute the run now)",
            "",
            "```mermaid",
            mermaid(QUEUE_TRANSITIONS),
            "```",
            "",
            "## Durable run status (what the workflow reached)",
            "",
            "```mermaid",
            mermaid(RUN_TRANSITIONS),
            "```",
            "",
        ]
    )


PAGES = {"store.md": store_reference, "state-machine.md": state_machine}


def main() -> None:
    for name, render in PAGES.items():
        (DOCS / name).write_text(render(), encoding="utf-8")


if __name__ == "__main__":
    main()
