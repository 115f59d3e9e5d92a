"""How a host module hands its arguments to a Triton kernel: by parameter name, in one place.

A launch plan names every argument of its kernel once (`KernelArgs(kernel, **fixed)`: the
constexpr groups, the plan's block lists, sizes, strides) and each call sets only what changes
(`args.bind(q=q, o=o, ...)`); `bind` returns the positional list Triton's launcher takes, in the
kernel's parameter order. Names are checked when the plan is built, not per call: a parameter the
plan never names, or a name the kernel does not have, is a ValueError then.

Positional, not keyword: Triton 3.6 binds keyword arguments far slower (measured on an H200: a
kernel of 60 arguments launched by keyword 52 us of host time, positionally 26 us, the same
values in 6 tuples of 10 17.7 us), which is also why the kernels take grouped tuples.
"""

from __future__ import annotations

from typing import NamedTuple

_UNSET = object()


class KernelArgs:
    """The arguments of one kernel launch, by name.

    Arguments:
        kernel: a @triton.jit function (its `arg_names` give the order).
        per_call: the names each call binds (checked against the kernel's parameters).
        **fixed: every other parameter's value, fixed for the plan (None for an unused buffer).
    Raises:
        ValueError: a name the kernel does not take, or a parameter neither fixed nor per call."""

    __slots__ = ("kernel", "names", "_index", "_template", "per_call")

    def __init__(self, kernel, per_call=(), **fixed):
        self.kernel = kernel
        self.names = tuple(kernel.arg_names)
        self._index = {name: i for i, name in enumerate(self.names)}
        unknown = sorted(name for name in {*fixed, *per_call} if name not in self._index)
        if unknown:
            raise ValueError(f"{kernel.__name__} takes no parameter {', '.join(unknown)}")
        missing = [n for n in self.names if n not in fixed and n not in per_call]
        if missing:
            raise ValueError(f"{kernel.__name__}: no value for {', '.join(missing)}")
        self.per_call = frozenset(per_call)
        self._template = [fixed.get(name, _UNSET) for name in self.names]

    def bind(self, **values) -> list:
        """The positional argument list with this call's values set by name.

        Arguments:
            **values: the per-call parameters (all of them; a fixed one may be overridden).
        Returns:
            list in the kernel's parameter order.
        Raises:
            ValueError: a per-call parameter without a value."""
        if not self.per_call <= values.keys():
            raise ValueError(f"{self.kernel.__name__}: no value for {', '.join(sorted(self.per_call - values.keys()))}")
        args = list(self._template)
        index = self._index
        for name, value in values.items():
            args[index[name]] = value
        return args

    def value(self, name: str):
        """The fixed value of a parameter (tests, benchmarks)."""
        return self._template[self._index[name]]

    def rebind(self, args: list, **values) -> list:
        """A copy of a bound argument list with some parameters set anew by name (e.g. the plain
        loop's LOOP after Triton refused the warp-specialised one)."""
        args = list(args)
        for name, value in values.items():
            args[self._index[name]] = value
        return args


class Tile(NamedTuple):
    """Constexpr group TILE: the tile shape and the dots' arithmetic (forward and varlen kernels).

    head_dim: D; HEAD_DIM: D padded to a power of two (the tile width); BLOCK_M, BLOCK_N: query
    and key rows per tile; EVEN_M: N_q a multiple of BLOCK_M (no row mask on Q and O); EVEN_D:
    D == HEAD_DIM (no column mask); DOT_PRECISION: tl.dot's input_precision ("ieee" for float32,
    else "tf32", unused by 16-bit dots); UPCAST_DOT: bf16 operands rounded and multiplied in
    float32 (the interpreter, whose bf16 dot is broken)."""

    head_dim: int
    HEAD_DIM: int
    BLOCK_M: int
    BLOCK_N: int
    EVEN_M: bool
    EVEN_D: bool
    DOT_PRECISION: str
    UPCAST_DOT: bool


class TraceFlags(NamedTuple):
    """Constexpr group TRACE: what a traced launch records; all False compiles every trace store
    away (the kernel we time is the kernel we draw, with the records off).

    WORK: one record per work item; TILES: each tile's visit (and clocks); ROWS: the online-softmax
    state of traced rows; HW_CLOCK: %globaltimer, %smid, %clock64 (CUDA only: the interpreter
    cannot run inline PTX); STORE_ORDER: the kernel stores each item's program and order (the
    persistent schedule, and the interpreter's counter), else the host derives them."""

    WORK: bool = False
    TILES: bool = False
    ROWS: bool = False
    HW_CLOCK: bool = False
    STORE_ORDER: bool = False


UNTRACED = TraceFlags()
