"""Finding workflows: a folder of Python files, an importable module, or Workflow objects passed
in directly. All three give a workflow the same identity: its definition digest does not depend on
how its module was reached (see ``Workflow.digest``)."""

from __future__ import annotations

import hashlib
import importlib
import keyword
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from tether.engine.graph import Workflow
from tether.errors import Conflict, InvalidInput, NotFound, WorkflowLoadError

__all__ = ["DEFAULT_FOLDER", "Registry", "WorkflowLoadError", "load_folder", "load_module"]

DEFAULT_FOLDER = "workflows"
#: The workflow folders imported as packages in this process.
_FOLDERS: set[str] = set()


class Registry:
    """Workflows by name, each with its source identity (a file and its hash, or a builtin)."""

    def __init__(self, workflows: Iterable[Workflow] = ()) -> None:
        self._workflows: dict[str, Workflow] = {}
        self._sources: dict[str, dict[str, Any]] = {}
        for workflow in workflows:
            self.add(workflow)

    def add(self, workflow: Workflow, source: dict[str, Any] | None = None, *, replace: bool = False) -> None:
        """Register a workflow. Registering the same definition again is a no-op; a different
        definition under a name already registered is refused (``Conflict``) unless ``replace``."""
        if not isinstance(workflow, Workflow):
            raise InvalidInput(f"Only Workflow objects can be registered, not {type(workflow).__name__}")
        known = self._workflows.get(workflow.name)
        if known is not None and known.digest != workflow.digest and not replace:
            raise Conflict(
                f"A different definition of workflow {workflow.name} is already registered "
                f"({known.digest[:19]}..., this one {workflow.digest[:19]}...); "
                "pass replace=True to use the new one"
            )
        if known is not None and known.digest == workflow.digest and source is None:
            return
        self._workflows[workflow.name] = workflow
        self._sources[workflow.name] = source or {
            "kind": "builtin",
            "id": workflow.name,
            "revision": workflow.revision,
        }
        # A worker that loaded a workflow runs the child runs its child nodes start too.
        for node in workflow.nodes.values():
            if node.kind == "child" and node.workflow is not None and node.workflow.name not in self:
                self.add(node.workflow)

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
    """Import the ``*.py`` files of ``folder`` as the modules of a package named after the folder
    (its parent goes on ``sys.path``), so relative imports between them and imports of the
    application work, and register the Workflow objects each defines. Each file is imported once
    (again only when its content changed); files starting with ``_`` are helpers, imported only
    by the files that use them. Two files defining workflows of the same name are refused.

    A workflow's identity is its definition (name, graph, node specs, the syntax of its
    functions; see ``Workflow.digest``): a run reserved on one definition is executed only by a
    runner that loaded the same one. A runner loads the folder once, when it starts: restart it
    to pick up workflow files added or changed since."""
    registry = Registry() if registry is None else registry
    root = Path(folder).resolve()
    if not root.is_dir():
        raise NotFound(f"Workflow folder not found: {root} (name a folder of workflow files)")
    defined: dict[str, Path] = {}
    for path in sorted(root.glob("*.py")):
        if path.name.startswith("_"):
            continue
        module = _import_file(root, path)
        for workflow in _workflows_of(module):
            other = defined.get(workflow.name)
            if other is not None:
                raise WorkflowLoadError(
                    f"Workflow {workflow.name} is defined twice: in {other} and in {path}"
                )
            defined[workflow.name] = path
            # The file's name, not the path it was reached through, and the workflow's
            # definition digest, not the file's bytes: the same definition loaded through
            # ``flows`` or an absolute path, or with a comment edited, is the same source.
            registry.add(workflow, {"kind": "file", "path": path.name, "hash": workflow.digest}, replace=True)
    return registry


def load_module(name: str, registry: Registry | None = None) -> Registry:
    """Import the module ``name`` (``myapp.workflows``) and register the Workflow objects it
    defines or imports."""
    registry = Registry() if registry is None else registry
    if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
        raise InvalidInput(f"Invalid module name {name!r}: give a dotted name such as myapp.workflows")
    try:
        module = importlib.import_module(name)
    except Exception as error:
        raise WorkflowLoadError(f"Cannot import workflows from module {name}: {error}") from error
    found = [value for value in vars(module).values() if isinstance(value, Workflow)]
    file_name = Path(str(getattr(module, "__file__", None) or name)).name
    for workflow in found:
        # The same source identity as the folder gives the file: its name and the digest.
        registry.add(workflow, {"kind": "file", "path": file_name, "hash": workflow.digest})
    return registry


def _workflows_of(module: ModuleType) -> list[Workflow]:
    """The workflows a folder file defines: those built in it, not imported from a sibling."""
    seen: list[Workflow] = []
    for value in vars(module).values():
        built_here = isinstance(value, Workflow) and value.defined_in in (module.__name__, None)
        if built_here and not any(value is known for known in seen):
            seen.append(value)
    return seen


def _import_file(root: Path, path: Path) -> ModuleType:
    package = root.name
    if not package.isidentifier() or keyword.iskeyword(package):
        raise WorkflowLoadError(
            f"Cannot load workflows from {root}: the folder's name must be a Python identifier "
            "(its files are imported as the modules of a package of that name)"
        )
    if not path.stem.isidentifier() or keyword.iskeyword(path.stem):
        raise WorkflowLoadError(f"Cannot load workflows from {path}: the file name is not a module name")
    loaded = sys.modules.get(package)
    folders = {str(Path(p).resolve()) for p in getattr(loaded, "__path__", [])}
    if loaded is not None and (not folders or not folders <= _FOLDERS | {str(root)}):
        raise WorkflowLoadError(
            f"Cannot load workflows from {root}: a module named {package} is imported already "
            f"({getattr(loaded, '__file__', None) or sorted(folders)}); rename the folder"
        )
    name = f"{package}.{path.stem}"
    current = sys.modules.get(name)
    if current is not None and Path(str(current.__file__)).resolve() != path:
        # Another workflow folder of the same name was loaded before (another project, a test):
        # forget its modules, the package too (a namespace package lists every such folder).
        for stale in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[stale]
    parent = str(root.parent)
    # First on the path, so that the package resolves to this folder before any other folder of
    # the same name loaded earlier.
    if parent in sys.path:
        sys.path.remove(parent)
    sys.path.insert(0, parent)
    _FOLDERS.add(str(root))
    content = hashlib.sha256(path.read_bytes()).hexdigest()
    current = sys.modules.get(name)
    if current is not None and getattr(current, "__tether_content__", content) != content:
        del sys.modules[name]
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(name)
    except Exception as error:
        raise WorkflowLoadError(f"Cannot load workflows from {path}: {error}") from error
    if Path(str(module.__file__)).resolve() != path:
        raise WorkflowLoadError(
            f"Cannot load workflows from {path}: the module {name} is found elsewhere first "
            f"({module.__file__}); rename the folder"
        )
    module.__tether_content__ = content  # type: ignore[attr-defined]
    return module
