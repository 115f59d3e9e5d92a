"""Where the kernels run, decided once, before Triton is imported — and without importing torch
when the machine has no NVIDIA device at all (so a CPU machine opens recordings quickly) — and
the facts about a device that the launch rules read, looked up once per device.

TRITON_INTERPRET=1 (the CPU interpreter) is set unless the caller already chose, or CUDA is
available. Triton reads it when it is imported, so the answer is fixed from then on: it is read
once here, not on every call.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

# Linux and WSL2 device nodes; without them there is no CUDA device to ask torch about
_NVIDIA_NODES = ("/dev/nvidiactl", "/dev/dxg")

# the kernel takes any head dim 1..MAX_HEAD_DIM (padded inside to a power of two with masked
# loads); these are the ones menus offer (GPT-2 64, Phi-2 80, Llama/Mistral/Qwen 128, Gemma-2 256)
MAX_HEAD_DIM = 256
SUPPORTED_HEAD_DIMS = (16, 32, 64, 80, 96, 128, 160, 192, 256)
SCHEDULES = ("natural", "longest_first", "persistent")
# The CPU interpreter runs one numpy op at a time; past this many computed tiles of the flash
# kernel a run takes minutes, so we refuse and point to a GPU or a bundled recording instead.
INTERPRETER_MAX_TILES = 10_000
# The decode kernel's unit is a (program, K/V tile) visit, cheaper than a flash tile (a few
# query rows against the tile), so the interpreter takes twice as many before refusing.
INTERPRETER_MAX_DECODE_VISITS = 20_000
TILE_LIMIT_REMEDY = "lower N, B or H, raise the block sizes, run on a GPU, or open a bundled GPU recording from data/"


def interpreter_tiles_refusal(tiles: int, what: str, remedy: str = TILE_LIMIT_REMEDY) -> str:
    """The one message for a call over the interpreter's tile limit, '' when within it.

    Arguments:
        tiles: the tiles the call computes; what: the call, for the message ("B*H=8, N_q=4096, ...");
        remedy: what to do instead.
    Returns:
        '' when tiles <= INTERPRETER_MAX_TILES, else one line naming the count and the limit."""
    if tiles <= INTERPRETER_MAX_TILES:
        return ""
    return (f"{what}: {tiles:,} computed tiles is too much for the CPU interpreter "
            f"(limit {INTERPRETER_MAX_TILES:,}): {remedy}")


def check_interpreter_tiles(tiles: int, what: str, remedy: str = TILE_LIMIT_REMEDY) -> None:
    """Raise ValueError with interpreter_tiles_refusal's line when tiles is over the limit.

    Arguments:
        as interpreter_tiles_refusal.
    Returns:
        None."""
    message = interpreter_tiles_refusal(tiles, what, remedy)
    if message:
        raise ValueError(message)

_INTERPRETING: list = []      # the answer, once known


@contextmanager
def resource_refusal():
    """Around a kernel launch: Triton's OutOfResources (the compiled tiles need more shared memory
    or registers than the GPU has, e.g. float32 D256 with 128-key tiles) as one ValueError line
    that says what to change, instead of a compiler traceback. The interpreter never raises it."""
    from triton.runtime.errors import OutOfResources

    try:
        yield
    except OutOfResources as exc:
        raise ValueError(f"these tiles need {exc.required:,} bytes of {exc.name} and the GPU has {exc.limit:,}: "
                         "pass smaller block_m / block_n or num_stages, or leave them out for the defaults "
                         "(float32 tiles take twice the memory of bfloat16)") from None


def choose_backend() -> None:
    if _INTERPRETING or "TRITON_INTERPRET" in os.environ:
        return
    if any(os.path.exists(p) for p in _NVIDIA_NODES):
        import torch

        if torch.cuda.is_available():
            return
    os.environ["TRITON_INTERPRET"] = "1"


def interpreting() -> bool:
    """Whether the kernels run in Triton's CPU interpreter (decided on the first call)."""
    if not _INTERPRETING:
        choose_backend()
        _INTERPRETING.append(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False"))
    return _INTERPRETING[0]


def backend() -> str:
    """'interpreter' when the kernels run in Triton's CPU interpreter, else 'cuda'."""
    return "interpreter" if interpreting() else "cuda"


@dataclass(frozen=True)
class DeviceFacts:
    """What the launch rules ask of a device, looked up once (device_facts)."""

    type: str                  # 'cuda' or 'cpu' (the interpreter)
    capability: tuple          # (major, minor); (0, 0) off CUDA
    sm_count: int              # streaming multiprocessors (persistent grids); 4 in the interpreter
    family: str | None         # 'h100' / 'h200' where per-device defaults were measured, else None
    warp_specialize: bool      # Hopper + a Triton with device-side tensor descriptors; TILESCOPE_WS=0: off
    tma: bool                  # host tensor descriptors, opt-in with TILESCOPE_TMA=1


_FACTS: dict = {}


def device_facts(device) -> DeviceFacts:
    """The DeviceFacts of a torch device (or its str), computed on first use and kept.

    Arguments:
        device: a torch.device or device string, e.g. q.device.
    Returns:
        DeviceFacts. Off CUDA, or in the interpreter: no capability, 4 SMs, no WS, no TMA."""
    facts = _FACTS.get(device)
    if facts is None:
        facts = _FACTS[device] = _look_up(device)
    return facts


def _look_up(device) -> DeviceFacts:
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or interpreting():
        # interpreter: a handful of programs; the order they run in is still real
        return DeviceFacts(dev.type, (0, 0), 4, None, False, False)
    import triton

    index = dev.index if dev.index is not None else torch.cuda.current_device()
    cap = tuple(torch.cuda.get_device_capability(index))
    name = torch.cuda.get_device_name(index).lower()
    family = next((f for f in ("h100", "h200") if f in name), None)
    ws = cap[0] == 9 and hasattr(triton, "set_allocator") and os.environ.get("TILESCOPE_WS", "1") != "0"
    tma = cap[0] >= 9 and os.environ.get("TILESCOPE_TMA", "0") == "1"
    if tma:
        try:
            from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
        except ImportError:
            tma = False
    return DeviceFacts("cuda", cap, torch.cuda.get_device_properties(index).multi_processor_count,
                       family, ws, tma)


def clear_device_facts() -> None:
    """Forget the looked-up facts (tests that change TILESCOPE_WS / TILESCOPE_TMA)."""
    _FACTS.clear()
