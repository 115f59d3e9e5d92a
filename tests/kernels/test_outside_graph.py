"""kernels.outside_graph: the torch.compiler.disable'd eager paths (the kernels', the watch's) cost
no torch._dynamo import (~1.7 s of CPU) in a process that never compiles, and are disabled as soon
as torch._dynamo is imported, before anything can be traced."""

import textwrap

import pytest

from tests.kernels.attention_checks import ON_GPU

CHILD = textwrap.dedent("""
    import sys
    import torch
    import kernels.backward, kernels.decode, kernels.flash, kernels.flash_ops
    import instrumentation.watch as watch
    from kernels import flash_attention
    q, k, v = (torch.randn(1, 1, 16, 16) for _ in range(3))
    flash_attention(q, k, v, mask="causal", block_m=16, block_n=16)
    print("loaded before:", "torch._dynamo" in sys.modules)
    plain = kernels.flash_ops._eager_outside_graph
    import torch._dynamo
    for module, name, fn in [(kernels.flash, "_launch_eager", "launch_attention"),
                             (kernels.flash_ops, "_eager_outside_graph", "eager_attention"),
                             (kernels.backward, "_backward_eager", "_backward_eager"),
                             (kernels.decode, "_eager_decode", "_eager_decode"),
                             (kernels.decode, "_validated", "_validated"),
                             (watch, "watch_attention_forward", "watch_attention_forward"),
                             (watch, "_snapshot", "_snapshot")]:
        f = getattr(module, name)
        print(name, getattr(f, "_torchdynamo_disable", False), f._torchdynamo_orig_callable.__name__ == fn)
    print("plain before:", plain is kernels.flash_ops.eager_attention)
    print("own loader:", type(torch._dynamo.__loader__).__name__, torch._dynamo.__spec__.loader is torch._dynamo.__loader__)
""")


@pytest.mark.skipif(ON_GPU, reason="its child runs the kernels in Triton's CPU interpreter, which this project runs "
                    "with the newest Triton, not the GPU machines' 3.6 (and a CUDA context cannot start under the "
                    "child's address-space limit)")
def test_kernels_load_and_run_without_dynamo_and_are_disabled_once_it_loads():
    # a child forked from the hostile harness's warm parent (torch and our packages imported, never
    # torch._dynamo: a module it imported that loads dynamo fails this test as a fresh Python would)
    from tests.hostile.harness import run_snippet

    out = run_snippet(CHILD, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "loaded before: False", out.stdout
    assert lines[1:8] == [f"{n} True True" for n in ("_launch_eager", "_eager_outside_graph", "_backward_eager",
                                                     "_eager_decode", "_validated", "watch_attention_forward",
                                                     "_snapshot")], out.stdout
    assert lines[8] == "plain before: True" and lines[9] == "own loader: SourceFileLoader True", out.stdout
