"""The sidebar's one-line summary of a recording's settings (shown instead of locked controls)."""

import random

from app.sidebar import recording_settings_text


def test_summary_names_every_setting_and_kv_only_when_it_differs():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.choice([256, 4096, 16384])
        v = dict(seq_len=n, mask=rng.choice(["causal", "full", "sliding_window:128"]),
                 head_dim=rng.choice([64, 128]), block_m=128, block_n=rng.choice([64, 128]),
                 dtype=rng.choice(["bf16", "fp16"]), batch=rng.randint(1, 8), heads=32,
                 kv_len=rng.choice([0, n, 2 * n]), kv_heads=rng.choice([0, 32, 8]),
                 schedule=rng.choice(["natural", "persistent"]))
        text = recording_settings_text(v)
        assert text.startswith(f"N {n:,} · mask {v['mask']} · D {v['head_dim']} · blocks 128×{v['block_n']}")
        assert f"B {v['batch']} · H 32" in text and text.endswith(f"schedule {v['schedule']}")
        assert ("N_k" in text) == (v["kv_len"] not in (0, n))
        assert ("H_kv 8" in text) == (v["kv_heads"] == 8) and "H_kv 32" not in text
