"""Where a recording ran: device, driver and library versions; and the torch dtype table."""

from __future__ import annotations

import platform
import subprocess
from functools import lru_cache

import torch
import triton

from kernels import backend

from .inputs import TORCH_DTYPES

DTYPES = TORCH_DTYPES()                    # 'fp16' -> torch.float16 (the table: trace.files.DTYPES)
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@lru_cache(maxsize=1)
def _driver_version() -> str | None:
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device) -> dict:
    """Device name, driver and library versions of this run."""
    device = torch.device(device)
    env = {"backend": backend(), "torch_version": torch.__version__,
           "triton_version": triton.__version__, "python_version": platform.python_version()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=props.name, sm_count=props.multi_processor_count,
                   cuda_version=torch.version.cuda, driver_version=_driver_version(),
                   compute_capability=f"{props.major}.{props.minor}",
                   total_memory_bytes=int(props.total_memory))     # the memory chart's capacity line
    else:
        env.update(device_name=f"CPU {platform.machine()} ({platform.processor() or 'unknown'})",
                   sm_count=None, cuda_version=None, driver_version=None)
    return env
