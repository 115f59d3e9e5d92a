"""scripts/varlen_tiles.py: a CPU smoke run (Triton's interpreter, tiny shapes) writes a valid result
file in which every implementation agreed with float64 attention before it was timed and the
default call's row names the tiles it launched; without a GPU it refuses in one line. The committed
H200 file is checked for the same layout and for ratios that follow from its times."""

import importlib.util
import json
import pathlib

import pytest
import torch

from benchmarks import CONFIG_KEYS, load_results

ROOT = pathlib.Path(__file__).resolve().parents[2]
H200 = ROOT / "data" / "benchmarks" / "varlen-tiles-nvidia-h200.json"


def _script():
    spec = importlib.util.spec_from_file_location("varlen_tiles_script", ROOT / "scripts" / "varlen_tiles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiles(config):
    return "/".join(str(config[key]) for key in CONFIG_KEYS)


def test_cpu_smoke_run_checks_every_call_against_float64_and_names_the_default_tiles(tmp_path, device):
    if device.type == "cuda":
        pytest.skip("on a GPU the script is the benchmark itself")
    import kernels.varlen as varlen

    rc = _script().main(["--cpu-smoke", "--batches", "ragged3", "--variants", "32/16/1/1", "--rounds", "1",
                         "--out", str(tmp_path)])
    assert rc == 0
    path, = tmp_path.glob("varlen-tiles-*.json")
    res = load_results(path, "varlen_tiles")
    recs = {r["impl"]: r for r in res["records"]}
    launch = varlen._launch(varlen._mask_spec("causal"), 3, 58, 40, 40, 2, 16, torch.float32, False, 1,
                            None, None, None, None, True)
    default = f"varlen default ({launch.block_m}/{launch.block_n}/{launch.num_warps}/{launch.num_stages})"
    assert set(recs) == {default, "varlen 32/16/1/1", "dense padded"}
    assert recs[default]["default"] and _tiles(recs[default]["config"]) == default[16:-1]
    assert not recs["varlen 32/16/1/1"]["default"] and _tiles(recs["varlen 32/16/1/1"]["config"]) == "32/16/1/1"
    for r in recs.values():
        assert r["status"] == "ok" and r["lens"] == [40, 17, 1] and r["err_ref"] == "float64"
        assert r["rel_err"] < 1e-5 and r["ms"] > 0 and r["tflops"] > 0 and r["speed_vs_flex"] is None
    assert res["meta"]["command"].startswith("python scripts/varlen_tiles.py --cpu-smoke")


@pytest.mark.parametrize("argv, message", [([], "no CUDA GPU"), (["--cpu-smoke", "--variants", "64/64"], "block_m/"),
                                           (["--cpu-smoke", "--batches", "16x1024"], "unknown batch 16x1024")])
def test_refusals_are_one_line(argv, message, device):
    if device.type == "cuda" and not argv:
        pytest.skip("a GPU is there")
    with pytest.raises(SystemExit, match=message) as exc:
        _script().main(argv)
    assert "\n" not in str(exc.value)


def test_the_h200_file_holds_every_batch_with_its_tiles_and_consistent_ratios():
    batches = _script().BATCHES             # the script registers its result kind
    res = load_results(H200, "varlen_tiles")
    flex = {r["batch"]: r["ms"] for r in res["records"] if r["impl"] == "flex document"}
    assert set(flex) == set(batches)
    for r in res["records"]:
        assert r["status"] == "ok" and r["lens"] == batches[r["batch"]] and 0 <= r["rel_err"] < 2e-2
        assert r["speed_vs_flex"] > 0 and abs(r["speed_vs_flex"] - flex[r["batch"]] / r["ms"]) < 1e-9
        assert sorted(r["ms_rounds"])[1] == r["ms"] and r["err_ref"] == "float64"
        if r["impl"].startswith("varlen"):
            assert r["impl"].endswith(("(" + _tiles(r["config"]) + ")", " " + _tiles(r["config"]))), r["impl"]
            assert r["default"] == r["impl"].startswith("varlen default")
    assert json.loads(H200.read_text())["meta"]["device"] == "NVIDIA H200"


def test_the_doc_table_quotes_the_h200_file():
    """docs/performance.md's tile table: 128x64 / 64x64 / the default call's speed against Flex
    (2 decimals, with the default's tiles) and Flex ms (3 decimals), from the file."""
    lines = (ROOT / "docs" / "performance.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "`varlen-tiles-nvidia-h200.json`" in line)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[start:start + 20]
            if line.startswith("| ") and "x" in line.split("|")[2]][1:]
    records = json.loads(H200.read_text())["records"]
    recs = {(r["batch"], r["impl"]): r for r in records}
    defaults = {r["batch"]: r for r in records if r["default"]}
    names = {"32 of 64 … 2048": "mixed32", "9 of 1 … 8192 (below)": "ragged9"}
    assert len(rows) == 7
    for label, old, new, default, flex_ms in rows:
        batch = names.get(label, label.replace(" ", ""))
        for quoted, impl in ((old, "varlen 128/64/8/3"), (new, "varlen 64/64/4/3")):
            assert quoted == f"{recs[batch, impl]['speed_vs_flex']:.2f}x", (label, impl)
        d = defaults[batch]
        assert default == f"{d['speed_vs_flex']:.2f}x ({_tiles(d['config'])})", label
        assert flex_ms == f"{recs[batch, 'flex document']['ms']:.3f}", label
