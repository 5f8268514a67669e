"""The layering holds: each layer imports only the layers below it, and no module imports itself in a loop.

import-linter cannot check this layout any more: grimp only walks top-level packages, and the product's folders
(``training/``, ``serving/``, ``feature_store/``) install as ``fedfraud.*`` subpackages through ``setup.py``. So this
test walks every import itself, function-level imports included (they hide arrows otherwise); imports under
``if TYPE_CHECKING:`` are skipped, as import-linter's ``exclude_type_checking_imports`` did.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Folder of each top-level name under the ``fedfraud`` namespace (setup.py's package map).
FOLDERS = {"fedfraud": ROOT / "fedfraud", "fedfraud.training": ROOT / "training",
           "fedfraud.serving": ROOT / "serving", "fedfraud.feature_store": ROOT / "feature_store",
           "fedfraud.core": ROOT / "core", "fedfraud.config": ROOT / "config"}

#: Top to bottom. A module may import from its own layer's package and from any lower layer. Names in one layer
#: are independent siblings: they do not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("fedfraud.cli",),
    ("fedfraud.demo",),
    ("fedfraud.bench", "fedfraud.report", "fedfraud.doctor"),
    ("fedfraud.console",),  # the analyst's console (issue 40): its bench sits above it
    ("fedfraud.config",),
    ("fedfraud.serving",),
    ("fedfraud.training",),
    ("fedfraud.feature_store",),
    ("fedfraud.core.logs", "fedfraud.core.net", "fedfraud.core.tcpproxy", "fedfraud.core.credentials",
     "fedfraud.core.pki"),
    ("fedfraud.core.errors", "fedfraud.core.retry"),
]

#: Allowed exceptions, each with its reason.
IGNORED = {
    # the Serve deployment is an entry point like the CLI: it loads the one typed config for its replicas
    ("fedfraud.serving.app", "fedfraud.config"),
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for prefix, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((prefix, *parts))] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path) -> set[str]:
    """The product modules ``name`` imports, resolved to the longest module that exists."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets.update(f"{base}.{a.name}" for a in node.names)
            targets.add(base)
    resolved = set()
    for target in targets:
        parts = target.split(".")
        for k in range(len(parts), 0, -1):
            candidate = ".".join(parts[:k])
            if candidate in MODULES:
                resolved.add(candidate)
                break
    resolved.discard(name)
    return resolved


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer_of(module: str) -> tuple[int, str] | None:
    for index, layer in enumerate(LAYERS):
        for member in layer:
            if module == member or module.startswith(member + "."):
                return index, member
    return None


def test_every_module_is_found_under_the_namespace() -> None:
    for must in ("fedfraud.cli.app", "fedfraud.serving.app", "fedfraud.training.registry",
                 "fedfraud.feature_store.schema"):
        assert must in MODULES
    assert len(MODULES) > 150


def test_no_bare_product_import_outside_the_namespace() -> None:
    bare = {"training", "serving", "feature_store", "core", "config"}
    offenders = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in bare:
                offenders.append(f"{name}: from {node.module}")
            elif isinstance(node, ast.Import):
                offenders += [f"{name}: import {a.name}" for a in node.names if a.name.split(".")[0] in bare]
    assert not offenders, offenders


def test_each_layer_imports_only_the_layers_below_it() -> None:
    violations = []
    for source, targets in GRAPH.items():
        src = _layer_of(source)
        if src is None:
            continue
        for target in targets:
            dst = _layer_of(target)
            if dst is None or (source, target) in IGNORED:
                continue
            upward = dst[0] < src[0]
            sibling = dst[0] == src[0] and dst[1] != src[1]
            if upward or sibling:
                violations.append(f"{source} -> {target}")
    assert not violations, "\n".join(sorted(violations))


def test_no_import_cycles_between_modules() -> None:
    """Tarjan's strongly connected components: any component with more than one module is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            # a package's __init__ re-exporting nothing is not a cycle with its children
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_layers_cover_the_product_packages() -> None:
    """A new top-level module under fedfraud/ or core/ must be placed in a layer, or it escapes the contract."""
    unplaced = defaultdict(list)
    for name in MODULES:
        if _layer_of(name) is None and name not in ("fedfraud", "fedfraud.core"):
            unplaced[name.split(".")[1]].append(name)
    assert set(unplaced) <= {"__main__"}, dict(unplaced)
