"""What a traced ring reports per step (kernels.ring.ring_attention's `trace`): the step records
with their times, and the traced rows' partial softmax states, computed in float64 after the ring."""

from __future__ import annotations

import torch


def emit_steps(trace, records, times, cuda) -> None:
    """Calls trace(record) per step with the clock's times (ns from the ring's start) filled in."""
    nan = float("nan")
    for rec in records:
        s = rec["step"]
        start = times.get((s, "comm_start"), nan)
        # CUDA: send and receive are one batched NCCL launch and end together; gloo stamps each
        send_end = times.get((s, "comm_end" if cuda else "send_end"), nan)
        recv_end = times.get((s, "comm_end" if cuda else "recv_end"), nan)
        trace(dict(rec, compute_start=times[(s, "compute_start")], compute_end=times[(s, "compute_end")],
                   send_start=start, send_end=send_end, recv_start=start, recv_end=recv_end))


def row_stats(q, k_call, call, chunk, kv_chunks, rows, sm_scale) -> list[dict]:
    """For traced local rows inside this call (batch 0, head 0): the row's partial softmax state
    (m, l) over each K/V chunk of the call, in float64 beside the kernel (one row against the
    chunk), and the call's lse from the same scores, which the merged states must reproduce (the
    kernel merged its own straight into the ring's accumulator)."""
    from .shapes import softmax_scale

    out = []
    scale = softmax_scale(sm_scale, q.shape[-1])
    nq, nk = call.q_hi - call.q_lo, call.k_hi - call.k_lo
    for row in rows:
        if not call.q_lo <= row < call.q_hi:
            continue
        i = row - call.q_lo
        s = (q[0, 0, row].double() @ k_call.double().T) * scale                   # (N_k,)
        if call.causal:
            s[i + nk - nq + 1:] = float("-inf")
        call_lse = float(torch.logsumexp(s, 0))
        for j in range(call.k_lo // chunk, call.k_hi // chunk):
            part = s[j * chunk - call.k_lo:(j + 1) * chunk - call.k_lo]
            m = float(part.max())
            if m == float("-inf"):
                continue
            out.append(dict(row=int(row), kv_chunk=int(kv_chunks[j]), m=m,
                            l=float(torch.exp(part - m).sum()), call_lse=call_lse))
    return out
