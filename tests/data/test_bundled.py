"""The recordings shipped under data/: every trace and sweep loads, is self-consistent and
comes from a real GPU; MANIFEST.json matches what is on disk.

Parametrized over whatever files exist. Before the first GPU run data/ has no recordings: the
per-file tests then skip (empty parameter set) and the checks below still run on a live
interpreter trace, so the checkers themselves are always exercised (the MANIFEST checker on a quick
interpreter regenerate: tests/instrumentation/cli/test_regenerate.py)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from instrumentation import make_inputs, record
from instrumentation.analysis.hbm import (
    DTYPE_BYTES, flash_hbm_bytes, flash_hbm_bytes_tiled, naive_hbm_bytes, tile_count_hbm_bytes,
)
from instrumentation.trace import Trace
from instrumentation.trace.sweep_file import load_sweep

DATA = Path(__file__).resolve().parents[2] / "data"
TRACES = sorted(p.parent for p in DATA.glob("traces/*/manifest.json")
                if not p.parent.name.endswith(".partial"))
SWEEPS = sorted(DATA.glob("sweeps/*.json"))
MANIFEST = DATA / "MANIFEST.json"
BUDGET_BYTES = 45 * 10 ** 6


def check_trace_invariants(t: Trace) -> None:
    m = t.meta
    b, h, n = m["shape"]["B"], m["shape"]["H"], m["shape"]["N"]
    # work: one row per (bh, q_block)
    w = t.work
    assert len(w) == b * h * m["n_q_blocks"]
    assert not w.duplicated(["bh", "q_block"]).any(), "duplicate work items"
    assert set(w.bh) == set(range(b * h)) and set(w.q_block) == set(range(m["n_q_blocks"]))
    if m.get("level") == "work":     # a long prefill's million-tile grid: work items only, by design
        assert t.tiles.empty and t.rows.empty and "work items only" in m.get("trace_q_blocks_request", "")
        return
    # tiles: the kernel visited exactly the tiles the mask does not skip
    tiles = t.tiles
    assert len(tiles), "no tile table"
    bad = tiles[tiles.visited != (tiles.status != "skipped")]
    assert bad.empty, f"{len(bad)} tiles where visited != (status != 'skipped')"
    assert len(tiles.groupby(["bh", "q_block", "k_block"])) == len(tiles)
    # rows: running max never decreases; the final denominator is positive
    r = t.rows.sort_values(["bh", "q_row", "step"])
    assert len(r), "no softmax rows"
    bh, q_row, m_ = (r[c].to_numpy() for c in ("bh", "q_row", "m"))
    same_row = (bh[1:] == bh[:-1]) & (q_row[1:] == q_row[:-1])        # step i+1 of the row of step i
    down = np.flatnonzero(same_row & ~(m_[1:] >= m_[:-1]))        # NaN counts as a decrease
    assert not len(down), f"m decreases along row {q_row[down[0]]}"
    last = np.append(~same_row, True)                                  # each row's final step
    bad_l = np.flatnonzero(last & ~(r.l.to_numpy() > 0))
    assert not len(bad_l), f"final l of row {q_row[bad_l[0]]} is not positive"
    assert ((0 <= q_row) & (q_row < n)).all(), f"q_row outside [0, {n})"
    # the tile-count model agrees with the traced head's visits
    assert tile_count_hbm_bytes(t) > 0


def names_a_gpu(meta: dict) -> bool:
    name = str(meta.get("device_name") or "")
    return meta.get("backend") == "cuda" and bool(name) and not name.upper().startswith("CPU")


# -- always runs: the checkers on a live recording ---------------------------------------------

def test_invariant_checker_on_a_live_interpreter_trace():
    q, k, v = make_inputs(1, 2, 160, 32, "fp16", seed=2)
    _, t = record(q, k, v, mask="sliding_window:50", block_m=32, block_n=32, trace_q_blocks="all")
    check_trace_invariants(t)
    assert not names_a_gpu(t.meta)          # an interpreter trace must never pass as a GPU one
    broken = Trace(meta=t.meta, work=t.work, tiles=t.tiles.copy(), rows=t.rows, out=t.out)
    broken.tiles.loc[broken.tiles.status == "skipped", "visited"] = True
    with pytest.raises(AssertionError, match="visited"):
        check_trace_invariants(broken)
    dup = Trace(meta=t.meta, work=t.work.iloc[[0] + list(range(len(t.work) - 1))], tiles=t.tiles,
                rows=t.rows, out=t.out)
    with pytest.raises(AssertionError, match="duplicate"):
        check_trace_invariants(dup)


def test_data_readme_names_the_regenerate_command():
    readme = DATA / "README.md"
    assert readme.exists()
    assert "python -m instrumentation.regenerate --out data" in readme.read_text()


# -- bundled traces ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_bundled_trace(path):
    t = Trace.load(path)
    check_trace_invariants(t)
    assert names_a_gpu(t.meta), f"{path.name} was not recorded on a GPU: {t.meta.get('device_name')}"
    assert t.has_hw_timing and t.work.sm.ge(0).all()
    assert t.meta.get("command", "").startswith("python -m instrumentation.")
    assert t.meta.get("untraced_ms") and t.meta["untraced_ms"] > 0


# -- bundled sweeps ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", SWEEPS, ids=[p.name for p in SWEEPS])
def test_bundled_sweep(path):
    meta, df = load_sweep(path)
    assert names_a_gpu(meta), f"{path.name} was not recorded on a GPU: {meta.get('device_name')}"
    assert meta.get("command", "").startswith("python -m instrumentation.")
    for key in ("driver_version", "torch_version", "triton_version", "created"):
        assert meta.get(key), f"meta lacks {key}"
    assert len(df) and set(df.impl) <= {"naive", "flash"}
    ran = df[~df.oom & df.error.isna()]
    assert (ran.peak_bytes > 0).all() and (ran.ms > 0).all()
    assert df[df.oom].ms.isna().all() and df[df.oom].peak_bytes.isna().all()
    for r in df.itertuples():
        el = DTYPE_BYTES[r.dtype]
        assert r.model_naive_bytes == naive_hbm_bytes(r.seq_len, r.heads, r.head_dim, el, r.batch)
        assert r.model_flash_bytes == flash_hbm_bytes(r.seq_len, r.heads, r.head_dim, el, r.batch)
        assert r.model_flash_tiled_bytes == flash_hbm_bytes_tiled(
            r.seq_len, r.heads, r.head_dim, meta["block_m"], el, r.batch)
        if not math.isnan(r.dram_read_bytes):
            assert r.ncu_status == "ok" and r.dram_read_bytes > 0 and r.dram_write_bytes > 0


# -- the index -----------------------------------------------------------------------------------

def check_manifest(root: Path, traces, sweeps) -> None:
    man = json.loads((root / "MANIFEST.json").read_text())
    assert man["format"] == "tilescope-data-manifest"
    listed = {f["file"]: f for f in man["files"]}
    on_disk = {str(p.relative_to(root)) for p in traces} | {str(p.relative_to(root)) for p in sweeps}
    assert set(listed) == on_disk
    for name, entry in listed.items():
        p = root / name
        size = p.stat().st_size if p.is_file() else sum(x.stat().st_size for x in p.rglob("*")
                                                        if x.is_file())
        assert entry["bytes"] == size, f"{name}: MANIFEST says {entry['bytes']} bytes, disk {size}"
        assert entry["kind"] in ("trace", "sweep") and entry["device"] and entry["created"]
        if entry["kind"] == "trace":      # the trace's own meta (each trace's load: test_bundled_trace)
            m = json.loads((p / "manifest.json").read_text())["meta"]
            assert (entry["N"], entry["mask"], entry["schedule"]) == \
                (m["shape"]["N"], m["mask"], m["schedule"])
    assert man["total_bytes"] == sum(f["bytes"] for f in man["files"]) <= BUDGET_BYTES
    assert not man["problems"], man["problems"]


def test_manifest_matches_disk():
    if not MANIFEST.exists():
        if TRACES or SWEEPS:
            pytest.fail("data/ has recordings but no MANIFEST.json: run "
                        "`python -m instrumentation.regenerate --out data`")
        pytest.skip("no recordings in data/ yet: run `python -m instrumentation.regenerate "
                    "--out data` on a GPU")
    check_manifest(DATA, TRACES, SWEEPS)

