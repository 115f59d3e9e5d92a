"""The kernels' structure rules (docs/design.md, "How the kernels are put together"), read from the
source: short jit signatures, short positional calls, and no kernel file reaching into another."""

import ast
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
MAX_CONSTEXPRS = 12        # per @triton.jit function
MAX_POSITIONAL = 11        # per call of a jit function from jit code
KERNEL_FILES = sorted(p for p in KERNELS.glob("*.py") if "@triton.jit" in p.read_text())


def _is_jit(fn: ast.FunctionDef) -> bool:
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


def _constexprs(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.args if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)]


def jit_functions():
    for path in KERNEL_FILES:
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and _is_jit(node):
                yield path.name, node


def test_kernel_files_are_found():
    names = {p.name for p in KERNEL_FILES}
    assert {"tile_ops.py", "flash_kernel.py", "varlen_kernel.py", "decode_kernel.py", "backward_kernel.py"} <= names


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: p.name)
def test_no_jit_function_takes_more_than_a_dozen_constexprs(path):
    for name, fn in jit_functions():
        if name == path.name:
            assert len(_constexprs(fn)) <= MAX_CONSTEXPRS, (fn.name, _constexprs(fn))


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: p.name)
def test_jit_calls_pass_few_positional_arguments(path):
    jit_names = {fn.name for _, fn in jit_functions()} | {"attend_tiles", "normalise_rows"}
    for name, fn in jit_functions():
        if name != path.name:
            continue
        for call in ast.walk(fn):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in jit_names:
                assert len(call.args) <= MAX_POSITIONAL, (fn.name, call.func.id, len(call.args))


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: p.name)
def test_no_kernel_file_imports_another(path):
    """Jit pieces come from tile_ops; a kernel file imports no other kernel file."""
    others = {p.stem for p in KERNEL_FILES} - {path.stem, "tile_ops"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.module.split(".")[-1] not in others, (path.name, node.module)


def test_the_design_quotes_bounds_the_code_keeps():
    """docs/design.md quotes the most constexprs of any jit function and the longest positional
    call: the code stays within them."""
    import re

    text = " ".join((KERNELS.parent / "docs" / "design.md").read_text().split())
    quoted_constexprs = int(re.search(r"takes more than (\d+) constexprs", text).group(1))
    quoted_positional = int(re.search(r"passes more than (\d+) positional arguments", text).group(1))
    jit_names = {fn.name for _, fn in jit_functions()}
    most = max(len(_constexprs(fn)) for _, fn in jit_functions())
    longest = max(len(c.args) for _, fn in jit_functions() for c in ast.walk(fn)
                  if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in jit_names)
    assert most <= quoted_constexprs <= MAX_CONSTEXPRS and longest <= quoted_positional <= MAX_POSITIONAL
