"""scripts/sass_loops.py on SASS listings laid out as cuobjdump writes them."""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from sass_loops import spills_in_loops  # noqa: E402


def test_spills_are_counted_in_innermost_loops_only():
    """A SASS listing with an outer loop holding two inner ones: local loads and stores count only
    inside the inner loops' spans (backward branch target .. branch)."""
    rng = random.Random(0)
    lines, inner_spills = [], 0
    # layout: 0x0000 prologue, outer loop 0x0100..0x0900 holding inner loops 0x0200..0x0400 and 0x0500..0x0700
    inner = [(0x0200, 0x0400), (0x0500, 0x0700)]
    for addr in range(0x0000, 0x0a00, 0x10):
        spill = rng.random() < 0.2
        if addr in (0x0400, 0x0700, 0x0900):
            target = {0x0400: 0x0200, 0x0700: 0x0500, 0x0900: 0x0100}[addr]
            text = f"@P0 BRA 0x{target:x}"
        elif spill:
            text = "LDL R5, [R1+0x10]" if rng.random() < 0.5 else "STL [R1+0x8], R6"
            inner_spills += any(lo <= addr <= hi for lo, hi in inner)
        else:
            text = "FFMA R2, R3, R4, R2"
        lines.append(f"        /*{addr:04x}*/                   {text} ;   /* 0x0000000000000000 */")
    assert inner_spills > 0
    assert spills_in_loops("\n".join(lines)) == inner_spills
