"""The app's live GPU source on real hardware (run on the lent GPU; skipped without CUDA)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("streamlit")
from tests.app.headless import open_page  # noqa: E402

PAGES = ("schedule", "block_skip", "online_softmax", "memory")
MASKS = ("full", "causal", "sliding_window:256", "prefix_lm:128", "document:300,500,224")


def gpu_app(page, mask, **extra):
    import torch

    at = open_page(page, timeout=180, source="gpu", seq_len=1024, head_dim=64, block_m=64, block_n=64,
                   dtype="bf16", mask=mask, **extra)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at, torch.cuda.get_device_name()


@pytest.mark.gpu
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("page", PAGES)
def test_live_gpu_source_every_page(page, mask):
    at, device = gpu_app(page, mask)
    specs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    assert specs and all(s["data"] for s in specs)
    if page != "memory":
        banner = " ".join(i.value for i in at.info) + " ".join(c.value for c in at.caption)
        assert device in banner, banner[:400]        # the provenance names the GPU
    assert at.query_params["source"] == "gpu"


@pytest.mark.gpu
def test_live_gpu_schedule_has_measured_sm_lanes():
    at, device = gpu_app("schedule", "causal")
    text = json.dumps([json.loads(el.proto.spec) for el in at.get("plotly_chart")], ensure_ascii=False)
    assert "tile-units" not in text and "µs" in text          # measured, not modelled
    assert device in text
