"""Trace.load refuses, in one line, any value a page could not draw: index columns that are not
integers or lie outside the ranges the meta gives (negative ones are not wrapped), rows named
twice, missing columns a recorder always writes, a text sm_scale, SM ids past the device's,
times out of order, and tile statuses outside the vocabulary (so no markup reaches a hover)."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from instrumentation.trace import Trace, TraceFormatError

DATA = Path(__file__).resolve().parents[3] / "data"
FLASH = DATA / "traces" / "n1024_causal_natural"       # 3 traced heads, sm_count 132
DECODE = DATA / "decode" / "decode_b1_ctx32k_splits-auto"


@pytest.fixture
def flash(tmp_path):
    return Path(shutil.copytree(FLASH, tmp_path / "t"))


def rewrite_table(trace_dir: Path, name: str, edit) -> None:
    """Replace one table of a saved trace by edit(DataFrame), keeping the manifest's rows and
    checksum true (what a hand-made hostile upload would do)."""
    manifest = json.loads((trace_dir / "manifest.json").read_text())
    entry = manifest["tables"][name]
    df = edit(pd.read_parquet(trace_dir / entry["file"]))
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), trace_dir / entry["file"])
    data = (trace_dir / entry["file"]).read_bytes()
    entry.update(rows=len(df), sha256=hashlib.sha256(data).hexdigest())
    (trace_dir / "manifest.json").write_text(json.dumps(manifest))


def edit_meta(trace_dir: Path, edit) -> None:
    manifest = json.loads((trace_dir / "manifest.json").read_text())
    edit(manifest["meta"])
    (trace_dir / "manifest.json").write_text(json.dumps(manifest))


def refused(trace_dir: Path, *fragments) -> str:
    with pytest.raises(TraceFormatError) as info:
        Trace.load(trace_dir)
    msg = str(info.value)
    assert "\n" not in msg and len(msg) < 300, msg
    for f in fragments:
        assert f in msg, msg
    return msg


def _set(col, value, row=0):
    def edit(df):
        df = df.copy()
        if col in df and df[col].dtype.kind in "iu" and isinstance(value, int) and \
                not np.can_cast(np.min_scalar_type(value), df[col].dtype):
            df[col] = df[col].astype(np.uint64 if value >= 2**63 else np.int64)
        if col in df and isinstance(value, str) and not isinstance(df[col].dtype, pd.CategoricalDtype):
            df[col] = df[col].astype(object)
        if col in df and isinstance(df[col].dtype, pd.CategoricalDtype):
            df[col] = df[col].astype(object)
        df.loc[row, col] = value
        return df
    return edit


@pytest.mark.parametrize("table,edit,fragments", [
    # item 9: a negative block would wrap to another cell; an SM id past the device's would be
    # drawn on SM id mod 2^k
    ("tiles", _set("k_block", -3), ["tiles: k_block = -3 lies outside 0..15"]),
    ("tiles", _set("q_block", 8), ["q_block = 8 lies outside 0..7"]),
    ("rows", _set("k_block", -1), ["rows: k_block = -1"]),
    ("work", _set("sm", 200000), ["work: sm = 200000 lies outside -1..131"]),
    ("work", _set("sm", 2**63 + 5), ["sm = 9223372036854775813"]),
    ("work", _set("bh", -1), ["outside"]),
    # item 13: index columns must be integers
    ("work", lambda df: df.assign(q_block=df.q_block.astype(float)), ["q_block must hold integers"]),
    ("tiles", lambda df: df.assign(bh=df.bh.astype(float).where(df.index > 0)), ["bh must hold integers"]),
    ("tiles", lambda df: df.assign(k_block=df.k_block > 3), ["k_block must hold integers, not bool"]),
    ("rows", _set("q_row", 5000), ["q_row = 5000 lies outside 0..1023"]),
    ("out", _set("q_row", -7), ["out: q_row = -7"]),
    ("tiles", lambda df: pd.concat([df.iloc[:1], df.iloc[:-1]], ignore_index=True), ["tiles has two rows"]),
    ("work", lambda df: df.drop(columns="tiles_visited"), ["lacks columns ['tiles_visited']"]),
    ("work", _set("t_start", 1e12), ["t_start <= t_end"]),
    ("work", _set("t_end", np.inf), ["finite"]),
    ("tiles", lambda df: df.assign(visited=df.order), ["visited must be true/false"]),
    # item 10: markup in a status would reach the exported HTML's hover
    ("tiles", _set("status", '<a href="https://evil.example">x</a>'), ["status '<a href=", "not one of"]),
    ("tiles", _set("status", "<b>full</b>"), ["not one of full, partial, skipped"]),
])
def test_values_no_page_can_draw_are_refused_in_one_line(flash, table, edit, fragments):
    rewrite_table(flash, table, edit)
    refused(flash, *fragments)


@pytest.mark.parametrize("edit,fragments", [
    (lambda m: m["kernel"].update(sm_scale="0.125"), ["kernel.sm_scale", "not of type"]),
    (lambda m: m["kernel"].update(sm_scale=True), ["kernel.sm_scale"]),
    (lambda m: m["kernel"].update(sm_scale=float("nan")), ["sm_scale must be a positive number"]),
    (lambda m: m.update(sm_count=200000), ["sm_count", "maximum"]),
    (lambda m: m.update(traced_heads=[0, 0, 5]), ["traced_heads that repeat"]),
    (lambda m: m.update(traced_q_blocks=[0, 99]), ["traced_q_blocks that repeat or lie outside 0..7"]),
    # the meta is bounded by what a page can draw, before any table is read (item 1)
    (lambda m: m["shape"].update(N=1 << 21, N_q=1 << 21), ["shape.N", "maximum"]),
    (lambda m: m["shape"].update(D=512), ["shape.D", "maximum"]),
    (lambda m: m.update(n_q_blocks=1 << 13, n_k_blocks=1 << 13), ["n_q_blocks x n_k_blocks tiles",
                                                                "over the 16,777,216"]),
])
def test_meta_values_are_checked_before_the_tables(flash, edit, fragments):
    edit_meta(flash, edit)
    refused(flash, *fragments)


def test_decode_tables_are_bounded_and_checked(tmp_path):
    path = Path(shutil.copytree(DECODE, tmp_path / "d"))
    assert len(Trace.load(path).partials) == 512
    rewrite_table(path, "partials", _set("split", 16))           # kernel.num_splits = 16
    refused(path, "partials: split = 16 lies outside -1..15")
    rewrite_table(path, "partials", lambda df: pd.concat([df] * 2, ignore_index=True))
    refused(path, "table partials has 1,024 rows", "allows at most 512")


def test_a_markup_status_never_reaches_an_exported_hover(flash, tmp_path):
    """The only way into a chart is Trace.load; with the markup refused there, the one
    trace that loads has statuses from the vocabulary alone."""
    rewrite_table(flash, "tiles", _set("status", "<img src=x onerror=alert(1)>"))
    refused(flash, "not one of")
    t = Trace.load(FLASH)
    assert set(t.tiles["status"].astype(str)) <= {"full", "partial", "skipped"}


def test_every_bundled_trace_passes_the_checks():
    dirs = [p.parent for p in sorted(DATA.glob("**/manifest.json"))
            if p.parent.parent.name in ("traces", "legacy-v1", "decode", "ring")]
    assert len(dirs) >= 30
    for d in dirs:
        Trace.load(d)


def test_save_refuses_what_load_would_refuse(tmp_path):
    t = Trace.load(FLASH)
    big = Trace(meta=t.meta, tables={**t.tables, "tiles": pd.concat([t.tiles] * 2, ignore_index=True)})
    with pytest.raises(TraceFormatError, match="table tiles has 768 rows; the trace's meta allows at most 384"):
        big.save(tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_a_table_registered_by_other_work_inherits_a_bound(tmp_path, monkeypatch):
    from instrumentation.trace import schema

    monkeypatch.setattr(schema, "TABLES", dict(schema.TABLES))
    monkeypatch.setattr(schema, "TABLE_COLUMNS", dict(schema.TABLE_COLUMNS))
    schema.register_table("paged", ["bh", "page"], max_rows=lambda m: 2 * m["n_k_blocks"],
                          index={"page": lambda m: m["n_k_blocks"]}, key=("bh", "page"))
    t = Trace.load(FLASH)
    ok = pd.DataFrame({"bh": [0, 0], "page": [0, 15]})
    Trace(meta=t.meta, tables={**t.tables, "paged": ok}).save(tmp_path / "ok")
    assert Trace.load(tmp_path / "ok").paged["page"].tolist() == [0, 15]
    rewrite_table(tmp_path / "ok", "paged", _set("page", 16))
    refused(tmp_path / "ok", "paged: page = 16 lies outside 0..15")
    many = pd.DataFrame({"bh": 0, "page": np.arange(33) % 16})
    with pytest.raises(TraceFormatError, match="table paged has 33 rows; the trace's meta allows at most 32"):
        Trace(meta=t.meta, tables={**t.tables, "paged": many}).save(tmp_path / "many")
    schema.register_table("plain", ["x"])          # no bound given: the tile grid bounds it
    assert schema.TABLES["plain"].max_rows(t.meta) == 64 * 8 * 16
