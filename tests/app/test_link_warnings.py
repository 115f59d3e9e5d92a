"""A link value that falls back is a warning, not an error (the page still works): one line
saying what was wrong and what is used instead (AppTest on the shared small recordings)."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")
from tests.app.headless import charts, open_page  # noqa: E402


@pytest.mark.parametrize("query, wrong, used", [
    ({"source": "tpu"}, "source='tpu'", "; using 'live interpreter (CPU)'"),   # no 512-token recording here
    ({"source": "recorded", "trace": "nope"}, "'nope'", "using 'n256_"),
    ({"source": "recorded", "page": "nowhere"}, "page='nowhere'", "opening 'Tile schedule'"),
    ({"source": "recorded", "dtype": "fp8"}, "dtype='fp8'", "; using "),
    ({"source": "recorded", "mask": "diagonal"}, "mask='diagonal'", "; using causal"),
    ({"source": "recorded", "block_n": "48"}, "block_n=48", "; using 64"),
])
def test_fallback_is_one_warning_line(data_dir, query, wrong, used):
    at = open_page(timeout=90, **query)
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    link = [w.value for w in at.warning if w.value.startswith("The link's settings")]
    assert len(link) == 1, [w.value for w in at.warning]
    assert wrong in link[0] and used in link[0], link[0]
    assert "\n" not in link[0].strip()
    assert charts(at)                                              # the page is drawn with what is used
