"""Every dotted module path the docs and the packages' docstrings and comments name exists.

A name such as `instrumentation.analysis.hbm` or `kernels.flash.launch_attention` is resolved
against the source tree without importing anything: its longest prefix that is a module file
(`x.py` or `x/__init__.py`) must exist, and the next part, if any, must be a name that module
defines at top level, re-exports lazily (its `_LAZY` table or `__all__`) or a submodule.
"""

import ast
import io
import pathlib
import re
import tokenize
from functools import lru_cache

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "instrumentation", "app", "benchmarks")
# a dotted name that starts with one of the packages and is not inside a longer dotted name,
# a path (a/kernels.x) or a word
NAME = re.compile(r"(?<![\w./-])((?:%s)(?:\.[A-Za-z_]\w*)+)" % "|".join(PACKAGES))
# names that match the pattern but are not module paths (JavaScript in a Python string, ...)
NOT_MODULE_PATHS = {
    "app.getAttribute",     # JavaScript: the Streamlit app element in app/presentation.py
    "kernels.backward.X",   # "read ... as kernels.backward.X": a placeholder for any re-export
    "kernels.flash.X",
}
# stale names in files other work owns right now, to be renamed there (file -> names); the test
# skips these and nothing else
PENDING_ELSEWHERE: dict = {}     # file -> stale names its owner is renaming (none now)


def _doc_lines():
    for path in sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            yield path, number, line


def _source_lines():
    """The lines of comments and string literals (docstrings, messages) of the packages."""
    kinds = {tokenize.COMMENT, tokenize.STRING}
    if hasattr(tokenize, "FSTRING_MIDDLE"):
        kinds.add(tokenize.FSTRING_MIDDLE)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            for token in tokens:
                if token.type in kinds:
                    for offset, line in enumerate(token.string.splitlines()):
                        yield path, token.start[0] + offset, line


def _module_file(parts):
    base = ROOT.joinpath(*parts)
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@lru_cache(maxsize=None)
def _defined_names(path):
    """Top-level names of a module: bindings, imports, its lazy table's keys and __all__."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
                        if sub.id in ("_LAZY", "__all__"):
                            for const in ast.walk(node.value):
                                if isinstance(const, ast.Constant) and isinstance(const.value, str):
                                    names.add(const.value)
    return names


def resolves(name):
    """Whether a dotted name is a module of the tree, or a module and a name it defines."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        path = _module_file(parts[:cut])
        if path is not None:
            return cut == len(parts) or parts[cut] in _defined_names(path)
    return False


def named_paths():
    found = {}
    for lines in (_doc_lines(), _source_lines()):
        for path, number, line in lines:
            for match in NAME.finditer(line):
                found.setdefault(match.group(1), []).append(f"{path.relative_to(ROOT)}:{number}")
    return found


def test_resolver_tells_modules_from_stale_names():
    assert resolves("kernels.flash") and resolves("kernels.flash.launch_attention")
    assert resolves("instrumentation.analysis.hbm") and resolves("instrumentation.make_inputs")
    assert resolves("kernels.flash_attention")          # a lazy re-export of the package
    assert not resolves("instrumentation.hbm") and not resolves("kernels.flash.no_such_name")


def test_every_named_module_path_exists():
    stale = {}
    for name, where in named_paths().items():
        where = [w for w in where if name not in PENDING_ELSEWHERE.get(w.rsplit(":", 1)[0], ())]
        if where and name not in NOT_MODULE_PATHS and not resolves(name):
            stale[name] = where
    assert not stale, "names of modules that do not exist:\n" + "\n".join(
        f"  {name}: {', '.join(where)}" for name, where in sorted(stale.items()))
