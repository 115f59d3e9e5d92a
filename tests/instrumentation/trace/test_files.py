"""The file layer (instrumentation.trace.files) and the trace format on top of it: hostile manifests,
meta that contradicts the tables, atomic saves that lose nothing, generic named tables."""

import json
import math
import os
import time

import numpy as np
import pandas as pd
import pytest

from instrumentation.trace import files
from instrumentation.trace import schema as trace_schema
from instrumentation.trace import trace as trace_mod
from instrumentation.trace import Trace, TraceFormatError


@pytest.fixture(scope="module")
def recorded():
    from instrumentation import make_inputs, record

    q, k, v = make_inputs(1, 2, 72, 16, "fp16", seed=3)
    _, tr = record(q, k, v, mask="causal", block_m=16, block_n=32)
    return tr


@pytest.fixture
def saved(recorded, tmp_path):
    return recorded.save(tmp_path / "t")


def _edit_manifest(path, fn):
    m = json.loads((path / "manifest.json").read_text())
    fn(m)
    (path / "manifest.json").write_text(json.dumps(m))


def _refused(path, *fragments):
    with pytest.raises(TraceFormatError) as info:
        Trace.load(path)
    msg = str(info.value)
    for f in fragments:
        assert f in msg, msg
    assert "\n" not in msg
    return msg


# -- confinement: a manifest cannot make the loader open anything outside the trace --------------

@pytest.mark.parametrize("name", ["/etc/passwd", "../../../../etc/passwd", "/dev/zero",
                                  "..\\..\\etc\\passwd", "C:\\Windows\\win.ini", "~/x", "a/../../b"])
def test_table_file_outside_the_trace_is_refused_without_revealing_paths(saved, name):
    _edit_manifest(saved, lambda m: m["tables"]["rows"].update(file=name))
    t0 = time.monotonic()
    msg = _refused(saved, "outside the trace")
    assert time.monotonic() - t0 < 5           # /dev/zero is never read
    assert str(saved) not in msg and str(saved.parent) not in msg
    # the answer is the same whether or not the outside path exists
    _edit_manifest(saved, lambda m: m["tables"]["rows"].update(file="/no/such/file/here"))
    assert _refused(saved).replace(repr("/no/such/file/here"), repr(name)) == msg


def test_symlink_leading_out_and_special_files_are_refused(saved, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    os.symlink(secret, saved / "link.parquet")
    _edit_manifest(saved, lambda m: m["tables"]["rows"].update(file="link.parquet"))
    _refused(saved, "outside the trace")
    os.symlink("/dev/zero", saved / "zero.parquet")
    _edit_manifest(saved, lambda m: m["tables"]["rows"].update(file="zero.parquet"))
    _refused(saved, "outside the trace")
    os.mkfifo(saved / "fifo.parquet")               # opening a FIFO would block for ever
    _edit_manifest(saved, lambda m: m["tables"]["rows"].update(file="fifo.parquet"))
    _refused(saved, "not a regular file")
    (saved / "sub").mkdir()
    _edit_manifest(saved, lambda m: m["tables"]["rows"].update(file="sub"))
    _refused(saved, "not a regular file")


def test_oversized_table_is_refused_before_hashing(saved, monkeypatch):
    monkeypatch.setattr(files, "MAX_TABLE_BYTES", 64)
    _refused(saved, "over the", "MB limit")


def test_manifest_that_is_a_directory_or_a_link(saved, tmp_path):
    (saved / "manifest.json").unlink()
    (saved / "manifest.json").mkdir()
    _refused(saved, "manifest.json is a directory")
    (saved / "manifest.json").rmdir()
    os.symlink("/etc/hostname", saved / "manifest.json")
    _refused(saved, "is a link")


# -- schema: the manifest and the meta, one line naming the field ----------------------------------

@pytest.mark.parametrize("edit,fragment", [
    (lambda m: m.pop("meta"), "'meta' is a required property"),
    (lambda m: m.update(tables=[1]), "tables: [1] is not of type 'object'"),
    (lambda m: m["meta"].update(shape="big"), "shape: 'big' is not of type 'object'"),
    (lambda m: m["meta"]["shape"].update(N=-5), "shape.N: -5 is less than the minimum of 1"),
    (lambda m: m["meta"].update(dtype="int8"), "dtype: 'int8' is not one of"),
    (lambda m: m["tables"]["work"].update(rows="many"), "tables.work.rows"),
    (lambda m: m["tables"]["work"].update(sha256="../x"), "tables.work.sha256"),
    (lambda m: m["tables"].update({"../evil": m["tables"]["work"]}), "does not match"),
    (lambda m: m["tables"].pop("tiles"), "no ['tiles'] table"),
    (lambda m: m["meta"].update(input_sums={"0": "lots"}), "input_sums.0: 'lots' is not of type 'array'"),
    (lambda m: m["meta"].update(input_sums={"../x": [1, 2, 3]}), "input_sums"),
    (lambda m: m.update(schema_version="1"), "schema version '1'"),
    (lambda m: m.update(schema_version=99), "schema version 99"),
])
def test_hostile_manifests_get_one_line(saved, edit, fragment):
    _edit_manifest(saved, edit)
    _refused(saved, fragment)


@pytest.mark.parametrize("edit,fragment", [
    (lambda m: m["shape"].update(N=99999), "contradicts its tables"),
    (lambda m: m["shape"].update(B=3), "B*H x n_q_blocks"),
    (lambda m: m.update(block_m=64), "n_q_blocks x n_k_blocks"),
])
def test_meta_that_contradicts_the_tables_is_refused(saved, edit, fragment):
    _edit_manifest(saved, lambda m: edit(m["meta"]))
    _refused(saved, fragment)


def test_row_count_must_match_the_manifest(saved):
    _edit_manifest(saved, lambda m: m["tables"]["work"].update(rows=m["tables"]["work"]["rows"] - 1))
    _refused(saved, "rows; the manifest says")
    # more rows than the meta allows is refused before the file is opened
    _edit_manifest(saved, lambda m: m["tables"]["work"].update(rows=m["tables"]["work"]["rows"] + 2))
    _refused(saved, "the trace's meta allows at most")


# -- saving: atomic, never over something that is not ours, force to replace a trace -------------

def test_round_trip_keeps_every_table(recorded, tmp_path):
    back = Trace.load(recorded.save(tmp_path / "t"))
    for name in ("work", "tiles", "rows", "out"):
        pd.testing.assert_frame_equal(getattr(back, name), getattr(recorded, name),
                                      check_categorical=False)
    assert back.meta["shape"] == recorded.meta["shape"] and back.meta["source"] == "recorded"


def test_existing_trace_needs_force_and_other_directories_are_never_replaced(recorded, tmp_path):
    path = recorded.save(tmp_path / "t")
    with pytest.raises(TraceFormatError, match="already holds a trace; pass --force"):
        recorded.save(path)
    recorded.save(path, force=True)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "manifest.json").write_text('{"my": "own file"}')
    with pytest.raises(TraceFormatError, match="does not hold a trace"):
        recorded.save(mine, force=True)
    assert json.loads((mine / "manifest.json").read_text()) == {"my": "own file"}
    (tmp_path / "afile").write_text("x")
    with pytest.raises(TraceFormatError, match="a file is there"):
        recorded.save(tmp_path / "afile")
    with pytest.raises(TraceFormatError, match="is a file, not a directory"):
        recorded.save(tmp_path / "afile" / "sub")
    with pytest.raises(TraceFormatError, match="empty"):
        recorded.save("")
    empty = tmp_path / "empty"
    empty.mkdir()
    Trace.load(recorded.save(empty))


def test_interrupted_save_loses_nothing(recorded, tmp_path, monkeypatch):
    path = recorded.save(tmp_path / "t")
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    other = Trace(meta={**recorded.meta, "mask": "full"}, tables=dict(recorded.tables))
    real = trace_mod._write_table_file
    calls = []

    def fail_after_first(p, data):
        calls.append(p.name)
        if len(calls) > 1:
            raise KeyboardInterrupt("Ctrl-C between tables")
        real(p, data)

    monkeypatch.setattr(trace_mod, "_write_table_file", fail_after_first)
    with pytest.raises(KeyboardInterrupt):
        other.save(path, force=True)
    assert len(calls) == 2
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]      # no temporary left behind
    assert Trace.load(path).meta["mask"] == "causal"
    monkeypatch.setattr(trace_mod, "_write_table_file", real)
    assert Trace.load(other.save(path, force=True)).meta["mask"] == "full"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_named_tables_round_trip_and_are_attributes(recorded, tmp_path):
    rng = np.random.default_rng(0)
    splits = pd.DataFrame({"b": [0, 0], "kv_head": [0, 1], "split": [0, 1], "k_start": [0, 36],
                           "k_end": [36, 72], "sm": [-1, -1], "t_start": [np.nan] * 2,
                           "t_end": [np.nan] * 2})
    partials = pd.DataFrame({"b": 0, "head": 0, "q_row": np.arange(4), "split": 0,
                             "m": rng.normal(size=4), "l": rng.uniform(1, 2, size=4)})
    tr = Trace(meta=recorded.meta, tables={**recorded.tables, "splits": splits},
               partials=partials)
    assert tr.splits is tr.tables["splits"] and tr.partials is partials
    back = Trace.load(tr.save(tmp_path / "t"))
    pd.testing.assert_frame_equal(back.splits, splits)
    pd.testing.assert_frame_equal(back.partials, partials)
    with pytest.raises(AttributeError):
        back.no_such_table
    bad = Trace(meta=recorded.meta, tables={**recorded.tables, "splits": splits.drop(columns="sm")})
    bad.save(tmp_path / "bad")
    _refused(tmp_path / "bad", "lacks columns ['sm']")


def test_upgrade_hook_lifts_older_versions(saved, monkeypatch):
    """A schema bump is one place: SCHEMA_VERSION and UPGRADES[old]."""
    def v2_to_v3(meta, tables):      # a pretend next version on top of the real 1 -> 2 upgrade
        meta["upgraded"] = True
        tables["work"]["kv_head2"] = tables["work"]["bh"]
    monkeypatch.setattr(trace_schema, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(trace_schema, "UPGRADES", {**trace_schema.UPGRADES, 2: v2_to_v3})
    back = Trace.load(saved)
    assert back.meta["upgraded"] and back.meta["schema_version"] == 3
    assert (back.work.kv_head2 == back.work.bh).all()
    monkeypatch.setattr(trace_schema, "UPGRADES", {})
    _refused(saved, "schema version 2")


# -- JSON and the dtype table ----------------------------------------------------------------------

def test_json_is_strict_and_nan_safe(tmp_path):
    payload = {"a": float("nan"), "b": [np.float32(1.5), np.int64(3), math.inf], "c": (1, 2),
               "d": np.arange(3), "e": np.bool_(True)}
    path = files.write_json_atomic(tmp_path / "x" / "f.json", payload)
    assert json.loads(path.read_text()) == {"a": None, "b": [1.5, 3, None], "c": [1, 2],
                                            "d": [0, 1, 2], "e": True}
    assert "NaN" not in path.read_text() and sorted(os.listdir(path.parent)) == ["f.json"]
    with pytest.raises(files.FileFormatError, match="not JSON"):
        (tmp_path / "bad.json").write_text("{")
        files.read_json(tmp_path / "bad.json", "bad.json")


def test_one_dtype_table():
    import torch

    from benchmarks import DTYPES as bench_dtypes
    from instrumentation.analysis import hbm
    from instrumentation.recording.inputs import torch_dtype
    from instrumentation.recording import DTYPES as rec_dtypes

    assert hbm.DTYPE_BYTES is files.DTYPE_BYTES
    for name, d in files.DTYPES.items():
        assert rec_dtypes[name] is bench_dtypes[name] is torch_dtype(name)
        assert torch.tensor([], dtype=torch_dtype(name)).element_size() == d.bytes
    with pytest.raises(ValueError, match="dtype 'int8' is not supported; use one of fp16, bf16, fp32"):
        torch_dtype("int8")


def test_document_lengths_one_implementation():
    from benchmarks import document_lengths as bench_docs
    from instrumentation.recording.inputs import document_lengths
    from instrumentation.recording.data_bundle import document_mask

    assert bench_docs is document_lengths
    for n in (1, 5, 13, 100, 1000, 4097):
        lens = document_lengths(n)
        assert sum(lens) == n and min(lens) >= 1
    assert document_mask(1024) == "document:128,384,256,256"


def test_tables_with_text_where_numbers_belong_are_refused(recorded, tmp_path):
    work = recorded.work.copy()
    work["bh"] = work["bh"].astype(str) + "x"
    tr = Trace(meta=recorded.meta, tables={**recorded.tables, "work": work})
    _refused(tr.save(tmp_path / "t"), "non-numeric columns ['bh']")
