"""Where the kernels run, decided once, before Triton is imported — and without importing torch
when the machine has no NVIDIA device at all (so a CPU machine opens recordings quickly).

TRITON_INTERPRET=1 (the CPU interpreter) is set unless the caller already chose, or CUDA is
available.
"""

import os

# Linux and WSL2 device nodes; without them there is no CUDA device to ask torch about
_NVIDIA_NODES = ("/dev/nvidiactl", "/dev/dxg")

# the kernel takes any head dim 1..MAX_HEAD_DIM (padded inside to a power of two with masked
# loads); these are the ones menus offer (GPT-2 64, Phi-2 80, Llama/Mistral/Qwen 128, Gemma-2 256)
MAX_HEAD_DIM = 256
SUPPORTED_HEAD_DIMS = (16, 32, 64, 80, 96, 128, 160, 192, 256)
SCHEDULES = ("natural", "longest_first", "persistent")
# The CPU interpreter runs one numpy op at a time; past this many computed tiles a run takes
# minutes, so we refuse and point to a GPU or a bundled recording instead.
INTERPRETER_MAX_TILES = 10_000


def choose_backend() -> None:
    if "TRITON_INTERPRET" in os.environ:
        return
    if any(os.path.exists(p) for p in _NVIDIA_NODES):
        import torch

        if torch.cuda.is_available():
            return
    os.environ["TRITON_INTERPRET"] = "1"


def interpreting() -> bool:
    choose_backend()
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def backend() -> str:
    """'interpreter' when the kernels run in Triton's CPU interpreter, else 'cuda'."""
    return "interpreter" if interpreting() else "cuda"
