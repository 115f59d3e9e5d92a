"""The project's module structure: no import circle, imports pointing down the layers, modules of
one job (no module outside kernels/ over ~400 lines).

The import graph is read from the source (ast), not by importing: every `import` / `from ...
import` of one project module by another, at module level or inside a function (a lazy import
is still a circle: each module needs the other to be complete), except under `if TYPE_CHECKING:`.
`from pkg import name` is an edge to pkg.name where that is a module, else to pkg.
"""

import ast
import functools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "instrumentation", "app", "benchmarks")
# the layers of docs/design.md: a module imports only from its own layer or the ones below
LAYER = {"kernels": 0, "instrumentation": 1, "app": 2, "benchmarks": 2}
# circles whose modules other work owns right now, each to be broken there (by name, with why)
KNOWN_CIRCLES: set = set()     # a circle found later is listed here, with why, until it is broken
MAX_LINES = 400
LINE_SCOPE = ("instrumentation", "app", "benchmarks", "scripts")
# modules over MAX_LINES whose owners are changing them now (by name, with why); each is split
# by its owner, and comes off this list then
OVER_LIMIT: dict[str, str] = {}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


@functools.lru_cache(maxsize=None)
def _tree(path: pathlib.Path):
    return ast.parse(path.read_text())


def _type_checking_only(tree) -> set:
    """The import nodes under `if TYPE_CHECKING:` (never executed)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def _imports(name: str, path: pathlib.Path, modules: dict) -> set:
    tree = _tree(path)
    skip = _type_checking_only(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    out.add(f"{source}.{alias.name}")
                elif source in modules:
                    out.add(source)
    out.discard(name)
    return out


@functools.lru_cache(maxsize=1)
def import_graph() -> dict:
    """{module: the project modules it imports}, for every module of PACKAGES (read once)."""
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def circles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_circle_finder_finds_lazy_and_long_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert sorted(map(sorted, circles(graph))) == [["a", "b", "c"], ["d", "e"]]
    tree_free = {"x": {"y"}, "y": {"z"}, "z": set()}
    assert circles(tree_free) == []


def test_graph_reads_relative_lazy_and_submodule_imports():
    graph = import_graph()
    assert "instrumentation.hf_mask" in graph["instrumentation.hf_compiled"]     # lazy, relative
    assert "benchmarks.attention_impls" in graph["benchmarks.attention"]          # from .x import
    assert "app.sources.named" in graph["app.sources"]                           # a package's __init__


def test_no_import_circle():
    found = [sorted(c) for c in circles(import_graph()) if c not in KNOWN_CIRCLES]
    assert found == [], f"modules that import each other (directly or round a circle): {found}"


def test_known_circles_still_exist():
    # a circle listed above that is gone comes off the list
    assert KNOWN_CIRCLES <= set(circles(import_graph()))


def test_imports_point_down_the_layers():
    graph = import_graph()
    upward = [f"{m} -> {o}" for m, out in graph.items() for o in sorted(out)
              if m.split(".")[0] != o.split(".")[0] and LAYER[o.split(".")[0]] >= LAYER[m.split(".")[0]]]
    assert upward == [], upward
    uses_scripts = [str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*.py")
                    if any(isinstance(n, (ast.Import, ast.ImportFrom)) and
                           ((getattr(n, "module", None) or "").split(".")[0] == "scripts" or
                            any(a.name.split(".")[0] == "scripts" for a in n.names if isinstance(n, ast.Import)))
                           for n in ast.walk(_tree(p)))]
    assert uses_scripts == [], f"nothing imports scripts/: {uses_scripts}"


def test_no_module_outside_kernels_over_400_lines():
    long = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
            for folder in LINE_SCOPE for p in sorted((ROOT / folder).rglob("*.py"))}
    over = {path: n for path, n in long.items() if n > MAX_LINES and path not in OVER_LIMIT}
    assert over == {}, f"modules over {MAX_LINES} lines (split them by job): {over}"
    assert set(OVER_LIMIT) <= set(long), "OVER_LIMIT names a module that does not exist"
