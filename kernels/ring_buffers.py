"""The ring's K/V buffers: the slot each step receives into and the next step sends on, optionally
allocated from a memory pool registered with the ring's NCCL communicator (kernels.ring.REGISTERED_BUFFERS).

Unregistered, a transfer goes source -> NCCL's staging buffer on the receiver -> destination, a
copy kernel on each side. With both ends' buffers registered (NCCL >= 2.23 registers intra-node
point-to-point buffers, `ncclCommRegister`; in torch a `MemPool` on the backend's `mem_allocator`
and `register_mem_pool`) the sender's copy kernel writes straight into the receiver's buffer:
one copy instead of two, so less SM and HBM time taken from the attention beside it. NCCL asks
that every buffer of a send/recv pair be registered (mixing is undefined), so the caller's own
K/V, which step 0 sends, are first copied into a registered slot too. That copy, beside step 0,
cost what a transfer saved on 2 x H200 (kernels.ring.REGISTERED_BUFFERS stays off).

Registration is slow (IPC handles exchanged with the peer on first use), so the slots live in a
workspace per process group, reused by every ring call of the same shape and dtype; a new shape
replaces it (`release_workspaces()` frees them all). Rings over one group must then run one at a
time in stream order, as the ring's own calls do. A slot is (2, B, H_kv, N_local, D): K and V
travel as one message.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# per NCCL backend (id): (key, backend, pool, slots) of the one workspace kept for it
_WORKSPACES: dict[int, tuple] = {}


def nccl_backend(group, device: torch.device):
    """The group's NCCL backend for `device`, if it can register a memory pool (torch >= 2.6 built
    with NCCL, a CUDA device); otherwise None (gloo, CPU, an older torch)."""
    pg_nccl = getattr(dist, "ProcessGroupNCCL", None)
    if device.type != "cuda" or pg_nccl is None or not hasattr(torch.cuda, "MemPool"):
        return None
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(device)
    except RuntimeError:        # the group has no backend for this device
        return None
    if not isinstance(backend, pg_nccl) or not hasattr(backend, "register_mem_pool"):
        return None
    return backend


def registered_slots(kv_shape, dtype, device, n_slots: int, group) -> list[torch.Tensor] | None:
    """n_slots tensors (2, *kv_shape) from a pool registered with the group's NCCL communicator,
    reused across calls; None where registration is not available (see nccl_backend)."""
    backend = nccl_backend(group, device)
    if backend is None:
        return None
    key = (device.index, dtype, tuple(kv_shape), n_slots)
    held = _WORKSPACES.get(id(backend))
    if held is not None and held[0] == key:
        return held[3]
    if held is not None:        # another shape: free the old slots once no queued work uses them
        _release(_WORKSPACES.pop(id(backend)))
    pool = torch.cuda.MemPool(backend.mem_allocator)
    with torch.cuda.use_mem_pool(pool, device=device):
        slots = [torch.empty((2, *kv_shape), dtype=dtype, device=device) for _ in range(n_slots)]
    backend.register_mem_pool(pool)
    _WORKSPACES[id(backend)] = (key, backend, pool, slots)
    return slots


def release_workspaces() -> None:
    """Deregister and free every registered workspace of this process (before
    destroy_process_group; the next registered ring makes its own again)."""
    while _WORKSPACES:
        _release(_WORKSPACES.popitem()[1])


def _release(held: tuple) -> None:
    key, backend, pool, slots = held
    torch.cuda.synchronize(key[0])     # NCCL unmaps the buffers at once, queued work or not
    backend.deregister_mem_pool(pool)
    slots.clear()


def kv_slots(own: tuple, n_buffers: int, group, registered: bool, chunks: int = 1):
    """(send, buffers, packed) for a ring over `group` whose step 0 holds `own` = (k, v), each
    (B, H_kv, N_local, D) contiguous: `send` the (k, v) step 0 sends, `buffers` n_buffers (k, v)
    receive slots. chunks > 1 (kernels.ring.CHUNKED_KV): slots hold K and V chunk-major,
    (chunks, B, H_kv, N_local / chunks, D), so that each zigzag half is a contiguous tensor.
    Registered (CUDA + NCCL): `packed` lists the whole (2, ...) slots, send slot first, each
    travelling as one message; otherwise packed is None and K and V travel apart. `send` is
    `own` itself where its layout fits and nothing is registered, else a slot that fill_send
    fills before the first transfer."""
    k = own[0]
    b, h, n, d = k.shape
    shape = k.shape if chunks == 1 else (chunks, b, h, n // chunks, d)
    slots = registered_slots(shape, k.dtype, k.device, n_buffers + 1, group) if registered else None
    if slots is not None:
        return (slots[0][0], slots[0][1]), [(s[0], s[1]) for s in slots[1:]], slots
    fresh = lambda: torch.empty(shape, dtype=k.dtype, device=k.device)  # noqa: E731
    return (own if chunks == 1 else (fresh(), fresh())), [(fresh(), fresh()) for _ in range(n_buffers)], None


def fill_send(send: tuple, own: tuple) -> None:
    """The caller's k, v (B, H_kv, N_local, D) into the send slot, plain or chunk-major: one copy each."""
    for slot, t in zip(send, own):
        if slot.dim() == t.dim():
            slot.copy_(t)
        else:                     # (chunks, B, H_kv, c, D) <- (B, H_kv, chunks * c, D)
            slot.copy_(t.unflatten(2, (slot.shape[0], slot.shape[3])).permute(2, 0, 1, 3, 4))


def held_rows(held: tuple, lo: int, hi: int) -> tuple:
    """Key rows [lo, hi) of the held (k, v): a slice, or in a chunk-major slot the one chunk they are."""
    k, v = held
    if k.dim() == 4:
        return k[:, :, lo:hi], v[:, :, lo:hi]
    c = k.shape[3]
    if lo % c or hi - lo != c:
        raise ValueError(f"rows [{lo}, {hi}) are not one chunk of {c} rows of a chunk-major slot")
    return k[lo // c], v[lo // c]
