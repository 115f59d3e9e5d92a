"""benchmarks.decode: a CPU smoke run writes a valid result file; on a GPU every backend of the
benchmark agrees with flash_decode before anything is timed."""

import json

import pytest
import torch

from benchmarks import decode as bench
from benchmarks import load_results


def test_smoke_run_writes_a_valid_result_file(tmp_path, device):
    if device.type == "cuda":
        pytest.skip("the GPU run is the benchmark itself")
    rc = bench.main(["--device", "cpu", "--batches", "2", "--contexts", "80", "--heads", "4",
                     "--kv-heads", "2", "--head-dim", "32", "--dtype", "fp32", "--out", str(tmp_path)])
    assert rc == 0
    path = next(tmp_path.glob("decode-*.json"))
    res = load_results(path, "decode")
    recs = {r["impl"]: r for r in res["records"]}
    assert set(recs) == {"tilescope:1", "tilescope:auto"}          # SDPA/flex need CUDA
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-4 and r["ms"] > 0 for r in recs.values())
    assert recs["tilescope:1"]["num_splits"] == 1
    assert json.loads(path.read_text())["meta"]["kind"] == "decode"


def test_unknown_impl_is_refused():
    with pytest.raises(SystemExit, match="unknown impl"):
        bench.main(["--device", "cpu", "--impls", "tilescope:1,cudnn9"])


@pytest.mark.gpu
@pytest.mark.parametrize("batch,context", [(1, 32768), (8, 4096)])
def test_every_backend_agrees_with_flash_decode(batch, context):
    dev = torch.device("cuda")
    q, k, v = bench.decode_inputs(batch, 32, 8, context, 128, torch.bfloat16, dev, seed=1)
    ours = bench.make_call("tilescope:auto", q, k, v)[0]()
    ref = bench.reference(q, k, v, range(batch))
    assert bench.rel_error(ours, ref) < 1e-2
    from torch.nn.attention.flex_attention import flex_attention
    flex = torch.compile(flex_attention)
    ran = []
    for impl in bench.IMPLS[2:]:
        fn, ctx = bench.make_call(impl, q, k, v, flex)
        try:
            with ctx():
                other = fn()
        except RuntimeError as exc:        # a backend that does not take this shape says so
            assert "kernel" in str(exc).lower() or "support" in str(exc).lower(), exc
            continue
        assert bench.rel_error(other, ours.float()) < 2e-2, impl
        ran.append(impl)
    assert "flex" in ran and any(i.startswith("sdpa") for i in ran), ran
