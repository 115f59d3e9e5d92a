"""Published attention shapes of real models, in one place (the dashboard, the benchmarks and
`instrumentation.regenerate` all read them from here).

How to use it (app, scripts):

    from kernels.presets import PRESETS, preset
    p = preset("llama-3-8b")                 # KeyError-free lookup: ValueError lists the names
    p.label, p.heads, p.kv_heads, p.head_dim, p.source, p.notes
    s = p.shape(n=4096)                      # dict(heads=32, kv_heads=8, head_dim=128,
                                             #      n_q=4096, n_k=4096, mask='causal')
    s = p.shape(n=4096, layer=0)             # Gemma-2: layer 0 is local (sliding_window:4096)
    small = p.scaled(max_heads=4)            # same group ratio, few heads: for the interpreter
    q = torch.randn(b, s["heads"], s["n_q"], s["head_dim"]); k = v = (b, s["kv_heads"], s["n_k"], D)
    flash_attention(q, k, v, mask=s["mask"])

`PRESETS` is ordered for a menu (dict name -> ModelPreset). A preset with `n_q`/`n_k` set (chunked
prefill) fixes the query and key lengths; the others take N from the caller. Windows larger than
N behave as causal: `shape()` keeps the model's mask text so the label stays honest.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelPreset:
    name: str                    # URL-safe key
    label: str                   # menu text
    heads: int                   # query heads H
    kv_heads: int                # key/value heads H_kv (GQA; 1 = MQA; = H for MHA)
    head_dim: int                # D
    masks: tuple[str, ...]       # per layer kind, in order (alternating layers repeat the tuple)
    source: str                  # where the numbers are published
    notes: str = ""
    n_q: int | None = None       # fixed query length (chunked prefill), else N
    n_k: int | None = None       # fixed key length, else N

    @property
    def group(self) -> int:
        """Query heads per KV head (what shares K/V in L2)."""
        return self.heads // self.kv_heads

    def mask(self, layer: int = 0) -> str:
        return self.masks[layer % len(self.masks)]

    def shape(self, n: int | None = None, layer: int = 0) -> dict:
        """Kernel arguments for this model at sequence length n (ignored where fixed)."""
        n_q = self.n_q or n
        n_k = self.n_k or n
        if n_q is None or n_k is None:
            raise ValueError(f"preset {self.name!r} needs a sequence length n")
        return dict(heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim,
                    n_q=int(n_q), n_k=int(n_k), mask=self.mask(layer))

    def scaled(self, max_heads: int = 4) -> "ModelPreset":
        """The same head dim and group ratio with at most max(max_heads, group) query heads."""
        kv = max(1, min(self.kv_heads, max_heads // self.group))
        return replace(self, heads=kv * self.group, kv_heads=kv)


PRESETS: dict[str, ModelPreset] = {p.name: p for p in (
    ModelPreset("gpt-2", "GPT-2 (MHA, H 12, D 64)", 12, 12, 64, ("causal",),
                "https://huggingface.co/openai-community/gpt2/blob/main/config.json (n_head 12, n_embd 768)"),
    ModelPreset("llama-3-8b", "Llama-3-8B (GQA 32/8, D 128)", 32, 8, 128, ("causal",),
                "https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json "
                "(num_attention_heads 32, num_key_value_heads 8, hidden_size 4096)"),
    ModelPreset("mistral-7b", "Mistral-7B (GQA 32/8, D 128, window 4096)", 32, 8, 128,
                ("sliding_window:4096",),
                "https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json "
                "(num_attention_heads 32, num_key_value_heads 8, sliding_window 4096)"),
    ModelPreset("qwen2.5-7b", "Qwen2.5-7B (GQA 28/4, D 128)", 28, 4, 128, ("causal",),
                "https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json "
                "(num_attention_heads 28, num_key_value_heads 4, hidden_size 3584)"),
    ModelPreset("gemma-2-9b", "Gemma-2-9B (GQA 16/8, D 256, window 4096 on alternate layers)", 16, 8, 256,
                ("sliding_window:4096", "causal"),
                "https://huggingface.co/google/gemma-2-9b/blob/main/config.json "
                "(num_attention_heads 16, num_key_value_heads 8, head_dim 256, sliding_window 4096)",
                notes="local (sliding window) and global layers alternate; layer=1 is global"),
    ModelPreset("phi-2", "Phi-2 (MHA, H 32, D 80)", 32, 32, 80, ("causal",),
                "https://huggingface.co/microsoft/phi-2/blob/main/config.json "
                "(num_attention_heads 32, hidden_size 2560)"),
    ModelPreset("chunked-prefill", "Chunked prefill (512 queries of 8192 keys, Llama-3-8B heads)",
                32, 8, 128, ("causal",),
                "prefill split into chunks, each attending to the whole cache so far "
                "(Sarathi-Serve, arXiv:2403.02310; vLLM --enable-chunked-prefill)",
                notes="the chunk's queries are the last 512 of 8192 positions", n_q=512, n_k=8192),
)}


def preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        shown = repr(name) if len(repr(name)) <= 40 else "that name"
        raise ValueError(f"unknown model preset {shown}; use one of {', '.join(PRESETS)}") from None
