"""The texts Tilescope visualises, by title (never by file id), and the sidebar's "About the
sources" section. Pages cite a text with `cite(key)`; the texts themselves are in the design
folder's seeds/ (DESIGN.md), and none of them names its author, so neither do we.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from instrumentation.analysis.traffic import FLASH_HBM_FORMULA, NAIVE_HBM_FORMULA


@dataclass(frozen=True)
class Text:
    title: str
    kind: str          # what sort of text, and where it sits in its series
    used_for: str      # what the app takes from it


TEXTS = {
    "vllm_lesson": Text("FlashAttention: same math, different schedule",
                        "vLLM lessons, lesson 3 of 12",
                        f"the HBM-traffic calculator ({NAIVE_HBM_FORMULA} vs {FLASH_HBM_FORMULA}), the "
                        "online-softmax widget, the T = 8192 worked example"),
    "mathematricks": Text("The MathemaTricks behind FlashAttention: fast and memory efficient exact attention",
                          "blog post (CC BY 4.0)",
                          "the online-softmax derivation (running max, rescale α), tile FLOP counts, "
                          "peak-memory naive vs flash"),
    "serving_lesson": Text("Attention asymmetry & FlashAttention",
                           "GPU kernel serving lessons, lesson 12 of 17",
                           "the seven-line online softmax, 8·T² bytes of intermediates, prefill vs decode"),
    "tiling_strategy": Text("FlashAttention — The Tiling Strategy",
                            "explainer series, part 2.2a",
                            "HBM traffic step by step and the scaling table of standard vs flash memory"),
    "cache_chapter": Text("An Attention Matrix That Never Fit in Cache",
                          "book section on FlashAttention, before the book's part on distribution",
                          "IO-awareness, the associative online-softmax merge (ring attention), FP8"),
}


# The cache chapter's FP8 passage, verbatim (two places in its section 4), and what FlashAttention-3
# scales, precisely: the chapter's "block scaling of the softmax statistics" is loose
FP8_PASSAGE = (
    "That low precision is the FP8 story. Running the attention matrix multiplies in 8-bit floating point "
    "roughly doubles the achievable arithmetic rate again, but naive FP8 would lose too much accuracy in the "
    "score and probability values. FlashAttention-3 keeps the running softmax statistics in higher precision "
    "and applies block-level scaling so that the bulk of the multiply work runs in FP8 while the numerically "
    "sensitive accumulation stays accurate.",
    "FlashAttention-3 (Shah et al., 2024) brought asynchronous, warp-specialized FP8 attention to Hopper "
    "accelerators, reporting throughput well beyond FlashAttention-2 while keeping accuracy through block "
    "scaling of the softmax statistics.",
)
FP8_PRECISELY = (
    "What FlashAttention-3 scales, precisely: the block scales belong to the *inputs* of the two products, "
    "one fp32 scale per tile of Q (a block of query rows), of K and of V (blocks of key rows); ours is the "
    "tile's largest magnitude over e4m3's largest value, 448. The softmax statistics (each row's running "
    "max m and denominator l) are not block-scaled at all: they stay in fp32, unscaled, as does the output "
    "accumulator. P = exp(S − m) lies in [0, 1] after the running max, so it is cast to e4m3 with one fixed "
    "scale, no per-block one. Before quantising, Q and K are multiplied by the same random orthogonal "
    "(signed Hadamard) matrix, which leaves Q·Kᵀ unchanged and spreads outlier features over the head "
    "dimension (the paper's \"incoherent processing\"). So the chapter's \"block scaling of the softmax "
    "statistics\" is loose: the statistics are kept in higher precision, as its first passage says, and "
    "the block scaling is of Q, K and V.")


def cite(key: str) -> str:
    """A text's title in quotes, with its kind: what a page writes where it uses the text."""
    t = TEXTS[key]
    return f"“{t.title}” ({t.kind})"


def about_sources() -> None:
    """The sidebar section naming every text the app visualises."""
    with st.expander("About the sources"):
        st.markdown("Tilescope draws what these texts explain, and checks their formulas and "
                    "tables against the kernel's own recordings:")
        st.markdown("\n".join(f"- **{t.title}** — {t.kind}. *Used for:* {t.used_for}."
                              for t in TEXTS.values()))
        st.markdown(f"**FP8**, in {cite('cache_chapter')}, verbatim:")
        st.markdown("\n\n".join(f"> {p}" for p in FP8_PASSAGE))
        st.markdown(FP8_PRECISELY + " The Low precision page measures both kinds of scaling on our FP8 kernel.")
