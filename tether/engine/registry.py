"""Finding workflows: a folder of Python files, or Workflow objects passed in directly."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tether.engine.graph import Workflow
from tether.errors import InvalidInput, NotFound, TetherError

DEFAULT_FOLDER = "workflows"


class WorkflowLoadError(TetherError):
    """A workflow file could not be loaded."""

    code = "workflow_load_failed"


class Registry:
    """Workflows by name, each with its source identity (a file and its hash, or a builtin)."""

    def __init__(self, workflows: Iterable[Workflow] = ()) -> None:
        self._workflows: dict[str, Workflow] = {}
        self._sources: dict[str, dict[str, Any]] = {}
        for workflow in workflows:
            self.add(workflow)

    def add(self, workflow: Workflow, source: dict[str, Any] | None = None) -> None:
        if not isinstance(workflow, Workflow):
            raise InvalidInput("Only Workflow objects can be registered")
        self._workflows[workflow.name] = workflow
        self._sources[workflow.name] = source or {
            "kind": "builtin",
            "id": workflow.name,
            "revision": workflow.revision,
        }

    def get(self, name: str) -> Workflow:
        workflow = self._workflows.get(name)
        if workflow is None:
            known = ", ".join(sorted(self._workflows)) or "none"
            raise NotFound(f"Unknown workflow {name!r} (known: {known})")
        return workflow

    def names(self) -> list[str]:
        return sorted(self._workflows)

    def digests(self) -> list[str]:
        """The definition digest of every workflow registered: the runs a runner here can execute."""
        return sorted({workflow.digest for workflow in self._workflows.values()})

    def source(self, name: str) -> dict[str, Any]:
        """The workflow's source identity with the sources of its mounted sub-workflows."""
        workflow = self.get(name)
        mounted = []
        for mount in workflow.mounts:
            child = str(mount["workflowName"])
            child_source = self._sources.get(child) or {"kind": "builtin", "id": child, "revision": "1"}
            mounted.append({"mountPath": mount["mountPath"], "workflowName": child, "source": child_source})
        return {"root": self._sources[name], "mounted": mounted}

    def __contains__(self, name: object) -> bool:
        return name in self._workflows

    def __len__(self) -> int:
        return len(self._workflows)


def load_folder(folder: str | Path = DEFAULT_FOLDER, registry: Registry | None = None) -> Registry:
    """Import every ``*.py`` file of ``folder`` and register the Workflow objects it defines.

    A workflow's identity is its definition (name, graph, node specs, the syntax of its
    functions; see ``Workflow.digest``): a run reserved on one definition is executed only by a
    runner that loaded the same one. A runner loads the folder once, when it starts: restart it
    to pick up workflow files added or changed since."""
    registry = Registry() if registry is None else registry
    root = Path(folder)
    if not root.is_dir():
        return registry
    for path in sorted(root.glob("*.py")):
        content = path.read_bytes()
        module_name = f"tether_workflows_{path.stem}_{hashlib.sha256(content).hexdigest()[:12]}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            raise WorkflowLoadError(f"Cannot load workflows from {path}: {error}") from error
        for value in vars(module).values():
            if isinstance(value, Workflow):
                # The file's name, not the path it was reached through, and the workflow's
                # definition digest, not the file's bytes: the same definition loaded through
                # ``flows`` or an absolute path, or with a comment edited, is the same source.
                registry.add(value, {"kind": "file", "path": path.name, "hash": value.digest})
    return registry
