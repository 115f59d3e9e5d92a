"""instrumentation.watch: a training loop watched into a growing model run (format version 2).

Tiny random-weight transformers Llama models (tests/instrumentation/test_hf.py), fp32, in the
interpreter: the traced steps and their backward, weights equal to the unwatched run's, refusals
in one line, retention, marked steps, a killed job's run, two gloo ranks into one run.
"""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from instrumentation import hf  # noqa: E402
from instrumentation.recording import model_run_stream as stream  # noqa: E402
from instrumentation.recording.model_run import ModelRun, ModelRunFormatError  # noqa: E402
from instrumentation.watch import WATCH_NAME, watch  # noqa: E402

from .test_hf import prompt, tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def trained(out=None, steps=6, on_step=None, **options):
    """A tiny Llama trained `steps` steps (AdamW), watched into `out` when given."""
    model = tiny_model("LlamaForCausalLM")
    hf.use_tilescope(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = prompt(12, batch=2)
    w = watch(model, out, **options) if out is not None else None
    for s in range(steps):
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if on_step:
            on_step(s, w, model)
    if w is not None:
        w.close()
    return model


def steps_of(out):
    return sorted({c.step for c in ModelRun.load(out, traces=False).calls})


def test_six_steps_every_two_with_backward_equal_the_unwatched_weights(tmp_path):
    out = tmp_path / "run"
    seen = {}

    def check(s, w, model):
        seen.setdefault("impl", []).append(model.config._attn_implementation)
        if s == 3:
            w.flush()
            seen["after 3"] = steps_of(out)

    watched = trained(out, on_step=check, every=2, backward=True)
    plain = trained()
    assert seen["after 3"] == [0, 2]
    # untraced steps run hf's own attention (nothing of the watcher but its pre-hook)
    assert seen["impl"] == [WATCH_NAME, hf.NAME] * 3
    run = ModelRun.load(out)
    assert sorted({c.step for c in run.calls}) == [0, 2, 4]
    for step in (0, 2, 4):
        calls = [c for c in run.calls if c.step == step]
        assert sorted(c.layer for c in calls) == [0, 1]
        for c in calls:
            assert c.rank == 0 and c.phase == "prefill" and (c.n_q, c.n_k, c.batch) == (12, 12, 2)
            assert {"work", "bwd_work"} <= set(c.trace.tables)
            assert c.trace.meta["backward"]["grad_out"] == "given by the caller"   # the step's real dO
            assert len(c.trace.tables["work"]) and len(c.trace.tables["bwd_work"])
    assert watched.config._attn_implementation == hf.NAME
    for (name, p), q in zip(watched.named_parameters(), plain.parameters()):
        assert torch.equal(p, q), name
    assert stream.status(out)["closed"]


def test_refusals_are_one_line(tmp_path):
    model = tiny_model("LlamaForCausalLM")
    ids = prompt(8)
    for bad, match in (({"every": 0}, "every"), ({"backward": "yes"}, "backward"), ({"heads": list(range(9))}, "heads"),
                       ({"steps": "epoch"}, "steps"), ({"keep_steps": 0}, "keep_steps")):
        with pytest.raises(ValueError, match=match) as exc:
            watch(model, tmp_path / "bad", **bad)
        assert "\n" not in str(exc.value)
    with hf.capture(model):
        with pytest.raises(ValueError, match="capture") as exc:
            watch(model, tmp_path / "a")
    assert "\n" not in str(exc.value)
    with watch(model, tmp_path / "b", layers=[0]) as w:
        with pytest.raises(ValueError, match="already watched"):
            watch(model, tmp_path / "c")
        with pytest.raises(ValueError, match="capture and hf.watch") as exc:
            with hf.capture(model):
                model(ids)
        assert "\n" not in str(exc.value)
        assert w.rank == 0
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("mine")
    with pytest.raises(ModelRunFormatError, match="not empty"):
        watch(model, tmp_path / "d")


def test_retention_keeps_the_last_steps_and_marked_steps(tmp_path):
    out = tmp_path / "run"
    trained(out, steps=4, every=1, layers=[0], keep_steps=2)
    assert steps_of(out) == [2, 3]
    # steps='marked': two forwards (gradient accumulation) make one step, both recorded in it
    model = tiny_model("LlamaForCausalLM")
    ids = prompt(8)
    with watch(model, tmp_path / "marked", every=2, layers=[1], steps="marked") as w:
        for _ in range(3):
            with torch.no_grad():
                model(ids)
                model(ids)
            w.step()
    run = ModelRun.load(tmp_path / "marked", traces=False)
    assert [c.step for c in run.calls] == [0, 0, 2, 2] and {c.layer for c in run.calls} == {1}


def test_version_one_runs_keep_loading():
    run = ModelRun.load(ROOT / "data" / "runs" / "qwen2.5-7b-4l-sliding", traces=False)
    assert run.calls and {c.rank for c in run.calls} == {0}


KILLED = """
import sys, torch
sys.path.insert(0, {root!r})
from tests.instrumentation.test_watch import trained
def on_step(s, w, model):
    w.flush()
    print("WRITTEN", s, flush=True)
trained({out!r}, steps=50, on_step=on_step, every=1, layers=[0])
"""


def test_a_killed_job_leaves_its_completed_steps(tmp_path):
    out = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", KILLED.format(root=str(ROOT), out=str(out))],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "TRITON_INTERPRET": "1"})
    try:
        for line in child.stdout:
            if line.startswith("WRITTEN 2"):      # step 2 is written only when step 3 starts
                break
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=60)
    steps = steps_of(out)
    assert steps[:2] == [0, 1] and steps == list(range(len(steps)))
    assert not stream.status(out)["closed"]


RANK = """
import os, sys, torch, torch.distributed as dist
sys.path.insert(0, {root!r})
dist.init_process_group("gloo", init_method="file://{init}", rank=int(sys.argv[1]), world_size=2)
from tests.instrumentation.test_watch import trained
trained({out!r}, steps=2, every=1, layers=[1])
dist.barrier()
dist.destroy_process_group()
"""


def test_two_gloo_ranks_write_one_stream_each_into_one_run(tmp_path):
    out = tmp_path / "run"
    code = RANK.format(root=str(ROOT), init=tmp_path / "init", out=str(out))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    children = [subprocess.Popen([sys.executable, "-c", code, str(r)], env=env) for r in (0, 1)]
    assert [c.wait(timeout=300) for c in children] == [0, 0]
    run = ModelRun.load(out, traces=False)
    assert sorted((c.step, c.rank) for c in run.calls) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert stream.status(out)["closed"] and stream.status(out)["ranks"] == [0, 1]


def test_compiled_model_is_watched_without_recompiles_after_warm_up(tmp_path):
    # traced steps switch the attention implementation (a guard with two values, both compiled in
    # steps 0 and 1); the step counter is read only by the disabled pre-hook, never by a graph
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = tiny_model("LlamaForCausalLM")
    hf.use_tilescope(model)
    model.train()
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    ids = prompt(12, batch=2)
    with watch(model, tmp_path / "run", every=2, layers=[0]) as w:
        for s in range(5):
            if s == 2:
                graphs = counters["stats"]["unique_graphs"]
            loss = compiled(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        w.flush()
    assert counters["stats"]["unique_graphs"] - graphs <= 2
    assert steps_of(tmp_path / "run") == [0, 2, 4]
