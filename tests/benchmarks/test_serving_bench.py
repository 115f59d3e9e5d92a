"""benchmarks.serving: a CPU smoke run writes a valid result file in which every backend agreed
with ours before it was timed; bad arguments are refused in one line."""

import pytest
import torch

from benchmarks import load_results
from benchmarks import serving as bench

REF = torch.linspace(-1, 1, 64)


def test_smoke_run_checks_every_backend_then_writes_a_valid_file(tmp_path, device):
    if device.type == "cuda":
        pytest.skip("the GPU run is the benchmark itself")
    rc = bench.main(["--device", "cpu", "--context", "40", "--pages", "16", "--lens", "20,1",
                     "--heads", "2", "--kv-heads", "1", "--head-dim", "16", "--dtype", "fp32",
                     "--repeats", "1", "--out", str(tmp_path)])
    assert rc == 0
    res = load_results(next(tmp_path.glob("serving-*.json")), "serving")
    recs = {(r["part"], r["impl"]): r for r in res["records"]}
    assert set(recs) == {("paged_decode", "contiguous"), ("paged_decode", "paged:16"),
                         ("paged_decode", "gather:16"), ("varlen_prefill", "varlen"),
                         ("varlen_prefill", "padded"), ("varlen_prefill", "sdpa_per_sequence")}
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-4 and r["ms"] > 0 for r in recs.values())
    assert recs[("paged_decode", "gather:16")]["rel_err"] == 0            # a gather is exact
    assert recs[("paged_decode", "paged:16")]["page_size"] == 16
    assert recs[("varlen_prefill", "varlen")]["rel_err_vs_sdpa"] < 1e-4


def test_a_wrong_backend_is_recorded_not_timed():
    calls = {"ours": lambda: 1.0 * REF, "off": lambda: 2.0 * REF}
    args = bench.build_parser().parse_args(["--dtype", "fp32", "--repeats", "2"])
    timed = []
    recs = bench._check_and_time(calls, REF, {"part": "x"}, args, lambda fn: timed.append(fn) or 1.0)
    assert recs["ours"]["status"] == "ok" and recs["off"]["status"] == "wrong"
    assert recs["off"]["ms"] is None and timed == [calls["ours"]] * 2


@pytest.mark.parametrize("argv,message", [(["--parts", "prefill"], "unknown part"),
                                          (["--heads", "6", "--kv-heads", "4"], "multiple of"),
                                          (["--repeats", "0"], "at least 1")])
def test_bad_arguments_are_refused(argv, message):
    with pytest.raises(SystemExit, match=message):
        bench.main(["--device", "cpu", *argv])

