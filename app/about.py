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
