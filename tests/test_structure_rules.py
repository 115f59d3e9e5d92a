"""One definition for each rule: the interpreter's tile limit and the block-size choices.

The limit (kernels.runtime.INTERPRETER_MAX_TILES) is compared only in kernels/runtime.py, whose
interpreter_tiles_refusal / check_interpreter_tiles every layer calls (one message); the block
sizes are listed once (kernels.sizes.BLOCK_SIZES) and every menu, flag and check imports them.
"""

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "instrumentation", "app", "benchmarks", "scripts")
# duplicates in files other work owns right now (to be moved to the one definition there)
PENDING_ELSEWHERE: set = set()     # files whose duplicate their owner is removing (none now)
# the same five numbers meaning something else: the Memory page's head-dim slider, the Serving
# page's page sizes (tokens)
NOT_BLOCK_SIZES = {"app/views/memory.py", "app/views/serving.py"}


@functools.lru_cache(maxsize=1)
def _sources() -> tuple:
    """((relative path, its ast), ...) of every module of PACKAGES: parsed once per process, through
    the import-structure tests' cache of trees (tests/test_structure_imports._tree)."""
    from tests.test_structure_imports import _tree

    return tuple((path.relative_to(ROOT).as_posix(), _tree(path)) for package in PACKAGES
                 for path in sorted((ROOT / package).rglob("*.py"))
                 if path.relative_to(ROOT).as_posix() not in PENDING_ELSEWHERE)


def test_the_tile_limit_is_compared_in_one_place():
    found = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(
                    isinstance(n, (ast.Name, ast.Attribute)) and getattr(n, "id", getattr(n, "attr", None))
                    == "INTERPRETER_MAX_TILES" for n in ast.walk(node)):
                found.append(f"{rel}:{node.lineno}")
    assert [f for f in found if not f.startswith("kernels/runtime.py:")] == [], found


def test_block_sizes_are_listed_once():
    listed = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) == 5 and all(
                    isinstance(e, ast.Constant) for e in node.elts) and [e.value for e in node.elts] == [16, 32, 64, 128, 256]:
                listed.append(rel)
    assert [rel for rel in listed if rel not in NOT_BLOCK_SIZES] == ["kernels/sizes.py"], listed


@pytest.mark.parametrize("tiles, refused", [(10_000, False), (10_001, True)])
def test_one_message_for_the_tile_limit(tiles, refused):
    from kernels.runtime import INTERPRETER_MAX_TILES, check_interpreter_tiles, interpreter_tiles_refusal

    line = interpreter_tiles_refusal(tiles, "B*H=8, N_q=4096", "run on a GPU")
    assert bool(line) is refused
    if refused:
        assert "\n" not in line and f"{tiles:,}" in line and f"limit {INTERPRETER_MAX_TILES:,}" in line
        with pytest.raises(ValueError, match="too much for the CPU interpreter"):
            check_interpreter_tiles(tiles, "B*H=8, N_q=4096")
