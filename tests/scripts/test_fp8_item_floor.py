"""scripts/fp8_item_floor.py's kernel copies: the FP8 Gluon kernel's tile lists cut where the
producer and both consumers read them, and nothing else changed; a kernel that no longer reads
them there is refused in one line rather than timed uncut."""
import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("fp8_item_floor", ROOT / "scripts" / "fp8_item_floor.py")
floor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(floor)


@pytest.mark.parametrize("tiles", [0, 1, 3])
def test_the_copy_cuts_every_reader_of_the_lists_and_nothing_else(tiles):
    source = (ROOT / "kernels" / "gluon_fp8_kernel.py").read_text()
    cut = floor.clamped_source(source, tiles)
    ast.parse(cut)
    assert cut.count(f"n_tiles = gl.minimum(n_tiles, {tiles})") == 2
    assert cut.count(f"n_full = gl.minimum(n_full, {tiles})") == 2
    added = [line for line in cut.splitlines() if "gl.minimum(n_" in line]
    assert len(cut.splitlines()) - len(source.splitlines()) == len(added) == 4
    assert cut.replace("\n" + "\n".join(added[:2]), "", 1).replace("\n" + "\n".join(added[2:]), "", 1) == source


def test_a_kernel_that_reads_its_lists_elsewhere_is_refused():
    with pytest.raises(ValueError, match="no longer reads its lists"):
        floor.clamped_source("def _producer():\n    pass\n", 1)
