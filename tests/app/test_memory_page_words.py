"""The memory page's bottom half reads like a slide (issue 13 review item 13): byte counts carry
units (decimal MB/GB, the one byte formatter), maths is typeset ($…$ or Unicode), sentences start
with a capital, and the scaling table is split so no column is clipped."""

import re

import pytest

pytest.importorskip("streamlit")
from app.figures._common import fmt_bytes  # noqa: E402
from instrumentation.analysis import hbm  # noqa: E402
from tests.app.headless import open_page  # noqa: E402

RAW_BYTES = re.compile(r"\b\d{1,3}(?:,\d{3}){2,} B\b")          # "75,497,472 B"


def _outside_latex(text: str) -> str:
    return re.sub(r"\$[^$]*\$", "", text)


@pytest.fixture(scope="module")
def page():
    at = open_page("memory", mem_T="8192")
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_counted_bytes_carry_units(page):
    counted = [m.value for m in page.markdown if "K/V tiles the kernel visited" in m.value]
    assert counted, [m.value[:60] for m in page.markdown]
    text = counted[0]
    assert not RAW_BYTES.search(text), text
    assert re.search(r"Q [\d.]+ (kB|MB|GB) \+ K [\d.]+ (kB|MB|GB)", text), text
    metrics = {m.label: m.value for m in page.metric}
    naive = hbm.naive_hbm_bytes(8192, 32, 128)
    assert metrics["naive HBM"] == fmt_bytes(naive) == "17.4 GB"


def test_captions_typeset_maths_and_start_sentences_with_capitals(page):
    captions = [c.value for c in page.caption]
    bottom = [c for c in captions if "MiB" in c or "rounding slip" in c or "Tiled flash" in c]
    assert len(bottom) >= 2, captions
    for text in bottom:
        plain = _outside_latex(text)
        assert "^" not in plain and "*2" not in plain, text          # no plain-text maths
        assert not re.search(r"\. [a-z]", plain.replace("e.g. ", "").replace("i.e. ", "")), text
        assert not RAW_BYTES.search(text), text
    assert any("$N^2/B_q$" in c for c in captions)


def test_scaling_table_is_two_narrow_tables(page):
    frames = [d.value for d in page.dataframe if "N" in d.value.columns and len(d.value) == 3]
    assert len(frames) == 2
    assert all(len(f.columns) <= 5 for f in frames)
    stated, exact = frames
    assert list(stated["seed_standard_mib"]) == [132.0, 528.0, 2112.0]    # the article's numbers, as stated
    assert list(exact["exact_standard_mib"]) == [132.0, 520.0, 2064.0]    # its own formula, exactly


def test_model_curves_write_the_ratio_and_say_model():
    from app.figures._common import title_text
    from app.figures.memory import model_curves_figure

    fig = model_curves_figure(8, 64, 2, 64, ns=[256, 1024, 4096])
    ratio = hbm.naive_hbm_bytes(4096, 8, 64) / hbm.flash_hbm_bytes(4096, 8, 64)
    assert f"= {ratio:,.0f}× less" in title_text(fig) and "ANALYTIC MODEL" in title_text(fig)
    cap = [a.text for a in fig.layout.annotations if a.name == "provenance"][0]
    assert cap.startswith("Model:")
