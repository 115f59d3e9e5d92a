"""flash_decode from two threads at once: the fused merge's ticket counters are per (device,
stream) on CUDA and per (device, thread) in the interpreter, so concurrent calls never share
them (they did: one buffer per device gave wrong outputs, inf/NaN, in silence); the interpreter's
launches take turns (it is not thread-safe: InterpreterError)."""

import threading
from contextlib import nullcontext

import torch

from kernels import flash_decode, reference_decode
from kernels.decode import merge_counters


def _inputs(seed, device):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 8, 1, 32, generator=g)
    k, v = (torch.randn(2, 2, 256, 32, generator=g) for _ in range(2))
    return [t.to(device) for t in (q, k, v)]


def test_two_threads_with_four_splits_both_right(device):
    calls = 4
    results, errors = {}, []
    start = threading.Barrier(2)

    def worker(seed):
        try:
            q, k, v = _inputs(seed, device)
            # a stream of its own per thread on CUDA (the serving case); the interpreter has none
            stream = torch.cuda.Stream(device) if device.type == "cuda" else None
            if stream is not None:
                stream.wait_stream(torch.cuda.current_stream(device))       # the inputs are ready
            start.wait()
            outs = []
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                for _ in range(calls):
                    outs.append(flash_decode(q, k, v, num_splits=4))
            if stream is not None:
                stream.synchronize()
            results[seed] = (outs, reference_decode(q, k, v)[0])
        except Exception as exc:       # reported below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for seed, (outs, ref) in results.items():
        for out in outs:
            err = ((out.double().cpu() - ref).norm() / ref.norm()).item()
            assert err < 1e-4, (seed, err)


def test_counters_are_per_thread_in_the_interpreter_and_per_stream_on_cuda(device):
    here = merge_counters(device, 8)
    assert merge_counters(device, 8) is here                     # kept between calls
    other = []
    t = threading.Thread(target=lambda: other.append(merge_counters(device, 8)))
    t.start()
    t.join()
    if device.type == "cuda":
        assert other[0] is here                                  # the same (default) stream
        with torch.cuda.stream(torch.cuda.Stream(device)):
            assert merge_counters(device, 8) is not here
    else:
        assert other[0] is not here

