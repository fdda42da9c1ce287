"""Imports between jaxform's modules run one way: no circle, checked over the import graph.

Every module under jaxform/ is parsed with `ast` (nothing is imported); each import of a jaxform
module, at module level or inside a function, is an edge. Imports under `if TYPE_CHECKING:` are
left out: they never run (annotations only). A strongly connected component of more than one
module is a circle. A function-level import of a jaxform module is only for an optional
dependency; one that hides a circle is still an edge here, so moving an import into a function
does not break a circle.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxform"

def module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def package_modules(package: pathlib.Path = PACKAGE) -> dict[str, pathlib.Path]:
    return {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, module level and inside functions, except under TYPE_CHECKING."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _owner(name: str, modules) -> str | None:
    """The innermost jaxform module a dotted name lies in (a module, or an attribute of one)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    graph = {}
    for mod, path in modules.items():
        deps = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                if node.level:
                    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from pkg import name`: the submodule pkg.name if there is one, else pkg itself
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            deps.update(o for o in (_owner(n, modules) for n in names if n.split(".")[0] == "jaxform") if o)
        deps.discard(mod)
        graph[mod] = deps
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop(); on.discard(w); comp.add(w)
                    if w == v:
                        break
                out.append(comp)
    return out


def circles(graph) -> list[set[str]]:
    return [c for c in strongly_connected(graph) if len(c) > 1]


def test_graph_sees_module_and_function_level_imports():
    """Not vacuous: the graph has the package's known edges, of both kinds."""
    g = import_graph(package_modules())
    assert "jaxform._jax" in g["jaxform.ir.graph"]                      # from .. import _jax
    assert "jaxform.ir.printing" in g["jaxform.ir.graph"]               # from .printing import format_graph
    assert "jaxform.ir.graph" not in g["jaxform.ir.identity"]           # only under TYPE_CHECKING
    assert "jaxform.passes.recompute" in g["jaxform.passes.remat_program"]  # inside a function
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_circle():
    found = circles(import_graph(package_modules()))
    outside = [sorted(c) for c in found]
    assert not outside, f"import circles between jaxform modules: {outside}"
    assert len(found) <= 1, f"the planner's circle split in several: {[sorted(c) for c in found]}"


# Modules that import jaxform modules inside functions today. The rule is module-level imports (a function-level
# one only for an optional dependency such as PyTensor); these are left to their owners. The set may only shrink.
KNOWN_FUNCTION_LEVEL = {
    "jaxform.cli",                    # lazy imports: `jaxform --help` starts without tracing machinery
}


def function_level(modules: dict[str, pathlib.Path]) -> set[str]:
    out = set()
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in _imports(fn):
                    if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("jaxform")) \
                            or isinstance(node, ast.Import) and any(a.name.startswith("jaxform") for a in node.names):
                        out.add(mod)
    return out


def test_function_level_imports_of_jaxform_modules():
    found = function_level(package_modules())
    assert found <= KNOWN_FUNCTION_LEVEL, f"import jaxform modules at module level: {sorted(found - KNOWN_FUNCTION_LEVEL)}"


def test_benchmarks_have_no_import_circle():
    """benchmarks/ is not a package but its scripts import each other by name."""
    bench = ROOT / "benchmarks"
    modules = {p.stem: p for p in sorted(bench.glob("*.py"))}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            deps.update(t.split(".")[0] for t in targets if not getattr(node, "level", 0))
        graph[name] = {d for d in deps if d in modules and d != name}
    assert not [sorted(c) for c in circles(graph)]
