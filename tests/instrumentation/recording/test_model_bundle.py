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


def test_detail_level_by_tile_grid():
    import torch

    assert mb._detail(131072, 128, torch.bfloat16) == ("work", [])           # a million-tile grid
    level, blocks = mb._detail(32768, 128, torch.bfloat16)
    assert level == "full" and len(blocks) == mb.TRACED_Q_BLOCKS and blocks[-1] == 32768 // 128 - 1


def test_model_runs_build_from_configs_with_their_layer_kinds():
    pytest.importorskip("transformers")
    llama = mb.build_model("llama-3-8b-4l", "cpu", cpu=True)
    assert llama.config.num_hidden_layers == 4 and llama.config.num_key_value_heads == 2
    qwen = mb.build_model("qwen2.5-7b-4l-sliding", "cpu", cpu=True)
    assert qwen.config.layer_types == ["sliding_attention", "full_attention"] * 2
    assert qwen.config.sliding_window == 8
    assert mb.MODEL_RUNS["llama-3-8b-4l"]["config"]["num_attention_heads"] == 32
