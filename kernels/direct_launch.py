"""Launching an already compiled Triton kernel without JITFunction.run's per-call work.

`kernel[grid](*args)` binds and specialises every argument on every call (Triton 3.6: one native
specialisation per parameter, a cache key built from them and the options' text), which is most
of a launch's host time. A launch plan fixes all of its kernel's arguments but a few per-call
tensors and a float, so what Triton specialises on can only change with: the current device,
the options Triton adds per call (debug, instrumentation mode, ...) and whether each per-call
tensor is 16-byte aligned (the plan fixes the tensors' dtypes). DirectLaunch keeps, per such
state, the CompiledKernel that JITFunction.run returned for it, and launches it the way run does
(the same launcher call, stream, hooks and used-globals check).

Safe by construction, else the normal launch:
  - only for a Triton whose JITFunction.run source is one this mirrors (3.6.0, 3.9.0: KNOWN_RUNS),
    only while JITFunction.run is that function (not patched), for a CUDA target (NVIDIA
    specialises tensors by dtype and alignment alone), without pre-run hooks or a stages hook;
  - the first call for a state, any unaligned per-call tensor, and anything unexpected go through
    the normal launch (the caller's `slow`), whose CompiledKernel is kept only when run returned one.
Gluon kernels (a JITFunction subclass with the same run) take it too: their tensor descriptors are
specialised by dtype, block shape and layout, which the plan fixes.
The interpreter never takes this path (its kernels are not JITFunctions)."""

from __future__ import annotations

import hashlib
import inspect
from operator import attrgetter

# sha256 of JITFunction.run's source (first 16 hex digits) -> the knobs run adds to the options
KNOWN_RUNS = {
    "966265fd6647e6c1": ("instrumentation_mode",),                              # Triton 3.6.0
    "3293f3bc9eab4de7": ("instrumentation_mode", "fpsan_homomorphic_casts"),    # Triton 3.9.0
}
_STATE: list = []       # [_Triton or None], decided on first use


class _Triton:
    """The installed Triton's pieces that JITFunction.run uses, when its run is one of KNOWN_RUNS."""

    def __init__(self, jit_function, run, knob_names, driver, knobs, compiled_kernel):
        self.jit_function, self.run, self.driver, self.knobs = jit_function, run, driver, knobs
        self.compiled_kernel = compiled_kernel
        # run's per-call options besides the launch's own: debug (the function's or the knob's) and these
        self.knob_values = attrgetter(*knob_names)


def _triton_state():
    """_Triton for the installed Triton when its JITFunction.run is one of KNOWN_RUNS, else None."""
    if not _STATE:
        state = None
        try:
            from triton import knobs
            from triton.compiler.compiler import CompiledKernel
            from triton.runtime.driver import driver
            from triton.runtime.jit import JITFunction

            run = JITFunction.run
            names = KNOWN_RUNS.get(hashlib.sha256(inspect.getsource(run).encode()).hexdigest()[:16])
            if names is not None:
                state = _Triton(JITFunction, run, names, driver, knobs, CompiledKernel)
        except Exception:  # noqa: BLE001  (no source, another layout: the normal launch)
            state = None
        _STATE.append(state)
    return _STATE[0]


def aligned(*tensors) -> bool:
    """Whether every tensor given (None skipped) starts on a 16-byte boundary: the condition on a
    call's per-call tensors under which DirectLaunch takes its kept kernel."""
    bits = 0
    for t in tensors:
        if t is not None:
            bits |= t.data_ptr()
    return not bits & 15


class DirectLaunch:
    """The compiled kernels of one planned launch (fixed kernel, options and non-per-call
    arguments), by the state Triton specialises the per-call arguments on.

    Arguments:
        kernel: the @triton.jit function the plan launches."""

    __slots__ = ("kernel", "compiled")

    def __init__(self, kernel):
        self.kernel = kernel
        self.compiled: dict = {}

    def __call__(self, grid: tuple, args: list, aligned: bool, slow) -> None:
        """Launch args (every parameter, positionally) on grid.

        Arguments:
            grid: the plan's grid (1 to 3 ints); args: the full argument list, whose per-call
                entries are tensors of the plan's dtypes, None or floats.
            aligned: every per-call tensor's data_ptr is a multiple of 16.
            slow: () -> what JITFunction.run returned: the normal launch of the same arguments.
        Returns:
            None."""
        state = _STATE[0] if _STATE else _triton_state()
        fn = self.kernel
        if state is None or not aligned or not isinstance(fn, state.jit_function) or type(fn).run is not state.run \
                or state.jit_function.run is not state.run or fn.pre_run_hooks:
            slow()
            return
        knobs = state.knobs
        runtime = knobs.runtime
        if runtime.add_stages_inspection_hook is not None:
            slow()
            return
        active = state.driver.active
        device = active.get_current_device()
        key = (device, fn.debug, runtime.debug, state.knob_values(knobs.compilation))
        kernel = self.compiled.get(key)
        if kernel is None:
            kernel = slow()
            if type(kernel) is state.compiled_kernel and kernel.module is not None \
                    and fn.device_caches[device][2].backend == "cuda":
                self.compiled[key] = kernel
            return
        stream = active.get_current_stream(device)
        used = fn.used_global_vals
        if used:        # run's check that the globals the kernel read when it was compiled are unchanged
            not_present = object()
            for (name, _), (val, globals_dict) in used.items():
                # (the same object first: a constexpr global's != builds two constexprs)
                if (new_val := globals_dict.get(name, not_present)) is not val and new_val != val:
                    raise RuntimeError(
                        f"Global variable {name} has changed since we compiled this kernel, from {val} to {new_val}")
        size = len(grid)
        launch_metadata = kernel.launch_metadata(grid, stream, *args)
        kernel.run(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1, stream, kernel.function,
                   kernel.packed_metadata, launch_metadata, runtime.launch_enter_hook, runtime.launch_exit_hook,
                   *args)
