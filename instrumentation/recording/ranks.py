"""Start one process per rank inside one torch.distributed process group (NCCL between GPUs,
gloo on the CPU), collect each rank's result, and describe how the GPUs are linked."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

# NVLink multicast stays off on the lent machines (a program that uses it can take a shared host's
# GPUs out of service); set before any rank starts, inherited by every spawned process
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def launch(fn, world: int, backend: str = "gloo", args: tuple = ()) -> list:
    """Run fn(rank, world, *args) in `world` processes inside one process group; return each
    rank's result (rank order). nccl gives rank r the GPU r."""
    import torch
    import torch.multiprocessing as mp

    if backend == "nccl" and torch.cuda.device_count() < world:
        raise ValueError(f"--world-size {world} needs {world} GPUs; {torch.cuda.device_count()} "
                         "visible (use --backend gloo to run on the CPU)")
    os.environ.update(SAFE_ENV)
    with tempfile.TemporaryDirectory(prefix="tilescope-ring-") as tmp:
        mp.start_processes(_rank_main, args=(world, backend, tmp, fn, args), nprocs=world, join=True,
                           start_method=_start_method(backend))
        # our own children wrote these files a moment ago, into a private temporary directory
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _start_method(backend: str) -> str:
    """CUDA ranks need fresh processes (spawn); CPU ranks fork, which skips importing torch and
    triton again in every rank (seconds each on a small machine)."""
    import multiprocessing

    return "fork" if backend == "gloo" and "fork" in multiprocessing.get_all_start_methods() else "spawn"


def _rank_main(rank, world, backend, tmp, fn, args):
    import torch
    import torch.distributed as dist

    os.environ.update(SAFE_ENV)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)     # several ranks share the CPU cores
    from kernels.ring import nccl_options

    # NCCL: high-priority streams, so a transfer is not queued behind the attention beside it
    dist.init_process_group(backend, init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=world, pg_options=nccl_options() if backend == "nccl" else None,
                            device_id=torch.device("cuda", rank) if backend == "nccl" else None)
    try:
        result = fn(rank, world, *args)
        torch.save(result, Path(tmp) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def provenance(backend: str, world: int) -> dict:
    """NCCL version, and how the GPUs of the ring are linked (`nvidia-smi topo -m`)."""
    import torch

    info = dict(nccl_version=None, links=None, topology=None)
    if backend != "nccl":
        return info
    try:
        info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:   # an older torch or a build without NCCL
        pass
    try:
        text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return info
    info["topology"] = text[:4000]
    matrix = {}
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0].startswith("GPU") and cells[0][3:].isdigit():
            matrix[int(cells[0][3:])] = cells[1:]
    try:
        info["links"] = [matrix[r][(r + 1) % world] for r in range(world)] if world > 1 else []
    except (KeyError, IndexError):
        pass
    return info
