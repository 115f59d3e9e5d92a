"""The sidebar's "About the sources" (app.about), headless: it names every text in the design
folder's seeds/ by its title.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.app.headless import live


SEEDS = Path(__file__).resolve().parents[3] / "shared" / "seeds"


def test_about_the_sources_names_every_text_by_title(data_dir):
    from app.about import TEXTS

    at = live(data_dir, page="block_skip", mask="causal")
    about = next(e for e in at.sidebar.expander if e.label == "About the sources")
    shown = " ".join(m.value for m in about.markdown)
    assert len(TEXTS) == 5
    for t in TEXTS.values():
        assert t.title in shown
    if SEEDS.is_dir():                       # each title is the text's own (its first lines)
        heads = [" ".join(p.read_text(errors="replace")[:400].split()) for p in sorted(SEEDS.glob("*.txt"))]
        assert len(heads) == len(TEXTS)
        for t in TEXTS.values():
            words = [w for w in re.findall(r"[A-Za-z]{4,}", t.title)]
            assert any(all(w.lower() in h.lower() for w in words) for h in heads), t.title


def test_about_quotes_the_fp8_passage_verbatim_and_says_what_fa3_scales(data_dir):
    from app.about import FP8_PASSAGE, FP8_PRECISELY

    if SEEDS.is_dir():                       # each quoted paragraph is the chapter's own words
        chapter = next(p.read_text(errors="replace") for p in sorted(SEEDS.glob("*.txt"))
                       if "An Attention Matrix That Never Fit in Cache" in p.read_text(errors="replace")[:400])
        for passage in FP8_PASSAGE:
            assert passage in chapter
    assert "block scaling of the softmax statistics" in FP8_PASSAGE[1]
    for fact in ("per tile of Q", "of K and of V", "fp32", "fixed scale", "Hadamard", "loose"):
        assert fact in FP8_PRECISELY, fact
    at = live(data_dir, page="block_skip", mask="causal")
    about = next(e for e in at.sidebar.expander if e.label == "About the sources")
    shown = " ".join(m.value for m in about.markdown)
    assert all(p in shown for p in FP8_PASSAGE) and FP8_PRECISELY in shown
