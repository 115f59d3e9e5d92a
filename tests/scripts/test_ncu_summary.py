"""scripts/ncu_summary.py on raw CSV pages laid out as `ncu --csv --page raw` writes them (a header,
a units row, one row per kernel), with random values: units converted, stalls ranked, absent
metrics left out; and scripts/profile_case.py's one-line refusals."""

import csv
import io
import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import ncu_summary  # noqa: E402
import profile_case  # noqa: E402

STALLS = ["long_scoreboard", "barrier", "math_pipe_throttle", "wait", "mio_throttle"]


def _page(kernels):
    columns = [("ID", ""), ("Process ID", ""), ("Kernel Name", ""), ("gpu__time_duration.sum", "nsecond"),
               ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%"), ("launch__shared_mem_per_block", "byte"),
               ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active", "%"),
               ("sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active", "%"),
               ("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "%")]
    columns += [(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio", "") for s in STALLS]
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow([name for name, _ in columns])
    w.writerow([unit for _, unit in columns])
    for i, k in enumerate(kernels):
        row = dict(k, **{"ID": str(i), "Process ID": "77"})
        w.writerow([row.get(name, "") for name, _ in columns])
    return buf.getvalue()


def _kernel(rng, name):
    k = {"Kernel Name": name, "gpu__time_duration.sum": f"{rng.uniform(1e3, 2e6):,.0f}",
         "sm__throughput.avg.pct_of_peak_sustained_elapsed": f"{rng.uniform(1, 99):.2f}",
         "launch__shared_mem_per_block": str(rng.choice([49152, 232448])),
         "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": f"{rng.uniform(0, 90):.2f}",
         "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": f"{rng.uniform(0, 90):.2f}",
         "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": f"{rng.uniform(0, 90):.2f}"}
    for s in STALLS:
        k[f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio"] = f"{rng.uniform(0, 5):.3f}"
    return k


def test_the_raw_page_is_read_per_kernel(tmp_path):
    rng = random.Random(7)
    kernels = [_kernel(rng, f"attn_bwd_{i}(...)") for i in range(3)]
    path = tmp_path / "bwd-ours-d256-n4096-causal.csv"
    path.write_text(_page(kernels))
    got = ncu_summary.read_raw_csv(path)
    assert [g["kernel"] for g in got] == [k["Kernel Name"] for k in kernels]
    for g, k in zip(got, kernels):
        ns = float(k["gpu__time_duration.sum"].replace(",", ""))
        assert g["metrics"]["time_us"] == pytest.approx(ns / 1e3, abs=1e-3)
        assert g["metrics"]["shared_kib_per_block"] == pytest.approx(int(k["launch__shared_mem_per_block"]) / 1024, abs=1e-3)
        assert "dram_throughput_pct" not in g["metrics"]                     # not in the page: left out
        assert g["pipes"] == {"inst_executed_pipe_xu": float(k["sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"]),
                              "pipe_fma_cycles_active": float(k["sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"])}
        want = sorted(((s, float(k[f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio"])) for s in STALLS),
                      key=lambda kv: -kv[1])
        assert [s for s, _ in g["stalls"]] == [s for s, v in want if round(v, 3) > 0]
        assert list(g["tensor_pipes"].values()) == [pytest.approx(float(
            k["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"]), abs=0.01)]


def test_main_writes_every_case_and_refuses_a_wrong_file(tmp_path, capsys):
    rng = random.Random(3)
    paths = []
    for name in ("bwd-ours-d256-n4096-full", "bwd-cudnn-d256-n4096-full"):
        paths.append(tmp_path / f"{name}.csv")
        paths[-1].write_text(_page([_kernel(rng, name + "_kernel")]))
    out = tmp_path / "ncu.json"
    assert ncu_summary.main([str(p) for p in paths] + ["--json", str(out), "--device", "NVIDIA H200"]) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["device"] == "NVIDIA H200" and set(data["cases"]) == {p.stem for p in paths}
    assert "bwd-ours-d256-n4096-full: 1 kernel(s)" in capsys.readouterr().out
    wrong = tmp_path / "trace.csv"
    wrong.write_text("a,b\n1,2\n")
    assert ncu_summary.main([str(wrong)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an ncu raw CSV page" in err[0] and "--page raw" in err[0]


def test_profile_case_refuses_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        profile_case.main(["--heads", "3", "--kv-heads", "2"])
    assert exc.value.code == 2 and "multiple of --kv-heads" in capsys.readouterr().err
    for argv, fragment in ((["--pass", "fwd", "--impl", "gluon_dq"], "use it with --pass bwd"),
                           (["--impl", "gluon_fused", "--head-dim", "256"], "--head-dim 64 or 128"),
                           (["--pass", "bwd", "--impl", "fp8"], "use it with --pass fwd")):
        with pytest.raises(SystemExit) as exc:
            profile_case.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and fragment in err[-1]
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exc:
            profile_case.main([])
        assert "needs a CUDA GPU" in str(exc.value.code)
