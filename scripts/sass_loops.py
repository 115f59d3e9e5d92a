"""Loops of a SASS listing (cuobjdump -sass, or Nsight Compute's source page): the innermost loops
(the tile loops), the spill instructions in them and the longest one's instruction mix. Read by
scripts/sm90_build_stats.py, scripts/gluon_fp8_build_stats.py and scripts/ncu_source.py."""

from __future__ import annotations

import re

SPILL = re.compile(r"\b(LDL|STL)\b")         # a SASS instruction that reads or writes spilled registers


def innermost_loops(code: list) -> list:
    """Innermost loops of SASS instructions (address, text) as (first, last) addresses: a loop is
    the span from a backward branch's target to the branch; innermost when no other span lies inside it."""
    loops = set()
    for addr, text in code:
        target = re.search(r"\bBRA\b.*?0x([0-9a-fA-F]+)", text)
        if target and int(target.group(1), 16) < addr:
            loops.add((int(target.group(1), 16), addr))
    return [(lo, hi) for lo, hi in loops if not any((lo, hi) != o and lo <= o[0] and o[1] <= hi for o in loops)]


def inner_loops(sass: str) -> tuple:
    """(instructions as (address, text), innermost_loops of them) of a cuobjdump SASS listing."""
    code = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    return code, innermost_loops(code)


def spills_in_loops(sass: str) -> int:
    """LDL/STL instructions in innermost loop bodies (the tile loops)."""
    code, inner = inner_loops(sass)
    return sum(1 for addr, text in code if SPILL.search(text) and any(lo <= addr <= hi for lo, hi in inner))


def tile_loop_mix(sass: str) -> dict:
    """The longest innermost loop (a tile loop: in a warp-specialised kernel a consumer's, run by each
    of its warps once per tile): its instruction count and the count of each opcode (predicates and
    modifiers dropped, most common first)."""
    code, inner = inner_loops(sass)
    if not inner:
        return dict(instructions=0, ops={})
    lo, hi = max(inner, key=lambda span: sum(1 for addr, _ in code if span[0] <= addr <= span[1]))
    body = [text for addr, text in code if lo <= addr <= hi]
    ops = {}
    for text in body:
        op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]
        ops[op] = ops.get(op, 0) + 1
    return dict(instructions=len(body), ops=dict(sorted(ops.items(), key=lambda kv: -kv[1])))
