"""Run a Hugging Face transformers model's attention through Tilescope's kernels, and record it.

    from instrumentation import hf
    hf.use_tilescope(model)                  # attention -> kernels.flash_attention / flash_decode
    with hf.capture(model) as run:           # a trace of every attention call
        model.generate(ids, max_new_tokens=16)
    run.save("runs/mine")                    # ModelRun.load("runs/mine") needs no transformers

How a call maps onto the kernels. transformers hands each layer query (B, H, N_q, D) and key,
value (B, H_kv, N_k, D); they go to the kernel as they are (grouped-query heads without
repeat_kv). The mask is causal on the N_q x N_k grid, bottom-right aligned (the last query sits
at the last key), or the layer's sliding window ("sliding_window:W": W from the call's
`sliding_window` argument, else the module's attribute; query i sees keys i-W < j <= i, as
transformers' own sliding masks). A step with a KV cache and a few queries (N_q <= 16 < N_k;
one query on a sliding-window layer, which then sees only its last W keys) is a decode step
through `flash_decode`; everything else is a prefill through `flash_attention`, with
sm_scale = the layer's `scaling`.

The mask transformers builds for our name is its own SDPA mask: None where the pattern is plain
causal, a boolean (B, 1, N_q, N_k) tensor otherwise. A given mask is compared with the kernel's
pattern, entry by entry, and any difference is refused (a padded batch, a packed or custom
mask). Refused as well, each in one ValueError line: logit soft-capping, dropout, ALiBi and other
position biases, attention sinks, and gradients through decode steps or a capture (prefill
trains through flash_attention's autograd). Nothing is computed silently different from what the
model asks for.

Under torch.compile, and for a padding-free batch (transformers' cu_seq_lens_q/k, max_length_q/k
kwargs: flash_attention_varlen), a call reads nothing on the host: the key range comes from shapes
and the mask on the device, and the mask is checked on its edges only (a mismatch gives NaN
output); the entry-by-entry comparison is eager-only. See instrumentation.hf_compiled.
"""

from __future__ import annotations

import contextlib
import inspect
import time

import torch

from kernels import flash_attention, flash_decode
from kernels.decode import MAX_QUERIES

# the eager mask check (instrumentation.hf_mask); kernel_pattern and MASK_CHECK_ELEMENTS re-exported
from .hf_mask import MASK_CHECK_ELEMENTS, check_mask_shape as _check_mask_shape, kernel_pattern, key_end as _key_end  # noqa: F401

NAME = "tilescope"
CAPTURED_INPUTS = "the model's own activations (instrumentation.hf.capture)"   # a captured trace's meta 'inputs'
_UNSET = object()
_CAPTURE: list = []        # the capture in progress (at most one)


# -- registration ---------------------------------------------------------------------------------

def _transformers():
    """transformers' attention and mask registries (both 5.x APIs), or one clear ImportError."""
    try:
        import transformers
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as exc:
        raise ImportError("instrumentation.hf needs transformers >= 5 (AttentionInterface and "
                          f"masking_utils.AttentionMaskInterface): {exc}; pip install 'transformers>=5'") from None
    return transformers, AttentionInterface, AttentionMaskInterface, sdpa_mask


def register() -> str:
    """Register the attention function and its mask builder under the name 'tilescope'.

    Returns:
        the name, for `attn_implementation=` (from_pretrained) or `model.set_attn_implementation`."""
    _, attention_interface, mask_interface, sdpa_mask = _transformers()
    params = inspect.signature(sdpa_mask)

    def tilescope_mask(*args, **kwargs):
        # transformers' SDPA mask, except that it is always built where N_q > 1 and N_k != N_q:
        # SDPA reads a left-out mask there as top-left causal (a static cache's empty slots),
        # which would be ambiguous here; with the mask in hand the slots are checked and cut
        bound = params.bind_partial(*args, **kwargs)
        q_len, kv_len = bound.arguments.get("q_length"), bound.arguments.get("kv_length")
        if isinstance(q_len, int) and isinstance(kv_len, int) and q_len > 1 and kv_len != q_len:
            bound.arguments["allow_is_causal_skip"] = False
        return sdpa_mask(*bound.args, **bound.kwargs)

    attention_interface.register(NAME, attention_forward)
    mask_interface.register(NAME, tilescope_mask)
    return NAME


def _config_refusal(config) -> str | None:
    """Why a model with this config cannot run on the kernel, or None."""
    for c in (config, getattr(config, "text_config", None)):
        if c is None:
            continue
        cap = getattr(c, "attn_logit_softcapping", None)
        if cap is not None:
            return (f"{c.model_type} applies attention logit soft-capping (attn_logit_softcapping={cap}), "
                    "which Tilescope's kernel does not: keep attn_implementation='eager' for this model")
        if getattr(c, "alibi", False) or getattr(c, "use_alibi", False) or \
                getattr(c, "position_embedding_type", None) == "alibi":
            return (f"{c.model_type} uses ALiBi position biases, which Tilescope's kernel does not add: "
                    "keep this model on attn_implementation='eager' or 'sdpa'")
    return None


def use_tilescope(model):
    """Run every attention call of `model` through Tilescope's kernels (see the module doc).

    Arguments:
        model: a transformers PreTrainedModel (5.x) whose attention goes through
            AttentionInterface (Llama, Mistral, Qwen2/3, Gemma 3, ...).
    Returns:
        the model, its config._attn_implementation now 'tilescope'. What the kernel cannot
        express is refused here (soft-capping, ALiBi) or at the call (padding, dropout)."""
    register()
    refusal = _config_refusal(model.config)
    if refusal:
        raise ValueError(refusal)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(NAME)
    else:
        model.config._attn_implementation = NAME
    if model.config._attn_implementation != NAME:
        raise ValueError(f"{type(model).__name__} does not dispatch its attention through transformers' "
                         "AttentionInterface, so Tilescope's kernel cannot be plugged in; use a model "
                         "that does (Llama, Mistral, Qwen2, ...)")
    return model


# -- one call ---------------------------------------------------------------------------------------

def _refuse(module, query, key, value, dropout, softcap, kwargs) -> None:
    """One ValueError line for what the kernel cannot do, before anything runs."""
    where = f"layer {getattr(module, 'layer_idx', '?')}"
    if softcap is not None:
        raise ValueError(f"{where}: attention logit soft-capping (softcap={softcap}) is not supported by "
                         "Tilescope's kernel; keep attn_implementation='eager' for this model")
    if dropout:
        raise ValueError(f"{where}: attention dropout {dropout} (training) is not supported: Tilescope's "
                         "kernel has no dropout; call model.eval() or train with 'sdpa'")
    if kwargs.get("position_bias") is not None or kwargs.get("alibi") is not None:
        raise ValueError(f"{where}: ALiBi / position biases added to the scores are not supported by "
                         "Tilescope's kernel; keep this model on 'eager' or 'sdpa'")
    if kwargs.get("s_aux") is not None or getattr(module, "sinks", None) is not None:
        raise ValueError(f"{where}: attention sinks are not supported by Tilescope's kernel; keep this "
                         "model on 'eager'")
    if value.shape[-1] != query.shape[-1] or key.shape[-1] != query.shape[-1]:
        raise ValueError(f"{where}: query, key and value head dims differ ({query.shape[-1]}, "
                         f"{key.shape[-1]}, {value.shape[-1]}); the kernel needs one head dim")


def _layer_settings(module, query, key, value, dropout, sliding_window, softcap, kwargs):
    """The refusals, then the layer's (window W or None, causal, layer index, 'layer i' for messages)."""
    _refuse(module, query, key, value, dropout, softcap, kwargs)
    window = getattr(module, "sliding_window", None) if sliding_window is _UNSET else sliding_window
    window = int(window) if window else None
    causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if causal is None else causal)
    layer = getattr(module, "layer_idx", None)
    return window, causal, layer, f"layer {layer if layer is not None else '?'}"


def plan_call(module, query, key, value, attention_mask, dropout=0.0, sliding_window=_UNSET,
              softcap=None, kwargs=None) -> dict:
    """What one attention call runs: phase, mask text and the key range [k_start, k_end).

    Arguments: as attention_forward's. Returns: a dict with phase ('prefill' | 'decode'),
    mask (kernels.masks text), k_start, k_end, layer, window (the layer's W or None)."""
    kwargs = kwargs or {}
    window, causal, layer, where = _layer_settings(module, query, key, value, dropout, sliding_window, softcap,
                                                   kwargs)
    n_q, n_k = query.shape[2], key.shape[2]
    end = _key_end(attention_mask, query.shape[0], query.shape[1], n_q, n_k, causal, window, where)
    decode = causal and n_q < end and n_q <= MAX_QUERIES and (window is None or n_q == 1)
    start = max(0, end - window) if decode and window is not None else 0
    mask = ("sliding_window:%d" % window if window is not None and not decode else
            "causal" if causal else "full")
    return {"phase": "decode" if decode else "prefill", "mask": mask, "k_start": start, "k_end": end,
            "layer": layer, "window": window}


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      sliding_window=_UNSET, softcap=None, **kwargs):
    """The function registered in transformers' AttentionInterface.

    Arguments:
        module: the attention layer (its layer_idx, sliding_window, is_causal are read).
        query: (B, H, N_q, D); key, value: (B, H_kv, N_k, D).
        attention_mask: None or transformers' 4-D mask (checked against the kernel's pattern).
        scaling: the softmax scale (None: 1/sqrt(D)); dropout, softcap: refused unless 0 / None.
        sliding_window: the layer's window W, if it has one.
    Returns:
        (attn_output (B, N_q, H, D) in query's dtype, None): no attention weights. Under
        torch.compile, and for a padding-free batch (cu_seq_lens_q in kwargs), the call reads
        nothing on the host (instrumentation.hf_compiled)."""
    if torch.compiler.is_compiling() or kwargs.get("cu_seq_lens_q") is not None:
        return _forward_without_host_reads(module, query, key, value, attention_mask, scaling, dropout,
                                           sliding_window, softcap, kwargs), None
    plan = plan_call(module, query, key, value, attention_mask, dropout, sliding_window, softcap, kwargs)
    k = key[:, :, plan["k_start"]:plan["k_end"]]
    v = value[:, :, plan["k_start"]:plan["k_end"]]
    capture = _CAPTURE[-1] if _CAPTURE else None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)) and \
            (plan["phase"] == "decode" or capture is not None):
        # prefill trains through flash_attention's autograd; decode and traced calls do not
        raise ValueError(f"layer {plan['layer']}: decode steps and captured calls are forward-only (no "
                         "gradients): run them under torch.no_grad() (generate does)")
    if capture is not None and capture.wants(plan["layer"]):
        out = capture.record_call(plan, query, k, v, scaling)
    elif plan["phase"] == "decode":
        out = flash_decode(query, k, v, sm_scale=scaling)
    else:
        out = flash_attention(query, k, v, mask=plan["mask"], sm_scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _forward_without_host_reads(module, query, key, value, mask, scaling, dropout, sliding_window, softcap,
                                kwargs):
    """attention_forward under torch.compile or for a packed batch: (B, N_q, H, D)."""
    from . import hf_compiled

    window, causal, layer, where = _layer_settings(module, query, key, value, dropout, sliding_window, softcap,
                                                   kwargs)
    if _CAPTURE:
        raise ValueError(f"{where}: hf.capture records eagerly; run the captured model uncompiled and without "
                         "cu_seq_lens (a padding-free batch)")
    if kwargs.get("cu_seq_lens_q") is not None:
        return hf_compiled.packed_forward(query, key, value, mask, kwargs, causal, window, scaling, where)
    _check_mask_shape(mask, query.shape[0], query.shape[1], query.shape[2], key.shape[2], causal, where)
    n_q, n_k = query.shape[2], key.shape[2]
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)) and \
            (causal and n_q < n_k and n_q <= MAX_QUERIES):
        raise ValueError(f"{where}: decode steps are forward-only (no gradients): run them under "
                         "torch.no_grad() (generate does)")
    return hf_compiled.compiled_forward(query, key, value, mask, scaling, causal, window, where)


# -- capture ----------------------------------------------------------------------------------------

class _Capture:
    """Records the calls of the selected layers into a ModelRun while it is active."""

    def __init__(self, model_run, layers, heads, measure: bool):
        self.model_run, self.layers, self.heads, self.measure = model_run, layers, heads, measure
        self.step = -1

    def new_step(self, *_args, **_kwargs) -> None:
        self.step += 1

    def wants(self, layer) -> bool:
        return self.layers is None or layer in self.layers

    def record_call(self, plan, q, k, v, scaling):
        from .recording import record, record_decode
        from .recording.environment import DTYPE_NAMES
        from .recording.model_run import ModelCall

        b, h, n_q, d = q.shape
        extra = {"model_call": {"step": max(self.step, 0), "layer": plan["layer"], "phase": plan["phase"],
                                "model": self.model_run.meta.get("model")},
                 "inputs": CAPTURED_INPUTS}      # not make_inputs: no page may regenerate them
        sync = torch.cuda.synchronize if q.is_cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        if plan["phase"] == "decode":
            out, trace = record_decode(q, k.contiguous() if k.stride(-1) != 1 else k,
                                       v.contiguous() if v.stride(-1) != 1 else v, sm_scale=scaling,
                                       measure=self.measure, meta_extra=extra)
        else:
            heads = [x for x in (self.heads or []) if 0 <= x < b * h][:8]
            out, trace = record(q, k, v, mask=plan["mask"], sm_scale=scaling, level="full" if heads else "work",
                                trace_head=heads or 0, measure=self.measure, meta_extra=extra)
        sync()
        wall_ms = (time.perf_counter() - t0) * 1e3
        self.model_run.calls.append(ModelCall(
            index=len(self.model_run.calls), step=max(self.step, 0), layer=plan["layer"], phase=plan["phase"],
            batch=b, heads=h, kv_heads=k.shape[1], n_q=n_q, n_k=k.shape[2], head_dim=d,
            dtype=DTYPE_NAMES[q.dtype], mask=trace.meta.get("mask", plan["mask"]), window=plan["window"],
            wall_ms=wall_ms, kernel_ms=trace.meta.get("untraced_ms"), trace=trace))
        return out


def _model_meta(model) -> dict:
    from .recording.environment import environment
    from .trace.files import utc_now

    transformers = _transformers()[0]
    c = model.config
    text = getattr(c, "text_config", None) or c
    param = next(model.parameters(), None)
    keys = ("model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "hidden_size", "sliding_window", "layer_types", "max_position_embeddings")
    return {"model": type(model).__name__, "config": {k: getattr(text, k, None) for k in keys},
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "created": utc_now(), "device": str(param.device) if param is not None else "cpu",
            "environment": environment(param.device if param is not None else torch.device("cpu"))}


@contextlib.contextmanager
def capture(model, layers=None, heads=None, measure: bool = True):
    """Record a trace of each attention call while the block runs a real model(...) or
    model.generate(...), and yield the ModelRun they go into.

    Arguments:
        model: a transformers model; switched to Tilescope's attention for the block (and back
            to its previous implementation after) if it was not already.
        layers: layer indices to record (None: all); the other layers run untraced.
        heads: query heads (of batch 0, at most 8) whose tiles and softmax rows prefill traces
            keep ('full' level); None: work items only ('work' level, the smallest trace).
        measure: on CUDA, also time each call's untraced kernel (do_bench medians; slower).
    Returns:
        a context manager yielding a ModelRun; run.calls gains one ModelCall per recorded call
        (layer, phase, trace, shapes, timings) in the order they ran."""
    from .recording.model_run import ModelRun

    if _CAPTURE:
        raise ValueError("a capture is already running; nest no captures (one ModelRun at a time)")
    layers = None if layers is None else {int(x) for x in ([layers] if isinstance(layers, int) else layers)}
    heads = None if heads is None else [int(x) for x in ([heads] if isinstance(heads, int) else heads)]
    if heads is not None and (len(heads) > 8 or any(x < 0 for x in heads)):
        raise ValueError(f"heads must be up to 8 query-head indices >= 0, got {heads}")
    previous = model.config._attn_implementation
    if previous != NAME:
        use_tilescope(model)
    run = ModelRun(meta=_model_meta(model))
    run.meta["captured"] = {"layers": sorted(layers) if layers is not None else "all", "heads": heads,
                            "level": "full" if heads else "work", "measure": bool(measure)}
    cap = _Capture(run, layers, heads, measure)
    hook = model.register_forward_pre_hook(cap.new_step)
    _CAPTURE.append(cap)
    try:
        with torch.no_grad():
            yield run
    finally:
        _CAPTURE.remove(cap)
        hook.remove()
        if previous != NAME and hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(previous)
        elif previous != NAME:
            model.config._attn_implementation = previous


__all__ = ["use_tilescope", "capture", "register", "attention_forward", "plan_call", "kernel_pattern", "NAME"]
watch = lambda model, out, *args, **kwargs: __import__("instrumentation.watch").watch.watch(model, out, *args, **kwargs)  # noqa: E731 -- instrumentation.watch.watch (lazy: watch imports hf)
