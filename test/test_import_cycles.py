"""No import cycles inside ``flashrt_ros``, and no library module imports the benchmarks.

Why: a cycle means two modules can only be understood (and imported) together; the one the
package had (the policy registry imported the LeRobot loader, whose modules imported the policy
contract back from the registry) made the policy code hard to read and to split. Every import
counts, also one inside a function or under ``TYPE_CHECKING``: a lazy import hides a cycle from
the interpreter, not from a reader. The graph is read from the source with ``ast``, nothing is
imported.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flashrt_ros"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_names(path: Path, name: str) -> set[str]:
    """Every dotted name ``path`` imports (``from a import b`` gives ``a`` and ``a.b``)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:                       # relative: resolve against this module's package
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            out.add(source)
            out.update(f"{source}.{alias.name}" for alias in node.names)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports (a name that is not a module maps to its module)."""
    modules = library_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in imported_names(path, name):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_and_aliased_imports():
    graph = import_graph()
    assert "flashrt_ros.models.lerobot" in graph["flashrt_ros.models.policy_factory"]
    assert "flashrt_ros.runtime.arena" in graph["flashrt_ros.runtime.store"]
    assert "flashrt_ros.engine.policy_engine" in graph["flashrt_ros.engine.factory"]   # imported in a function


def test_flashrt_ros_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_no_library_module_imports_the_benchmarks():
    users = [name for name, path in library_modules().items()
             if any(n == "benchmarks" or n.startswith("benchmarks.") for n in imported_names(path, name))]
    assert users == []
