"""Dependencies point one way, and this test says so.

It reads every import of every module (module level, inside functions and under
``TYPE_CHECKING`` alike: an import hidden in a function is still a dependency)
and fails on

- a cycle between modules (a package's ``__init__`` counts as a module: a
  submodule that imports a name back from its own package closes a cycle);
- an import against the layer order ``crowdmix`` → ``aggregator``, ``shuffler``,
  ``client`` → ``core`` → ``protos`` (``shuffler`` and ``aggregator`` never import
  each other nor the app SDK ``client``; nothing below ``crowdmix`` imports the
  command line);
- a third-party import inside a function whose package is not in
  ``LAZY_FOR_EXTRAS``: lazy imports exist only so that a module loads without an
  optional extra, and this is the one place that names them.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from crowdmix.cli import EXTRA_FOR

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("protos", "core", "client", "shuffler", "aggregator", "crowdmix")
# A module may import its own layer and the layers listed for it. The daemons share
# the core with the app SDK and never import the SDK itself.
MAY_IMPORT = {
    "protos": set(),
    "core": {"protos"},
    "client": {"core", "protos"},
    "shuffler": {"core", "protos"},
    "aggregator": {"core", "protos"},
    "crowdmix": {"aggregator", "shuffler", "client", "core", "protos"},
}
# Third-party packages that may be imported inside a function: those of the
# optional extras, named once, in crowdmix.cli.EXTRA_FOR (a lazy import exists
# only so that a module loads without an extra: `import client` loads no
# grpc/numpy/redis, `crowdmix --help` no daemon).
LAZY_FOR_EXTRAS = set(EXTRA_FOR)


def _modules() -> dict[str, Path]:
    """Every module by its installed name: ``crowdmix.<folder>...`` for the component
    folders (crowdmix/<folder> links to each), ``crowdmix...`` for the command line."""
    found = {}
    for top in TOP_LEVEL:
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            if top == "crowdmix" and len(parts) > 1 and parts[1] in TOP_LEVEL:
                continue  # the link to a component folder, walked under its own name
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join(parts)
            found[name if top == "crowdmix" else f"crowdmix.{name}"] = path
    return found


def _layer(module: str) -> str:
    """The folder a module lives in: crowdmix.core.params -> client, crowdmix.cli -> crowdmix."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in TOP_LEVEL else parts[0]


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> list[tuple[str, bool, ast.stmt]]:
    """(imported name, inside a function?, node) for every import in the module; each
    module is parsed once for all the tests here."""
    key = (module, path)
    if key not in _IMPORTS:
        _IMPORTS[key] = list(_read_imports(module, path))
    return _IMPORTS[key]


_IMPORTS: dict[tuple[str, Path], list[tuple[str, bool, ast.stmt]]] = {}


def _read_imports(module: str, path: Path) -> Iterator[tuple[str, bool, ast.stmt]]:
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    in_function: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            in_function.update(id(n) for n in ast.walk(fn))
    for node in ast.walk(tree):
        lazy = id(node) in in_function
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, lazy, node
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                # `from pkg import sub` depends on pkg.sub when sub is a module
                full = f"{base}.{alias.name}"
                yield (full if full in MODULES else base), lazy, node


def _graph() -> dict[str, set[str]]:
    if _GRAPH:
        return {m: set(targets) for m, targets in _GRAPH.items()}
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for name, _, _ in _imports(module, path):
            target = _resolve(name)
            if target is not None and target != module:
                edges[module].add(target)
    _GRAPH.update(edges)
    return _graph()


_GRAPH: dict[str, set[str]] = {}  # the import graph, built once (each caller gets a copy)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
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
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_there_are_modules_to_check() -> None:
    assert len(MODULES) > 50
    assert "crowdmix.aggregator.accounting.amplification" in MODULES


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_walker_finds_a_cycle_hidden_in_a_function() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]


def test_the_daemons_never_import_the_app_sdk() -> None:
    """Said on its own: the rule the shared core exists for."""
    wrong = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        if _layer(module) in ("shuffler", "aggregator", "core")
        for target in targets
        if _layer(target) == "client"
    ]
    assert wrong == []


def test_imports_follow_the_layer_order() -> None:
    wrong = []
    for module, targets in _graph().items():
        layer = _layer(module)
        for target in targets:
            other = _layer(target)
            if other != layer and other not in MAY_IMPORT[layer]:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_lazy_imports_only_for_optional_extras() -> None:
    stdlib = set(sys.stdlib_module_names)
    wrong = []
    for module, path in MODULES.items():
        for name, lazy, node in _imports(module, path):
            top = name.split(".")[0]
            if not lazy or top in stdlib or top == "crowdmix" or top == "__future__":
                continue
            if top not in LAZY_FOR_EXTRAS:
                wrong.append(f"{module}:{node.lineno} imports {name} in a function")
    assert wrong == []


@pytest.mark.slow  # heavy: the full check runs it, scripts/check --fast does not
def test_privacy_and_plan_commands_load_no_daemon() -> None:
    """`crowdmix privacy ...` and `crowdmix plan` are analyst tools: they load the
    accounting math, never the daemon, its store or gRPC."""
    import subprocess

    code = (
        "import contextlib, io, sys\n"
        "from crowdmix.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['privacy', 'amplify', '--epsilon0', '2', '--n', '10000',"
        " '--delta', '1e-6']) == 0\n"
        "    assert main(['plan', '--epsilon', '1', '--n', '1000000', '--candidates', '50']) == 0\n"
        "bad = sorted(m for m in sys.modules if (m + '.').startswith(("
        "'crowdmix.aggregator.daemon.', 'crowdmix.aggregator.store.', 'crowdmix.shuffler.',"
        " 'grpc.', 'redis.')))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
