"""kernels.direct_launch against the installed Triton's own JITFunction.run: with a stand-in CUDA
driver and compiler (no GPU), every call launches the kernel object run would launch, with the
same launcher arguments; anything run's choice could depend on that the direct path does not
key on (alignment, device, debug, hooks, a patched run) goes through run."""

import pytest
import torch

from kernels import direct_launch


def _toy(X, Y, n, BLOCK: "tl.constexpr"):  # noqa: F821  (only parsed, never compiled)
    pass


class FakeCompiled:
    """A compiled kernel whose launcher records what it was given."""

    module, function, packed_metadata = "module", "function", ("packed",)
    launched: list = []

    def launch_metadata(self, grid, stream, *args):
        return ("metadata", grid, stream)

    def run(self, *args):
        FakeCompiled.launched.append((self, args))


class FakeDriver:
    def __init__(self):
        self.device = 0

    def get_current_device(self):
        return self.device

    def get_current_stream(self, device):
        return 1000 + device

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


@pytest.fixture
def triton_run(monkeypatch):
    """A real JITFunction (not the interpreter's) whose compiles make FakeCompiled kernels."""
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    state = direct_launch._triton_state()
    if state is None:
        pytest.skip("this Triton's JITFunction.run is not one direct_launch mirrors")
    fake = FakeDriver()
    monkeypatch.setattr(driver, "_active", fake)
    monkeypatch.setattr(state, "compiled_kernel", FakeCompiled)
    compiles = []

    def do_compile(key, signature, device, constexprs, options, attrs, warmup):
        kernel = FakeCompiled()
        fn.device_caches[device][0][key] = kernel
        compiles.append(signature)
        return kernel

    fn = JITFunction(_toy)
    fn._do_compile = do_compile
    FakeCompiled.launched = []
    return fn, fake, compiles


def _launch_both(fn, dl, grid, args, aligned):
    """The direct launch, then JITFunction.run on the same arguments: (what each launched)."""
    def slow():
        return fn.run(*args, grid=grid, warmup=False, num_warps=4)

    FakeCompiled.launched = []
    dl(grid, args, aligned, slow)
    slow()
    (direct, direct_args), (run, run_args) = FakeCompiled.launched
    return direct, direct_args, run, run_args


def test_direct_launch_launches_what_jit_run_would(triton_run, monkeypatch):
    from triton import knobs

    fn, fake, compiles = triton_run
    dl = direct_launch.DirectLaunch(fn)
    base = torch.zeros(64)
    fixed = torch.zeros(32)
    slow_calls = []
    grid = (3, 2)
    for x, debug, device in [(base, False, 0), (base[4:], False, 0), (base[1:], False, 0), (base, True, 0),
                             (base, False, 1), (base[8:], False, 0), (base[1:], False, 0)]:
        monkeypatch.setattr(knobs.runtime, "debug", debug)
        fake.device = device
        args = [x, fixed, 7, 16]
        n_before = len(dl.compiled)
        direct, direct_args, run, run_args = _launch_both(fn, dl, grid, args, not x.data_ptr() & 15)
        assert direct is run and direct_args == run_args            # the same kernel, the same launcher call
        assert direct_args[:4] == (3, 2, 1, 1000 + device)
        slow_calls.append(len(dl.compiled) > n_before)
    # compiled per (alignment, debug, device): the aligned views reuse one; the unaligned one is run's alone
    assert len(compiles) == 4 and len(dl.compiled) == 3
    assert slow_calls == [True, False, False, True, True, False, False]


def test_direct_launch_steps_aside(triton_run, monkeypatch):
    """Unaligned tensors, pre-run hooks and a patched JITFunction.run go through run."""
    from triton.runtime.jit import JITFunction

    fn, fake, compiles = triton_run
    dl = direct_launch.DirectLaunch(fn)
    x, y = torch.zeros(16), torch.zeros(16)
    ran = []

    def slow():
        ran.append(1)
        return fn.run(x, y, 3, 16, grid=(1,), warmup=False)

    dl((1,), [x, y, 3, 16], True, slow)
    dl((1,), [x, y, 3, 16], True, slow)
    assert len(ran) == 1                                      # the second call launched directly
    dl((1,), [x, y, 3, 16], False, slow)
    fn.pre_run_hooks.append(lambda *a, **kw: None)
    dl((1,), [x, y, 3, 16], True, slow)
    fn.pre_run_hooks.clear()
    real_run = JITFunction.run
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **kw: real_run(self, *a, **kw))
    dl((1,), [x, y, 3, 16], True, slow)
    assert len(ran) == 4


def test_a_changed_global_is_refused_as_run_refuses_it(triton_run):
    """The globals a kernel read when compiled (a tl.constexpr, a float) launch directly while they
    are the same objects or equal ones, and raise run's error once one has changed."""
    import triton.language as tl

    fn, _, _ = triton_run
    dl = direct_launch.DirectLaunch(fn)
    x, y = torch.zeros(16), torch.zeros(16)
    module_globals = {"ROWS": tl.constexpr(64), "EPS": 1e-6}
    args = [x, y, 3, 16]

    def slow():
        return fn.run(*args, grid=(1,), warmup=False)
    dl((1,), args, True, slow)                                # compiled here, before the globals are noted
    fn.used_global_vals = {(name, id(module_globals)): (value, module_globals) for name, value in module_globals.items()}
    FakeCompiled.launched = []
    dl((1,), args, True, slow)
    module_globals["EPS"] = 1e-6 * 1.0                        # an equal float, another object
    dl((1,), args, True, slow)
    assert len(FakeCompiled.launched) == 2
    for name, changed in (("EPS", 2e-6), ("ROWS", tl.constexpr(32))):
        before = module_globals[name]
        module_globals[name] = changed
        with pytest.raises(RuntimeError, match=f"Global variable {name} has changed"):
            dl((1,), args, True, slow)
        with pytest.raises(RuntimeError, match=f"Global variable {name} has changed"):
            slow()
        module_globals[name] = before
    fn.used_global_vals = {}


def _toy_desc(desc, out, n, BLOCK: "tl.constexpr"):  # noqa: F821  (only parsed, never compiled)
    pass


def test_a_gluon_kernel_with_tensor_descriptors_launches_directly(triton_run):
    """Hopper's forward is a Gluon kernel (a JITFunction subclass) taking TMA descriptors that
    kernels.gluon_launch copies from a checked one per call (descriptor_on): it launches directly too,
    with what run would launch; the copies specialise as Triton's own from_tensor descriptors."""
    gluon_runtime = pytest.importorskip("triton.experimental.gluon._runtime")
    hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from triton.experimental.gluon import language as gl

    from kernels.gluon_launch import descriptor_on

    _, fake, _ = triton_run
    fn = gluon_runtime.GluonJITFunction(_toy_desc)
    compiles = []

    def do_compile(key, signature, device, constexprs, options, attrs, warmup):
        fn.device_caches[device][0][key] = kernel = FakeCompiled()
        compiles.append(signature)
        return kernel

    fn._do_compile = do_compile
    layout = gl.NVMMASharedLayout.get_default_for([64, 32], gl.bfloat16)
    checked = hopper.TensorDescriptor.from_tensor(torch.zeros(256, 32, dtype=torch.bfloat16), [64, 32], layout)
    checked.base = None
    dl = direct_launch.DirectLaunch(fn)
    for i in range(3):
        x = torch.randn(2, 128, 32).to(torch.bfloat16)              # a call's (.., D) tensor
        own = hopper.TensorDescriptor.from_tensor(x.view(-1, 32), [64, 32], layout)
        copy = descriptor_on(checked, x)
        assert copy.base is x and {k: v for k, v in vars(copy).items() if k != "base"} == \
            {k: v for k, v in vars(own).items() if k != "base"}
        out = torch.zeros(8)
        direct, direct_args, run, run_args = _launch_both(fn, dl, (4,), [copy, out, 5 + i, 64], True)
        assert direct is run and direct_args == run_args
        _, spec, _ = fn.device_caches[0][4](own, out, 5, 64, num_warps=4)
        _, spec_copy, _ = fn.device_caches[0][4](copy, out, 5, 64, num_warps=4)
        assert spec == spec_copy
    assert len(compiles) == 1 and len(dl.compiled) == 1


@pytest.mark.gpu
def test_gpu_direct_launches_equal_triton_run(monkeypatch):
    """On the GPU: after a call compiles, calls of the same plan launch directly, give what
    JITFunction.run's launch gives (bit for bit), replay in a CUDA graph; an unaligned q goes
    through run (Triton's other specialisation)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the lent GPU)")
    import kernels.launch as launch
    from kernels import flash_attention

    monkeypatch.setenv("TILESCOPE_GLUON", "0")       # the Triton kernel's launch path (Hopper runs Gluon)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, q2, k, v = (torch.randn(1, 4, 256, 64, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q_odd = torch.empty(q2.numel() + 1, device="cuda", dtype=torch.bfloat16)[1:].view_as(q2)
    q_odd.copy_(q2)                                   # 2 bytes past a 16-byte boundary
    for mask, kw in [("causal", {}), ("full", dict(return_lse=True)), ("sliding_window:100", dict(sm_scale=0.2))]:
        launch.clear_caches()
        flash_attention(q, k, v, mask=mask, **kw)     # compiles through JITFunction.run
        direct = flash_attention(q2, k, v, mask=mask, **kw)
        plans = [value for value, _ in launch._PLANS._items.values()]
        assert any(lp.launches[0].direct.compiled for lp in plans), mask
        with monkeypatch.context() as m:
            m.setattr(direct_launch, "_STATE", [None])        # every launch through JITFunction.run
            via_run = flash_attention(q2, k, v, mask=mask, **kw)
        odd = flash_attention(q_odd, k, v, mask=mask, **kw)
        for a, b, c in zip(*(x if isinstance(x, tuple) else (x,) for x in (direct, via_run, odd))):
            assert torch.equal(a, b), mask
            assert ((c.float() - b.float()).norm() / b.float().norm()).item() < 1e-2, mask
    static_q = q.clone()
    flash_attention(static_q, k, v, mask="causal")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flash_attention(static_q, k, v, mask="causal")
    static_q.copy_(q2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, flash_attention(q2, k, v, mask="causal"))
