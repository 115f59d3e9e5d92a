"""An untraced backward call's launches, planned once per call shape and replayed.

backward_impl's launches take the same arguments on every call of one shape but the call's
tensors (PER_CALL: inputs, statistics, flag, gradients). The first call of a shape records its
launch steps (BackwardLaunches.build: each Triton launch's arguments in the kernel's parameter
order, where the per-call tensors go, its DirectLaunch); later calls copy the argument lists,
put their tensors in and launch the compiled kernels without Triton's per-call binding
(kernels.direct_launch), as the forward's plans do. The Gluon passes keep their own plan
(kernels.gluon_bwd_launch). In the interpreter, and whenever DirectLaunch declines (a first
call, an unaligned tensor, a Triton it does not mirror), a step goes through backward_launch's
_launch with the same arguments by name."""

from __future__ import annotations

from dataclasses import dataclass

# the arguments a planned launch takes per call (every other argument is fixed by the call's shape)
PER_CALL = frozenset(("O", "DO", "LSE", "DLSE", "STATS", "FLAG", "Q", "K", "V", "DK", "DV", "DQ"))
GLUON = "gluon"             # the step where the Gluon dK/dV and dQ passes run


def launch_options(cfg) -> dict:
    """A launch's Triton options from its BackwardConfig (warps, stages), or {} for Triton's defaults."""
    return {} if cfg is None else dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def positional_args(kernel, named: dict) -> list:
    """named ({parameter name: value}, a value for every parameter) in the kernel's own parameter
    order (a launch by keyword costs 2-3x the host time).

    Returns:
        list. Raises ValueError when named has another number of entries, KeyError when it lacks
        a parameter."""
    names = kernel.arg_names
    if len(named) != len(names):
        raise ValueError(f"{kernel.__name__} takes {len(names)} arguments, got {len(named)}: "
                         f"unknown {sorted(set(named) - set(names))}, missing {sorted(set(names) - set(named))}")
    return [named[n] for n in names]


@dataclass(frozen=True)
class TritonStep:
    """One Triton launch of the plan."""

    kernel: object          # a kernels.backward_kernel jit function
    grid: tuple
    args: list              # every argument in kernel.arg_names order, the PER_CALL ones None
    slots: tuple            # (index in args, PER_CALL name) of the per-call tensors
    cfg: object             # BackwardConfig (warps, stages) or None: Triton's defaults
    options: dict           # launch_options(cfg)
    direct: object          # its DirectLaunch


@dataclass(frozen=True)
class BackwardLaunches:
    """An untraced call shape's launch steps: TritonSteps, and GLUON where the Gluon passes run."""

    bp: object              # the BackwardPlan whose block lists the steps read
    steps: tuple

    @staticmethod
    def build(steps, bp) -> "BackwardLaunches":
        """From backward_launch's launch steps of one call, (kernel, grid, args by name, cfg) or
        GLUON, and the call's BackwardPlan."""
        from .direct_launch import DirectLaunch

        planned = []
        for step in steps:
            if step is GLUON:
                planned.append(GLUON)
                continue
            kernel, grid, named, cfg = step
            args = positional_args(kernel, named)
            slots = tuple((i, n) for i, n in enumerate(kernel.arg_names) if n in PER_CALL)
            for at, _ in slots:
                args[at] = None                 # the plan keeps no call's tensor
            planned.append(TritonStep(kernel, tuple(grid), args, slots, cfg, launch_options(cfg), DirectLaunch(kernel)))
        return BackwardLaunches(bp, tuple(planned))

    def run(self, tensors: dict, aligned: bool, run_gluon, launch=None) -> None:
        """Every step on this call's tensors.

        Arguments:
            tensors: {PER_CALL name: this call's tensor or None}.
            aligned: every tensor in it is 16-byte aligned (DirectLaunch's condition).
            run_gluon: () -> None, the Gluon passes on this call's tensors.
            launch: None, or a replacement of backward_launch._launch (kernel, grid, args by name,
                cfg) that every Triton step goes through instead (tests watch launches with it).
        Returns:
            None."""
        for step in self.steps:
            if step is GLUON:
                run_gluon()
                continue
            args = step.args.copy()
            for at, name in step.slots:
                args[at] = tensors[name]
            kernel, grid, options = step.kernel, step.grid, step.options
            if launch is not None:
                launch(kernel, grid, dict(zip(kernel.arg_names, args)), step.cfg)
                continue
            step.direct(grid, args, aligned, lambda: launch_positional(kernel, grid, args, options))


def launch_positional(kernel, grid, args: list, options: dict):
    """kernel[grid] on args in its parameter order, through Triton's JITFunction.run (what
    DirectLaunch keeps from a first call), a launch the GPU cannot hold refused in one line
    (kernels.runtime.resource_refusal)."""
    from .runtime import resource_refusal

    with resource_refusal():
        return kernel[grid](*args, **options)
