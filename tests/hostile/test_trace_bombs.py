"""Trace uploads that decode to GBs: a few-kB parquet of run-length data (10^8 rows of one
value), behind an honest or a lying manifest, several manifest entries naming one file, and a
meta that allows the rows but not the bytes. Each is refused by Trace.load within the suite's
limits (1.5 GiB peak RSS, 10 s) in a child under RLIMIT_AS 2 GiB (the loads share one child,
harness.run_cases, each load's memory and time its own). The bombs are built here, never committed."""

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .harness import refused_cheaply, run_cases

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "data" / "traces" / "n1024_causal_natural"
BOMB_ROWS = 10**8
LOAD = """
from instrumentation.trace import Trace, TraceFormatError
try:
    Trace.load({path!r})
    print("LOADED")
except TraceFormatError as exc:
    print("REFUSED", exc)
"""


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    """A parquet file of BOMB_ROWS rows of null int32 in the tiles table's columns, written
    dictionary-encoded with one page per column (one run of 10^8 equal definition levels), zstd.
    A reader still allocates 10^8 values of each; pyarrow writes nulls' levels in a third of the
    CPU it takes to encode 4 x 10^8 zeros."""
    path = tmp_path_factory.mktemp("bomb") / "tiles.parquet"
    chunk = pa.nulls(1 << 20, pa.int32())
    column = pa.chunked_array([chunk] * (BOMB_ROWS >> 20)
                              + [chunk.slice(0, BOMB_ROWS - (BOMB_ROWS >> 20 << 20))])
    table = pa.table({c: column for c in ("bh", "q_block", "k_block", "order")})
    pq.write_table(table, path, compression="zstd", use_dictionary=True, write_statistics=False,
                   row_group_size=BOMB_ROWS, data_page_size=1 << 30, write_batch_size=1 << 24,
                   max_rows_per_page=1 << 30)
    assert path.stat().st_size < 16_000, path.stat().st_size       # a few kB
    assert pq.ParquetFile(path).metadata.num_rows == BOMB_ROWS
    return path


def _trace_with(tmp_path: Path, files: dict, edit=None) -> Path:
    """A copy of a bundled trace whose manifest points `files` ({table: (parquet path, rows)})
    at the given files, with true checksums; edit(manifest) changes it further."""
    t = Path(shutil.copytree(BASE, tmp_path / "t"))
    manifest = json.loads((t / "manifest.json").read_text())
    for name, (src, rows) in files.items():
        shutil.copyfile(src, t / f"{name}.parquet")
        manifest["tables"][name] = {"file": f"{name}.parquet", "rows": rows,
                                    "sha256": hashlib.sha256((t / f"{name}.parquet").read_bytes()).hexdigest()}
    if edit:
        edit(manifest)
    (t / "manifest.json").write_text(json.dumps(manifest))
    return t


def _sm_200000(tmp_path: Path) -> Path:
    import pandas as pd

    work = pd.read_parquet(BASE / "work.parquet")
    work["sm"] = work["sm"].astype("int64")
    work.loc[7, "sm"] = 200000
    src = tmp_path / "work.parquet"
    work.to_parquet(src, index=False)
    return _trace_with(tmp_path, {"work": (src, len(work))})


def _huge_json_integer(tmp_path: Path) -> Path:
    t = Path(shutil.copytree(BASE, tmp_path / "t"))
    text = (t / "manifest.json").read_text().replace('"B": 4', '"B": ' + "9" * 5000, 1)
    (t / "manifest.json").write_text(text)
    return t


def _share(manifest):
    for i in range(20):
        manifest["tables"][f"extra{i}"] = dict(manifest["tables"]["tiles"])


def _widen(manifest):
    """The largest meta a page draws (N = 2^20, a 4096 x 4096 tile grid, 64 traced heads)
    allows 10^8 tile rows; their decoded bytes are over the budget."""
    meta = manifest["meta"]
    meta["shape"].update(B=1, H=64, H_kv=64, N=1 << 20, N_q=1 << 20, N_k=1 << 20)
    meta.update(block_m=256, block_n=256, n_q_blocks=4096, n_k_blocks=4096,
                traced_heads=list(range(64)))


@pytest.fixture(scope="module")
def loads(tmp_path_factory, bomb) -> dict:
    """Each hostile trace below loaded by Trace.load, all in one child (harness.run_cases: the
    imports once, each load's peak RSS, CPU and wall time its own): {case: Result}."""
    builds = {
        "honest": lambda d: _trace_with(d, {"tiles": (bomb, BOMB_ROWS)}),
        "lying": lambda d: _trace_with(d, {"tiles": (bomb, 384)}),
        "shared": lambda d: _trace_with(d, {"tiles": (bomb, 384)}, _share),
        "wide": lambda d: _trace_with(d, {"tiles": (bomb, BOMB_ROWS)}, _widen),
        "sm": _sm_200000,
        "json": _huge_json_integer,
    }
    paths = {case: build(tmp_path_factory.mktemp(case)) for case, build in builds.items()}
    results = run_cases("from instrumentation.trace import Trace, TraceFormatError",
                        {case: LOAD.format(path=str(path)) for case, path in paths.items()})
    for case, res in results.items():
        print(f"{case}: peak RSS {res.peak_rss / 2**20:.0f} MiB, {res.seconds:.1f} s: {res.stdout.strip()}")
    return results


def test_rle_bomb_with_an_honest_manifest_is_refused_before_decoding(loads):
    refused_cheaply(loads["honest"], "REFUSED", "table tiles has 100,000,000 rows", "allows at most 384")


def test_rle_bomb_behind_a_lying_manifest_is_refused_by_its_footer(loads):
    refused_cheaply(loads["lying"], "REFUSED", "has 100,000,000 rows; the manifest says 384")


def test_manifest_entries_naming_one_file_are_refused(loads):
    refused_cheaply(loads["shared"], "REFUSED", "names 'tiles.parquet' for two tables")


def test_meta_that_allows_the_rows_but_not_the_bytes_is_refused(loads):
    refused_cheaply(loads["wide"], "REFUSED", "would decode to", "MiB a trace may hold")


def test_one_absurd_sm_id_is_refused_cheaply(loads):
    refused_cheaply(loads["sm"], "REFUSED", "sm = 200000 lies outside -1..131")


def test_a_5000_digit_json_integer_is_one_line(loads):
    refused_cheaply(loads["json"], "REFUSED", "manifest.json is corrupt")
