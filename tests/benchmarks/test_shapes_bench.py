"""benchmarks.shapes (issue 9) and the interpreter-sized benchmarks.attention run (issue 8 item 11)."""

import json

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU (interpreter) smoke runs")


def test_shapes_benchmark_checks_outputs_and_writes_results(tmp_path):
    from benchmarks import shapes
    assert shapes.main(["--device", "cpu", "--quick", "--suites", "chunked", "--out", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("shapes-*.json")).read_text())
    (rec,) = doc["records"]
    assert (rec["impl"], rec["n_q"], rec["n_k"], rec["heads"], rec["kv_heads"]) == ("tilescope", 32, 256, 4, 2)
    assert rec["status"] == "ok" and rec["rel_err"] < 2e-2 and rec["ms"] > 0
    assert doc["meta"]["command"].startswith("python -m benchmarks.shapes")
    full = shapes.cases("gqa")
    assert {(c["heads"], c["kv_heads"], c["head_dim"]) for c in full} == {(32, 8, 128)}
    assert {c["n_q"] for c in full} == {4096, 8192, 16384}
    assert {c["head_dim"] for c in shapes.cases("odd_d")} == {80, 96, 192}
    assert {(c["n_q"], c["n_k"]) for c in shapes.cases("chunked")} == {(512, 8192), (512, 16384), (512, 32768)}


def test_attention_benchmark_on_cpu_picks_interpreter_sizes_and_writes_as_it_goes(tmp_path, monkeypatch):
    from benchmarks import attention
    written = []
    real_write = attention.write_results
    monkeypatch.setattr(attention, "write_results",
                        lambda obj, *a, **kw: (written.append(len(obj["records"])), real_write(obj, *a, **kw))[1])
    args = attention.build_parser().parse_args(["--device", "cpu", "--quick", "--masks", "causal",
                                                "--impls", "tilescope", "--out", str(tmp_path)])
    result = attention.run(args, [])
    meta = result["meta"]
    assert meta["shape"] == {"B": 1, "H": 2, "D": 32} and meta["seq_lens"] == [64, 128]
    assert [r["status"] for r in result["records"]] == ["ok", "ok"]
    assert written[0] == 1 and max(written) == 2   # a file after every record, not after a whole N
