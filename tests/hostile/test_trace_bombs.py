"""Trace uploads that decode to GBs: a few-kB parquet of run-length data (10^8 rows of one
value), behind an honest or a lying manifest, several manifest entries naming one file, and a
meta that allows the rows but not the bytes. Each is refused by Trace.load within the suite's
limits (1.5 GiB peak RSS, 10 s) in a child under RLIMIT_AS 2 GiB. The bombs are built here,
never committed."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .harness import refused_cheaply, run_snippet

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
    """A parquet file of BOMB_ROWS rows of the integer 0 in the tiles table's columns, written
    dictionary-encoded with one page per column (one run of 10^8 equal indices), zstd."""
    path = tmp_path_factory.mktemp("bomb") / "tiles.parquet"
    chunk = pa.array(np.zeros(1 << 20, dtype=np.int32))
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


def _load(path: Path):
    res = run_snippet(LOAD.format(path=str(path)))
    print(f"peak RSS {res.peak_rss / 2**20:.0f} MiB, {res.seconds:.1f} s: {res.stdout.strip()}")
    return res


def test_rle_bomb_with_an_honest_manifest_is_refused_before_decoding(tmp_path, bomb):
    t = _trace_with(tmp_path, {"tiles": (bomb, BOMB_ROWS)})
    refused_cheaply(_load(t), "REFUSED", "table tiles has 100,000,000 rows", "allows at most 384")


def test_rle_bomb_behind_a_lying_manifest_is_refused_by_its_footer(tmp_path, bomb):
    t = _trace_with(tmp_path, {"tiles": (bomb, 384)})
    refused_cheaply(_load(t), "REFUSED", "has 100,000,000 rows; the manifest says 384")


def test_manifest_entries_naming_one_file_are_refused(tmp_path, bomb):
    def share(manifest):
        for i in range(20):
            manifest["tables"][f"extra{i}"] = dict(manifest["tables"]["tiles"])
    t = _trace_with(tmp_path, {"tiles": (bomb, 384)}, share)
    refused_cheaply(_load(t), "REFUSED", "names 'tiles.parquet' for two tables")


def test_meta_that_allows_the_rows_but_not_the_bytes_is_refused(tmp_path, bomb):
    """The largest meta a page draws (N = 2^20, a 4096 x 4096 tile grid, 64 traced heads)
    allows 10^8 tile rows; their decoded bytes are over the budget."""
    def widen(manifest):
        meta = manifest["meta"]
        meta["shape"].update(B=1, H=64, H_kv=64, N=1 << 20, N_q=1 << 20, N_k=1 << 20)
        meta.update(block_m=256, block_n=256, n_q_blocks=4096, n_k_blocks=4096,
                    traced_heads=list(range(64)))
    t = _trace_with(tmp_path, {"tiles": (bomb, BOMB_ROWS)}, widen)
    refused_cheaply(_load(t), "REFUSED", "would decode to", "MiB a trace may hold")


def test_one_absurd_sm_id_is_refused_cheaply(tmp_path):
    import pandas as pd

    work = pd.read_parquet(BASE / "work.parquet")
    work["sm"] = work["sm"].astype("int64")
    work.loc[7, "sm"] = 200000
    src = tmp_path / "work.parquet"
    work.to_parquet(src, index=False)
    t = _trace_with(tmp_path, {"work": (src, len(work))})
    refused_cheaply(_load(t), "REFUSED", "sm = 200000 lies outside -1..131")


def test_a_5000_digit_json_integer_is_one_line(tmp_path):
    t = Path(shutil.copytree(BASE, tmp_path / "t"))
    text = (t / "manifest.json").read_text().replace('"B": 4', '"B": ' + "9" * 5000, 1)
    (t / "manifest.json").write_text(text)
    refused_cheaply(_load(t), "REFUSED", "manifest.json is corrupt")
