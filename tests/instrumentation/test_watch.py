"""instrumentation.watch: a training loop watched into a growing model run (format version 2).

Tiny random-weight transformers Llama models (test_hf's config with 2 query heads sharing 1 KV
head, batch 1, 8 tokens: the interpreter's cost is per program), fp32, in the interpreter: the
traced steps and their backward decoded and written by the watch's child process (no torch
there), weights equal to the unwatched run's, refusals in one line, marked steps, a traced step
skipped (not waited for) while the steps before it are still being written, the steps after a
decoding process died written on a thread, an idle decoding process ending with its job, a
compiled model (traced steps eager), and two gloo ranks (this process and a child) into one run,
the child rank killed while its decoding process has a step directory half written (the decoding
process then ends by itself; the completed steps stay readable, the half step is not read; this
rank's retention keeps its last steps only)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from instrumentation import hf  # noqa: E402
from instrumentation.recording import model_run_stream as stream  # noqa: E402
from instrumentation.recording.model_run import ModelRun, ModelRunFormatError  # noqa: E402
from instrumentation.watch import WATCH_NAME, watch  # noqa: E402

from .test_hf import TINY, prompt  # noqa: E402


@pytest.fixture(autouse=True)
def _needs_transformers():
    """Skip without transformers; imported by the tests that run, not at collection (every test
    worker collects this module: importing transformers there cost each one ~0.7 s of CPU)."""
    pytest.importorskip("transformers")


ROOT = Path(__file__).resolve().parents[2]
CONFIG = {**TINY, "num_attention_heads": 2, "num_key_value_heads": 1, "use_cache": False}   # training: no KV cache
TOKENS = 8


def tiny_llama(layers: int = 2):
    """A LlamaForCausalLM of CONFIG (seed 0), on Tilescope's attention, in training mode."""
    torch.manual_seed(0)
    import transformers

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**CONFIG, "num_hidden_layers": layers}))
    hf.use_tilescope(model)
    return model.train()


def trained(out=None, steps=6, on_step=None, n_layers=2, **options):
    """A tiny Llama of `n_layers` layers trained `steps` steps (AdamW), watched into `out` when given."""
    model = tiny_llama(n_layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = prompt(TOKENS)
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


def forwards(out, steps: int, n_layers: int = 2, **options):
    """`steps` marked steps of one forward each (no gradients) of a tiny Llama, every step traced
    into `out`; the watch is left open (its last step handed over). Returns: the Watch."""
    model = tiny_llama(n_layers)
    ids = prompt(TOKENS)
    w = watch(model, out, every=1, steps="marked", **options)
    with torch.no_grad():
        for _ in range(steps):
            model(ids)
            w.step()
    return w


def steps_of(out, rank=None):
    return sorted({c.step for c in ModelRun.load(out, traces=False).calls if rank is None or c.rank == rank})


def test_six_steps_every_two_with_backward_equal_the_unwatched_weights(tmp_path):
    out = tmp_path / "run"
    seen = {}

    def check(s, w, model):
        seen["watch"] = w
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
            assert c.rank == 0 and c.phase == "prefill" and (c.n_q, c.n_k, c.batch) == (TOKENS, TOKENS, 1)
            assert (c.heads, c.kv_heads) == (2, 1)
            assert {"work", "bwd_work"} <= set(c.trace.tables)
            assert c.trace.meta["backward"]["grad_out"] == "given by the caller"   # the step's real dO
            assert len(c.trace.tables["work"]) and len(c.trace.tables["bwd_work"])
            assert c.kernel_ms is None and c.bwd_kernel_ms is None                 # no clock in the interpreter
    for step, rank, name in stream.list_steps(out):                                # each step's own cost
        cost = stream.files.read_json(out / stream.STEPS / name / stream.STEP_MANIFEST, "step.json")["cost"]
        assert cost["snapshot_ms"] > 0 and cost["launch_ms"] > 0 and cost["decode_ms"] > 0
        assert cost["record_ms"] == pytest.approx(cost["launch_ms"] + cost["decode_ms"]) and cost["skipped_before"] == 0
    # decoded and written by the child process, which never loaded torch
    w = seen["watch"]
    assert w.decoder_info["pid"] != os.getpid() and w.decoder_info["torch_loaded"] is False
    assert w.decoder_info["torch_import"] is None
    assert w.decoder_info["pid"] == w._decoder.pid and w._decoder.proc.returncode == 0
    assert run.meta["watched"]["decode"] == "child process" and w.skipped == [] and w.steps_written == 3
    assert watched.config._attn_implementation == hf.NAME
    for (name, p), q in zip(watched.named_parameters(), plain.parameters()):
        assert torch.equal(p, q), name
    assert stream.status(out)["closed"]


def test_refusals_are_one_line(tmp_path):
    model = tiny_llama(layers=1).eval()
    ids = prompt(TOKENS)
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


def test_marked_steps_hold_every_forward_of_the_step(tmp_path):
    # steps='marked': two forwards (gradient accumulation) make one step, both recorded in it
    model = tiny_llama()
    ids = prompt(TOKENS)
    with watch(model, tmp_path / "marked", every=2, layers=[1], steps="marked", decode="thread") as w:
        for _ in range(3):
            with torch.no_grad():
                model(ids)
                model(ids)
            w.step()
    run = ModelRun.load(tmp_path / "marked", traces=False)
    assert [c.step for c in run.calls] == [0, 0, 2, 2] and {c.layer for c in run.calls} == {1}


def test_a_traced_step_due_while_the_steps_before_wait_is_skipped_not_waited_for(tmp_path, monkeypatch):
    # queue_steps=1: while step 0 is still being written, steps 1 and 2 (due: every=1) are not
    # traced; the training goes on, and the run says which steps were skipped
    import threading

    from instrumentation import watch_child

    gate, write = threading.Event(), watch_child.write_step
    monkeypatch.setattr(watch_child, "write_step", lambda job: (gate.wait(60), write(job))[1])
    model = tiny_llama(layers=1)
    ids = prompt(TOKENS)
    out = tmp_path / "run"
    with watch(model, out, every=1, steps="marked", queue_steps=1, decode="thread") as w:
        with torch.no_grad():
            model(ids)
        w.step()                                     # step 0 handed over (its write waits on the gate)
        w.step()                                     # steps 1 and 2: due, skipped
        try:
            assert w.skipped == [1, 2] and model.config._attn_implementation == hf.NAME
        finally:
            gate.set()
        w.flush()
        w.step()                                     # step 3: traced again
        assert model.config._attn_implementation == WATCH_NAME
        with torch.no_grad():
            model(ids)
    assert steps_of(out) == [0, 3]
    (_, _, name), = [s for s in stream.list_steps(out) if s[0] == 3]
    assert stream.files.read_json(out / stream.STEPS / name / stream.STEP_MANIFEST, "")["cost"]["skipped_before"] == 2
    assert stream.files.read_json(out / stream.closed_name(0), "")["skipped"] == [1, 2]


def test_steps_after_the_decoding_process_died_are_written_on_a_thread(tmp_path):
    model = tiny_llama(layers=1)
    ids = prompt(TOKENS)
    out = tmp_path / "run"
    with watch(model, out, every=1, steps="marked") as w, torch.no_grad():
        model(ids)
        w.step()
        w.flush()                                    # step 0 written by the child
        os.kill(w._decoder.pid, signal.SIGKILL)
        assert wait_for(lambda: w.decode == "thread", 30)
        model(ids)
    assert steps_of(out) == [0, 1] and w.decoder_info["exit_code"] == -signal.SIGKILL and not w.errors


def test_the_decoding_process_says_where_a_module_it_must_not_load_was_imported():
    import colorsys
    import pickle

    from instrumentation.watch_child import TorchImportWitness

    message = pickle.dumps({"f": colorsys.rgb_to_hsv})   # unpickling it imports colorsys
    witness = TorchImportWitness("colorsys")
    sys.modules.pop("colorsys")
    sys.meta_path.insert(0, witness)
    try:
        assert witness.where is None
        pickle.loads(message)
    finally:
        sys.meta_path.remove(witness)
    assert witness.where.startswith("test_watch.py:")       # the unpickling line, innermost first
    assert "colorsys" in sys.modules


def test_what_the_decoding_process_is_sent_names_nothing_of_torch():
    import io
    import pickle

    from instrumentation.watch_launch import to_numpy

    class Globals(pickle.Unpickler):
        seen: list = []

        def find_class(self, module, name):
            self.seen.append(module)
            return super().find_class(module, name)

    calls = [{"raw": {"work": torch.arange(6).reshape(2, 3), "shape": torch.Size([2, 3]), "dtype": torch.bfloat16,
                      "device": torch.device("cpu"), "v": torch.__version__, "nested": ({"x": torch.ones(2)},)}}]
    sent = to_numpy(calls)
    Globals(io.BytesIO(pickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL))).load()
    assert Globals.seen and not [m for m in Globals.seen if m.split(".")[0] == "torch"]    # numpy's only
    assert sent[0]["raw"]["shape"] == (2, 3) and sent[0]["raw"]["dtype"] == "torch.bfloat16"
    assert sent[0]["raw"]["work"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_version_one_runs_keep_loading():
    run = ModelRun.load(ROOT / "data" / "runs" / "qwen2.5-7b-4l-sliding", traces=False)
    assert run.calls and {c.rank for c in run.calls} == {0}


# rank 1 of two gloo ranks, in a child process: a 1-layer model's forwards, each a marked step,
# every step traced. The decoding process it starts (after setting PYTHONPATH and WATCH_TEST_HANG)
# runs HANG_IN_DECODER first: step 1's trace saved, it writes its pid into the marker file and
# hangs, a step directory half written; once rank 1 is killed the decoding process sees its parent
# gone and ends after GRACE_S (0.5 s here)
RANK_1 = """
import os, sys, time, torch, torch.distributed as dist
sys.path.insert(0, {root!r})
dist.init_process_group("gloo", init_method="file://{init}", rank=1, world_size=2)
os.environ.update(PYTHONPATH=os.pathsep.join([{hooks!r}, {root!r}]), WATCH_TEST_HANG={marker!r})
from tests.instrumentation.test_watch import forwards
forwards({out!r}, steps=2, n_layers=1, layers=[0])
time.sleep(600)           # step 1 handed to the decoder: wait here to be killed
"""
HANG_IN_DECODER = """
import os
if os.environ.get("WATCH_TEST_HANG"):
    import time
    from instrumentation import watch_child
    from instrumentation.trace.trace import Trace
    watch_child.GRACE_S = 0.5
    save = Trace.save
    def save_then_hang(self, *args, **kwargs):
        path = save(self, *args, **kwargs)
        if self.meta["model_call"]["step"] == 1:
            with open(os.environ["WATCH_TEST_HANG"] + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(os.environ["WATCH_TEST_HANG"] + ".tmp", os.environ["WATCH_TEST_HANG"])
            time.sleep(600)
        return path
    Trace.save = save_then_hang
"""


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (an orphan may wait to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for(predicate, timeout: float) -> bool:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_two_gloo_ranks_one_killed_mid_write_leave_one_stream_each(tmp_path):
    import datetime

    import torch.distributed as dist

    out, hooks, marker = tmp_path / "run", tmp_path / "hooks", tmp_path / "decoder-pid"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HANG_IN_DECODER)
    code = RANK_1.format(root=str(ROOT), init=tmp_path / "init", out=str(out), hooks=str(hooks), marker=str(marker))
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "1"})
    decoder = None
    try:
        # rank 0 is this process: 3 steps (a 2-layer model's forwards, layer 1 watched), every step
        # traced (none skipped: queue_steps=4), its retention keeping the last 2 (decoded on a
        # thread: the child process is rank 1's test)
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=2,
                                timeout=datetime.timedelta(seconds=120))
        try:
            forwards(out, steps=3, layers=[1], keep_steps=2, queue_steps=4, decode="thread").close()
        finally:
            dist.destroy_process_group()
        assert wait_for(marker.exists, 120), "rank 1's decoding process was to hang in step 1's write"
        decoder = int(marker.read_text())
        assert running(decoder) and decoder != child.pid
        os.kill(child.pid, signal.SIGKILL)           # the job's rank 1 dies; nobody kills its decoder
        child.wait(timeout=60)
        assert wait_for(lambda: not running(decoder), 30), "the decoding process outlived its job"
        half = [n for n in os.listdir(out / stream.STEPS) if not stream.STEP_DIR.match(n)]
        assert half, "rank 1's decoder was to end with a step directory half written"
    finally:
        for pid in (child.pid, decoder):
            if pid is not None and running(pid):
                os.kill(pid, signal.SIGKILL)
        child.wait(timeout=60)
    assert steps_of(out, rank=0) == [1, 2]
    assert steps_of(out, rank=1) == [0]               # the half-written step 1 is not read
    assert {c.layer for c in ModelRun.load(out, traces=False).calls if c.rank == 1} == {0}
    status = stream.status(out)
    assert status["ranks"] == [0, 1] and not status["closed"]
    assert (out / stream.closed_name(0)).exists() and not (out / stream.closed_name(1)).exists()


def test_an_idle_decoding_process_ends_with_its_job(tmp_path):
    # a job killed between traced steps: its decoding process sees its input end and exits
    job = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                            "from instrumentation.watch_child import Decoder; "
                            "print(Decoder(lambda message: None).pid, flush=True); time.sleep(600)", str(ROOT)],
                           stdout=subprocess.PIPE, text=True)
    try:
        decoder = int(job.stdout.readline())
        assert running(decoder)
    finally:
        job.kill()
        job.wait(timeout=60)
    assert wait_for(lambda: not running(decoder), 30), "the decoding process outlived its job"


def test_compiled_model_is_watched_without_recompiles_after_warm_up(tmp_path):
    # a traced step runs eagerly as a whole (the watch sets the compiler stance 'force_eager' before
    # it): only the untraced model is compiled (step 1), no graph breaks; the step counter is read
    # only by the disabled pre-hook, never by a graph; the job's stance is back after close()
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = tiny_llama(layers=1)
    compiled = torch.compile(model, backend="eager")        # dynamo's guards and graphs are what is tested
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    ids = prompt(TOKENS)
    with watch(model, tmp_path / "run", every=2, decode="thread") as w:
        for s in range(4):
            if s == 2:
                graphs = counters["stats"]["unique_graphs"]
            loss = compiled(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        w.flush()
    assert counters["stats"]["unique_graphs"] - graphs <= 2       # a traced and an untraced step after warm-up
    assert steps_of(tmp_path / "run") == [0, 2]
    assert torch._dynamo.eval_frame._stance.stance == "default"
