"""What `regenerate --only presets|runs` records (instrumentation.recording.model_bundle): the
long prefills per preset and their detail level, and the model runs' models built from configs."""

import pytest

from instrumentation.recording import model_bundle as mb
from kernels.presets import preset


def test_long_prefills_cover_8k_32k_and_the_longest_n_of_each_model():
    jobs = mb.long_preset_jobs()
    by = {}
    for j in jobs:
        p = preset(j["preset"])
        assert (j["heads"], j["kv_heads"], j["head_dim"]) == (p.heads, p.kv_heads, p.head_dim)
        assert j["mask"] in p.masks
        by.setdefault(j["preset"], set()).add((j["n"], j["mask"]))
    assert {n for n, _ in by["llama-3-8b"]} == {8192, 32768, 131072}
    assert {n for n, _ in by["qwen2.5-7b"]} == {8192, 32768, 131072}
    assert {n for n, _ in by["mistral-7b"]} == {32768, 131072}          # 8k: data_bundle's preset trace
    assert by["gemma-2-9b"] == {(8192, "causal"), (32768, "causal"), (32768, "sliding_window:4096")}
    names = [mb.long_trace_name(j) for j in jobs]
    assert len(set(names)) == len(names) and "preset-llama-3-8b_n131072_causal_natural" in names


def test_detail_level_and_heads_by_tile_grid():
    """Tile detail never on the first wave's head alone: its items are slower whatever is traced,
    and the pages compare the traced heads' items with the others of their query block."""
    import torch

    assert mb._detail(131072, 128, torch.bfloat16, 32) == ("work", [], [])      # a million-tile grid
    level, blocks, heads = mb._detail(32768, 128, torch.bfloat16, 32)
    assert level == "full" and len(blocks) == mb.TRACED_Q_BLOCKS and blocks[-1] == 32768 // 128 - 1
    assert heads == [16]                                                    # mid-launch (one: data/'s budget)
    assert mb._detail(8192, 128, torch.bfloat16, 28) == ("full", [8192 // 128 - 1], [0, 14, 27])


def _fake_recording(monkeypatch, tmp_path, meta):
    from instrumentation.trace import Trace

    (tmp_path / "manifest.json").write_text("{}")
    monkeypatch.setattr(Trace, "load", staticmethod(lambda path: type("T", (), {"meta": meta})()))
    return tmp_path


@pytest.mark.parametrize("n, heads, fresh", [(8192, [0], False), (8192, [0, 16, 31], True),
                                             (32768, [0], False), (32768, [16], True)])
def test_a_first_wave_only_preset_recording_is_made_again(monkeypatch, tmp_path, n, heads, fresh):
    job = next(j for j in mb.long_preset_jobs() if j["preset"] == "llama-3-8b" and j["n"] == n)
    meta = {"level": "full", "launches": {"work": "work-only launch"}, "mask": job["mask"],
            "preset": job["preset"], "traced_heads": heads,
            "shape": {"N": n, "N_k": n, "H": job["heads"], "H_kv": job["kv_heads"], "D": job["head_dim"]}}
    assert mb._existing_long_ok(_fake_recording(monkeypatch, tmp_path, meta), job) is fresh


def test_model_runs_build_from_configs_with_their_layer_kinds():
    pytest.importorskip("transformers")
    llama = mb.build_model("llama-3-8b-4l", "cpu", cpu=True)
    assert llama.config.num_hidden_layers == 4 and llama.config.num_key_value_heads == 2
    qwen = mb.build_model("qwen2.5-7b-4l-sliding", "cpu", cpu=True)
    assert qwen.config.layer_types == ["sliding_attention", "full_attention"] * 2
    assert qwen.config.sliding_window == 8
    assert mb.MODEL_RUNS["llama-3-8b-4l"]["config"]["num_attention_heads"] == 32
