"""The benchmark harness: its pure parts on the CPU, every schedule in the interpreter against a
float64 reference, smoke runs of the three commands at tiny sizes, and (gpu) correctness of every
schedule at realistic sizes. Timings are measured by the benchmarks, never asserted here."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

import benchmarks as bh
from benchmarks import attention as att
from benchmarks import attention_impls as att_impls
from benchmarks import overhead as ovh
from benchmarks import tune as tun
from kernels import flash_attention, reference_attention
from kernels.masks import parse_mask
from instrumentation.recording import make_inputs

SCHEDULES = ("natural", "longest_first", "persistent")
SMALL_MASKS = ("full", "causal", "sliding_window:37", "prefix_lm:29", "document:31,50,19")


# -- FLOP counting ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 7, 64, 100])
@pytest.mark.parametrize("mask", ["full", "causal", "sliding_window:5", "sliding_window:1",
                                  "prefix_lm:3", "prefix_lm:0", "document"])
def test_visible_pairs_match_dense_mask(n, mask):
    spec = bh.resolve_mask(mask, n)
    assert bh.visible_pairs(spec, n) == int(spec.dense(n).sum())


def test_flop_convention():
    n = 1000
    assert bh.visible_pairs("full", n) == n * n
    assert bh.visible_pairs("causal", n) == n * (n + 1) // 2
    w = 100
    assert bh.visible_pairs(f"sliding_window:{w}", n) == sum(min(i + 1, w) for i in range(n))
    assert bh.attention_flops(4, 16, n, 128, "full") == 4 * 4 * 16 * n * n * 128
    assert bh.attention_flops(2, 3, n, 64, "causal") == 4 * 2 * 3 * 64 * n * (n + 1) // 2
    assert "N(N+1)/2" in bh.FLOP_CONVENTION


def test_tile_fraction():
    assert bh.tile_fraction("full", 256, 64, 64) == 1.0
    assert bh.tile_fraction("causal", 256, 64, 64) == pytest.approx(10 / 16)
    assert bh.tile_fraction("sliding_window:64", 1024, 64, 64) < 0.15


@pytest.mark.parametrize("n", [1, 3, 11, 64, 1000, 1024, 16384])
def test_document_lengths_uneven_and_sum_to_n(n):
    lens = bh.document_lengths(n)
    assert sum(lens) == n and min(lens) >= 1
    if n >= 64:
        assert len(set(lens)) > 1
    spec = bh.resolve_mask("document", n)
    assert spec.kind == "document" and sum(spec.param) == n


def test_resolve_mask_explicit_document_only_where_it_fits():
    assert bh.resolve_mask("document:10,20", 30).param == (10, 20)
    assert bh.resolve_mask("document:10,20", 64) is None
    with pytest.raises(ValueError):
        bh.resolve_mask("banana", 64)


def test_device_slug_and_lists():
    assert bh.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert bh.device_slug("NVIDIA  H200 (x)") == "nvidia-h200-x"
    assert bh.split_list("full,causal,document:10,20,prefix_lm:5") == \
        ["full", "causal", "document:10,20", "prefix_lm:5"]
    assert att.parse_impls("naive,tilescope:persistent,sdpa_cudnn")[0] == "sdpa_cudnn"
    with pytest.raises(SystemExit):
        att.parse_impls("flashy")


# -- result files ------------------------------------------------------------------------------

def _meta(kind="attention"):
    m = {k: "x" for k in bh.META_KEYS}
    m.update(schema=bh.SCHEMA, kind=kind, matmul_tflops=float("nan"), flop_convention="...")
    return m


def _rec(**kw):
    r = dict(impl="tilescope", mask="causal", seq_len=1024, head_dim=128, dtype="bf16", batch=4,
             heads=16, ms=1.0, tflops=100.0, rel_err=1e-3, status="ok",
             config=dict(block_m=128, block_n=64, num_warps=8, num_stages=3))
    r.update(kw)
    return r


def test_write_validate_roundtrip(tmp_path):
    obj = {"meta": _meta(), "records": [_rec(), _rec(impl="naive", config=None, ms=float("nan"),
                                                     tflops=None, status="oom")]}
    path = bh.write_results(obj, tmp_path / "a" / "dev.json", "attention", copy_to=tmp_path / "copy")
    text = path.read_text()
    assert "NaN" not in text
    back = bh.load_results(path, "attention")
    assert back["meta"]["matmul_tflops"] is None
    assert back["records"][1]["ms"] is None
    assert json.loads((tmp_path / "copy" / "dev.json").read_text()) == back


@pytest.mark.parametrize("breakage, needle", [
    (lambda o: o["meta"].pop("device"), "device"),
    (lambda o: o["meta"].update(schema="other/9"), "schema"),
    (lambda o: o["records"][0].pop("rel_err"), "rel_err"),
    (lambda o: o["records"][0].update(ms="fast"), "ms"),
    (lambda o: o["records"][0].update(ms=-1.0), "positive"),
    (lambda o: o["records"][0].update(ms=None), "no ms"),
    (lambda o: o["records"][0].update(config={"block_m": 64}), "config"),
    (lambda o: o.pop("records"), "records"),
])
def test_validator_rejects(breakage, needle):
    obj = {"meta": _meta(), "records": [_rec()]}
    breakage(obj)
    with pytest.raises(ValueError, match=needle):
        bh.validate_results(obj, "attention")


def test_validator_kinds():
    obj = {"meta": _meta("overhead"), "records": [dict(mask="full", seq_len=4096, head_dim=128,
           dtype="bf16", batch=4, heads=16, level="work", untraced_ms=1.0, traced_ms=1.1,
           overhead_pct=10.0)]}
    bh.validate_results(obj, "overhead")
    with pytest.raises(ValueError, match="kind"):
        bh.validate_results(obj, "attention")


# -- ratio table -------------------------------------------------------------------------------

def test_ratio_table():
    recs = [
        _rec(impl="sdpa_cudnn", mask="full", ms=2.0, config=None),
        _rec(impl="tilescope", mask="full", ms=1.0, tiles_frac=1.0),
        _rec(impl="sdpa_cudnn", mask="causal", ms=1.0, config=None),
        _rec(impl="tilescope", mask="causal", ms=0.8, tiles_frac=0.5),
        _rec(impl="naive", mask="causal", ms=None, tflops=None, status="oom", config=None),
        _rec(impl="tilescope", mask="document", ms=0.25, tiles_frac=0.2),
        _rec(impl="tilescope", mask="full", seq_len=2048, ms=4.0),
    ]
    df = att.ratio_table(recs, mask_order=["full", "causal", "document"], matmul=400.0)
    got = {(r.mask, r.seq_len, r.impl): r for r in df.itertuples()}
    assert got[("full", 1024, "tilescope")].x_cudnn == pytest.approx(0.5)
    assert got[("causal", 1024, "tilescope")].x_cudnn == pytest.approx(0.8)
    assert got[("causal", 1024, "tilescope")].x_full == pytest.approx(0.8)
    assert got[("document", 1024, "tilescope")].x_full == pytest.approx(0.25)
    assert pd.isna(got[("document", 1024, "tilescope")].x_cudnn)
    assert pd.isna(got[("full", 2048, "tilescope")].x_cudnn)
    assert got[("full", 1024, "tilescope")].pct_matmul == pytest.approx(25.0)
    assert list(df["mask"]) [:2] == ["full", "full"] and df["mask"].iloc[-1] == "document"
    text = att.format_table(df)
    assert "sdpa_cudnn" in text and "0.50" in text
    piv = att.summary_pivot(df)
    assert piv.loc[("document", 1024), "tilescope"] == pytest.approx(0.25)
    assert piv.loc[("causal", 1024), "tilescope"] == pytest.approx(0.8)
    assert piv.loc[("document", 1024), "tiles_frac"] == pytest.approx(0.2)


# -- tuned config files -------------------------------------------------------------------------

def _tuned_file():
    def e(d, mask, n, bm):
        return {"head_dim": d, "mask": mask, "seq_len": n, "dtype": "bf16",
                "config": {"block_m": bm, "block_n": 64, "num_warps": 4, "num_stages": 3}}
    return {"meta": {}, "best": [e(128, "full", 4096, 128), e(128, "full", 16384, 64),
                                 e(128, "causal", 4096, 32), e(64, "causal", 4096, 16)]}


def test_config_file_lookup(tmp_path):
    p = tmp_path / "tuned.json"
    p.write_text(json.dumps(_tuned_file()))
    t = bh.TunedConfigs.load(p)
    assert t.lookup(128, "full", 4096)["block_m"] == 128
    assert t.lookup(128, "full", 16384)["block_m"] == 64
    assert t.lookup(128, "full", 32768)["block_m"] == 64          # nearest N on a log scale
    assert t.lookup(128, "full", 1024)["block_m"] == 128
    assert t.lookup(128, "causal", 16384)["block_m"] == 32
    assert t.lookup(128, "sliding_window:1024", 8192)["block_m"] == 32   # causal-like -> causal
    assert t.lookup(128, parse_mask("document:1,2"), 3)["block_m"] == 32
    assert t.lookup(64, "full", 4096)["block_m"] == 16             # only other kinds: any
    assert t.lookup(256, "full", 4096) is None
    assert t.lookup(128, "full", 4096, dtype="fp16") is None
    assert set(t.lookup(128, "full", 4096)) == set(bh.CONFIG_KEYS)


def test_config_file_formats_and_errors(tmp_path):
    t = bh.TunedConfigs.parse([{"head_dim": 64, "config": {"bm": 64, "bn": 32, "warps": 4,
                                                           "stages": 2}}])
    assert t.lookup(64, "causal", 999) == {"block_m": 64, "block_n": 32, "num_warps": 4,
                                           "num_stages": 2}
    keyed = {"best": {"128/full/4096": _tuned_file()["best"][0]}}
    assert bh.TunedConfigs.parse(keyed).lookup(128, "full", 4096)["block_m"] == 128
    for bad in ({"nothing": 1}, "text", [{"config": {}}], [{"head_dim": 64, "config": {"block_m": 64}}],
                [{"head_dim": 64, "config": {"block_m": 0, "block_n": 1, "num_warps": 1,
                                             "num_stages": 1}}]):
        with pytest.raises(ValueError):
            bh.TunedConfigs.parse(bad)
    p = tmp_path / "broken.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="JSON"):
        bh.TunedConfigs.load(p)


def test_tune_candidates_and_best():
    cands = tun.candidates()
    assert len(cands) == 2 * 3 * 2 * 3 - 9
    assert not any(c["block_m"] == 64 and c["num_warps"] == 8 for c in cands)
    assert len(tun.candidates(prune=False)) == 36
    case = [dict(head_dim=128, mask="full", seq_len=4096, dtype="bf16", schedule="natural",
                 config=c, status=s, ms=ms, tflops=1.0, is_default=dflt)
            for c, s, ms, dflt in [(cands[0], "ok", 2.0, True), (cands[1], "ok", 1.0, False),
                                   (cands[2], "compile_error", None, False)]]
    best = tun.best_entry(case)
    assert best["config"] == cands[1] and best["speedup_vs_default"] == pytest.approx(2.0)
    assert bh.TunedConfigs.parse({"best": [best]}).lookup(128, "full", 4096) == cands[1]
    assert tun.best_entry(case[2:]) is None
    assert list(tun.top_table(case)["rank"]) == [1, 2]


# -- correctness gate ---------------------------------------------------------------------------

def test_check_output_rejects_a_wrong_output():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2, 64, 32, generator=g)
    ok, err = bh.check_output(ref.to(torch.bfloat16), ref, torch.bfloat16)
    assert ok and err < 5e-3
    wrong = ref + 0.1 * torch.randn(ref.shape, generator=g)
    ok, err = bh.check_output(wrong.to(torch.bfloat16), ref, torch.bfloat16)
    assert not ok and err > 2e-2
    shifted = ref.clone()
    shifted[0, :8] = shifted[0, 8:16]          # a few rows from the wrong place
    assert not bh.check_output(shifted, ref, torch.float32)[0]
    nan = ref.clone()
    nan[1, 3, 4] = float("nan")
    assert bh.check_output(nan, ref, torch.float32) == (False, math.inf)
    with pytest.raises(ValueError):
        bh.check_output(ref[:1], ref, torch.float32)


@pytest.mark.parametrize("mask", SMALL_MASKS)
def test_reference_slice_matches_float64(mask):
    q, k, v = make_inputs(1, 3, 100, 32, "fp32", seed=3)
    heads = bh.check_heads(1, 3)
    ref64 = reference_attention(q, k, v, mask)[0]
    got = bh.reference_slice(q, k, v, mask, heads, chunk=48)
    assert heads == [0, 2]
    assert bh.rel_error(got, bh.take_heads(ref64, heads)) < 1e-5


def test_harness_refuses_to_time_a_wrong_kernel(tmp_path, monkeypatch, device):
    def broken(q, k, v, **kw):
        o = flash_attention(q, k, v, **kw)
        return o + 0.2 * torch.randn_like(o)

    monkeypatch.setattr(att_impls, "flash_attention", broken)   # make_call resolves it there
    timed = []
    monkeypatch.setattr(att, "time_ms", lambda *a, **k: timed.append(1) or 1.0)
    args = att.build_parser().parse_args(
        ["--seq-lens", "64", "--batch", "1", "--heads", "2", "--head-dim", "32", "--masks", "causal",
         "--impls", "tilescope,naive", "--out", str(tmp_path), "--no-matmul",
         "--device", device.type])
    res = att.run(args, [])
    by = {r["impl"]: r for r in res["records"]}
    assert by["tilescope"]["status"] == "wrong" and by["tilescope"]["ms"] is None
    assert by["tilescope"]["rel_err"] > 2e-2
    assert by["naive"]["status"] == "ok" and len(timed) == 1


# -- every schedule and a few configs vs float64, in the interpreter (compiled on a GPU) --------

BLOCKS = [(32, 32), (64, 32), (32, 64)]
# every (schedule, mask), (schedule, blocks) and (mask, blocks) pair once: a Latin square, the
# blocks of schedule i and mask j are BLOCKS[(i + j) % 3] (tests/kernels/test_flash.py runs every
# schedule with every mask at 32x32 as well)
SCHEDULE_MASK_BLOCKS = [pytest.param(s, m, BLOCKS[(i + j) % len(BLOCKS)], id=f"{s}-{m}-{BLOCKS[(i + j) % 3]}")
                        for i, s in enumerate(SCHEDULES) for j, m in enumerate(SMALL_MASKS)]


@pytest.mark.parametrize("schedule,mask,blocks", SCHEDULE_MASK_BLOCKS)
def test_schedules_and_configs_match_float64(schedule, mask, blocks, device):
    q, k, v = make_inputs(1, 2, 100, 32, "fp32", seed=1, device=device)
    out = flash_attention(q, k, v, mask=mask, block_m=blocks[0], block_n=blocks[1],
                          schedule=schedule, num_warps=4, num_stages=2)
    ref = reference_attention(q, k, v, mask)[0]
    assert (out.double().cpu() - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_schedules_bf16_pass_the_gate(schedule, device):
    q, k, v = make_inputs(1, 2, 128, 64, "bf16", seed=2, device=device)
    out = flash_attention(q, k, v, mask="causal", block_m=64, block_n=32, schedule=schedule)
    ok, err = bh.check_output(out.cpu(), reference_attention(q, k, v, "causal")[0], torch.bfloat16)
    assert ok, err


# -- the commands, tiny ---------------------------------------------------------------------------

def test_attention_command_smoke(tmp_path, device, capsys):
    # one length (96): each of our records is an interpreter run timed 4 times after a warm-up
    # and a checked run; the command's 64-row runs are test_attention_uses_config_file's and
    # test_harness_refuses_to_time_a_wrong_kernel's
    rc = att.main(["--seq-lens", "96", "--batch", "1", "--heads", "2", "--head-dim", "32",
                   "--dtype", "fp32", "--masks", "full,causal,document,sliding_window:16",
                   "--impls", "tilescope,tilescope:persistent,sdpa_cudnn,naive", "--rep", "5",
                   "--warmup", "1", "--no-matmul", "--out", str(tmp_path / "o"),
                   "--copy-to", str(tmp_path / "c"), "--device", device.type])
    assert rc == 0
    files = list((tmp_path / "o").glob("*.json"))
    assert len(files) == 1 and (tmp_path / "c" / files[0].name).exists()
    res = bh.load_results(files[0], "attention")
    recs = res["records"]
    assert {r["impl"] for r in recs if r["mask"] == "document"} == {"tilescope", "tilescope:persistent"}
    ours = [r for r in recs if r["impl"].startswith("tilescope")]
    assert all(r["status"] == "ok" and r["ms"] > 0 and r["rel_err"] < 1e-4 for r in ours)
    assert all(0 < r["tiles_frac"] <= 1 and set(r["config"]) == set(bh.CONFIG_KEYS) for r in ours)
    # cuDNN has no fp32 kernel: 'unsupported' (or 'error' if torch words it differently)
    assert {r["status"] for r in recs if r["impl"] == "sdpa_cudnn"} <= {"ok", "unsupported", "error"}
    assert "command" in res["meta"] and "visible" in res["meta"]["flop_convention"]
    out = capsys.readouterr().out
    assert "x_cudnn" in out and "tiles_frac" in out


def test_attention_uses_config_file(tmp_path, device):
    cfg = tmp_path / "tuned.json"
    cfg.write_text(json.dumps([{"head_dim": 32, "mask": "causal", "config": {
        "block_m": 32, "block_n": 64, "num_warps": 4, "num_stages": 2}}]))
    args = att.build_parser().parse_args(
        ["--seq-lens", "64", "--batch", "1", "--heads", "1", "--head-dim", "32", "--masks",
         "causal,full", "--impls", "tilescope", "--out", str(tmp_path), "--no-matmul", "--rep", "1",
         "--config-file", str(cfg), "--device", device.type])
    recs = att.run(args, [])["records"]
    assert all(r["config"]["block_m"] == 32 and r["config_source"] == "tuned" for r in recs)


def test_attention_times_a_case_in_rounds(tmp_path, device, monkeypatch):
    # --repeats 2: every implementation of a case once a round, the median kept with every round
    order = []
    real = att.time_ms
    monkeypatch.setattr(att, "time_ms", lambda fn, *a, **kw: order.append(fn) or real(fn, *a, **kw))
    args = att.build_parser().parse_args(
        ["--seq-lens", "64", "--batch", "1", "--heads", "1", "--head-dim", "32", "--masks", "causal,full",
         "--impls", "tilescope,tilescope:persistent", "--out", str(tmp_path), "--no-matmul", "--rep", "1",
         "--warmup", "1", "--repeats", "2", "--device", device.type])
    res = att.run(args, [])
    recs = res["records"]
    assert [(r["mask"], r["impl"]) for r in recs] == [(m, i) for m in ("causal", "full")
                                                      for i in ("tilescope", "tilescope:persistent")]
    for r in recs:
        assert r["status"] == "ok" and len(r["ms_repeats"]) == 2
        assert r["ms"] == pytest.approx(sum(r["ms_repeats"]) / 2)
    # per mask: implementation A, B, then A, B again (not A, A, B, B)
    assert len(order) == 8 and order[0] is order[2] and order[1] is order[3] and order[0] is not order[1]
    assert "median of 2 rounds" in res["meta"]["timing"] or device.type != "cuda"


def test_config_file_auto(tmp_path, device):
    from instrumentation.recording.environment import environment

    name = environment(device)["device_name"]
    assert bh.load_config_file("auto", tmp_path, name) is None          # nothing tuned yet
    (tmp_path / f"tuned-{bh.device_slug(name)}.json").write_text(json.dumps(_tuned_file()))
    t = bh.load_config_file("auto", tmp_path, name)
    assert t.lookup(128, "full", 4096)["block_m"] == 128
    assert bh.load_config_file(None, tmp_path, name) is None


def test_tune_command_smoke(tmp_path, device):
    rc = tun.main(["--quick", "--head-dims", "32", "--seq-lens", "64", "--batch", "1", "--heads",
                   "2", "--block-m", "32,64", "--block-n", "32", "--warps", "4", "--stages", "2",
                   "--rep", "3", "--warmup", "1", "--jobs", "0", "--out", str(tmp_path),
                   "--device", device.type])
    assert rc == 0
    res = bh.load_results(next(tmp_path.glob("tuned-*.json")), "tune")
    assert len(res["best"]) == 2
    cases = {(b["mask"], b["seq_len"]) for b in res["best"]}
    assert cases == {("full", 64), ("causal", 64)}
    t = bh.TunedConfigs.parse(res)
    assert t.lookup(32, "causal", 64)["block_m"] in (32, 64, 128)   # 128: the default config
    assert all(r["status"] == "ok" for r in res["records"])


def test_tune_budget_skips(tmp_path, device):
    res = tun.run(tun.build_parser().parse_args(
        ["--head-dims", "32", "--seq-lens", "64", "--masks", "causal", "--batch", "1", "--heads",
         "1", "--block-m", "32", "--block-n", "32", "--warps", "4", "--stages", "2", "--jobs", "0",
         "--budget-s", "0", "--out", str(tmp_path), "--device", device.type]), [])
    assert {r["status"] for r in res["records"]} == {"skipped"}
    assert res["meta"]["stopped_by_budget"] and res["best"] == []


def test_overhead_command_smoke(tmp_path, device):
    rc = ovh.main(["--seq-lens", "64", "--batch", "1", "--heads", "2", "--head-dim", "32",
                   "--dtype", "fp32", "--masks", "causal,full", "--repeats", "1",
                   "--schedules", "natural,persistent", "--out", str(tmp_path),
                   "--device", device.type])
    assert rc == 0
    res = bh.load_results(next(tmp_path.glob("overhead-*.json")), "overhead")
    recs = res["records"]
    assert len(recs) == 2 * 2 * 2
    assert {r["level"] for r in recs} == {"work", "full"}
    assert all(r["output_ok"] for r in recs)
    full = [r for r in recs if r["level"] == "full"]
    assert all(r["tile_rows"] > 0 for r in full)
    if device.type == "cuda":
        assert all(r["overhead_pct"] is not None for r in recs)
    else:
        assert all(r["overhead_pct"] is None for r in recs)


def test_overhead_backward_part_records_each_case(tmp_path, device):
    # the backward part: per (D, mask) the host time of our call, of autograd through ours and
    # through SDPA, and their ratio (the interpreter: one tiny shape, a smoke run)
    assert ovh.main(["--parts", "backward", "--out", str(tmp_path), "--device", device.type]) == 0
    res = bh.load_results(next(tmp_path.glob("overhead-*.json")), "overhead")
    recs = res["backward"]
    assert [r["mask"] for r in recs][:2] == ["causal", "full"] and res["records"] == []
    for r in recs:
        times = [r[name]["median_us"] for name in ("ours", "ours_autograd", "sdpa_autograd")]
        assert all(t > 0 for t in times)
        assert r["ours_over_sdpa"] == pytest.approx(times[1] / times[2])
        # our backward, timed on the thread autograd runs it, inside the whole calls timed with it
        assert 0 < r["in_backward_us"] < r["in_backward_of_us"]
    assert "ours_autograd" in res["meta"]["backward_method"]


def test_overhead_pct():
    assert ovh.overhead_pct(1.1, 1.0) == pytest.approx(10.0)
    assert ovh.overhead_pct(None, 1.0) is None and ovh.overhead_pct(1.0, 0.0) is None


# -- GPU: every schedule at realistic sizes ------------------------------------------------------

GPU_MASKS = ("full", "causal", "sliding_window:1024", "prefix_lm:512", "document")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1024, 4096, 16384])
@pytest.mark.parametrize("mask", GPU_MASKS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_gpu_realistic_sizes_every_schedule(n, mask, schedule):
    b, h, d = 2, 4, 128
    q, k, v = make_inputs(b, h, n, d, "bf16", seed=5, device="cuda")
    spec = bh.resolve_mask(mask, n)
    out = flash_attention(q, k, v, mask=spec, schedule=schedule)
    heads = bh.check_heads(b, h)
    ok, err = bh.check_output(bh.take_heads(out, heads), bh.reference_slice(q, k, v, spec, heads),
                              torch.bfloat16)
    assert ok, f"rel_err {err:.3g} vs float32 reference"
    if spec.kind in ("full", "causal"):
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=spec.kind == "causal")
        err_sdpa = bh.rel_error(out, sdpa)
        assert err_sdpa < 2e-2, f"rel_err {err_sdpa:.3g} vs SDPA"


@pytest.mark.gpu
def test_gpu_tuned_candidates_compile_or_fail_cleanly(tmp_path):
    res = tun.run(tun.build_parser().parse_args(
        ["--head-dims", "128", "--seq-lens", "1024", "--masks", "causal", "--batch", "1",
         "--heads", "4", "--block-m", "128", "--block-n", "64,128", "--warps", "8",
         "--stages", "3,4", "--jobs", "2", "--rep", "5", "--warmup", "1", "--out", str(tmp_path)]), [])
    assert res["best"] and all(r["status"] in ("ok", "compile_error") for r in res["records"])
    assert np.isfinite(res["best"][0]["ms"])


def test_fp8_records_say_what_ran(monkeypatch):
    """An FP8 record's config is the launch that runs (kernels.fp8.default_launch): on Hopper the
    full mask's warp-specialised options and, for a long causal call, the split with its plain
    diagonal pass; without warp specialisation the plain loop at the masked tiles. The table
    shows the loop after the options."""
    import kernels.fp8 as fp8
    import kernels.fp8_quant as fq
    from benchmarks.attention_table import _cfg_text

    def config(d, mask, n):
        rec = dict(head_dim=d, seq_len=n, dtype="bf16")
        assert att_impls.kernel_config("tilescope_fp8", rec, None, parse_mask(mask, n), "cpu") is None
        return rec["config"]

    plain = config(128, "causal", 16384)
    assert (plain["block_n"], plain["num_warps"], plain["loop"]) == (64, 4, "plain")
    for module in (fp8, fq):
        monkeypatch.setattr(module, "warp_specialize_supported", lambda device: True)
    split, full = config(128, "causal", 16384), config(128, "full", 4096)
    assert split == dict(block_m=128, block_n=256, num_warps=4, num_stages=2, loop="split", partial_warps=8,
                         partial_stages=1)
    assert (full["num_warps"], full["num_stages"], full["loop"]) == (4, 2, "warp-specialised")
    assert _cfg_text(split) == "128x256 w4 s2 split" and _cfg_text(plain) == "128x64 w4 s3"
