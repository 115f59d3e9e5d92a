"""The schedule page, headless (AppTest): metrics with units, the lanes raster, stragglers,
the whole-GPU animation for any traced head, up to three schedules side by side, the page
controls in the URL, and the video export's progress bar. Small interpreter recordings made
here (TILESCOPE_DATA).
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from instrumentation import make_inputs, record
from tests.app import headless
from tests.app.headless import charts, clean, open_page, record_small, tilescope_data


N = 256
SCHEDULES = ("natural", "longest_first", "persistent")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, causal_schedules):
    """Three schedules of one causal problem (B=2, H=2, two traced heads) and a full-mask one."""
    root = tmp_path_factory.mktemp("sched_data")
    q, k, v = make_inputs(2, 2, N, 32, "fp16", seed=1)
    for sched in SCHEDULES:                 # tests/conftest.py records these once per run
        shutil.copytree(causal_schedules[sched], root / "traces" / f"n{N}_causal_{sched}")
    _, tr = record(q, k, v, mask="full", block_m=64, block_n=64)
    tr.save(root / "traces" / f"n{N}_full_natural")
    with tilescope_data(root):
        yield root


def page(data_dir, trace=f"n{N}_causal_natural", **query):
    """The schedule page on one of data_dir's recordings."""
    return open_page("schedule", source="recorded", trace=trace, **query)


def chart(at, needle: str) -> dict:
    """The chart whose title has `needle`, its arrays as numpy (their dtypes are checked here)."""
    return headless.chart(at, needle, arrays=True)


@pytest.fixture(scope="module")
def default_view(data_dir):
    """The page on the causal recording, rendered once for the tests that only read it."""
    return page(data_dir)


def markdown_table(text: str):
    """The Markdown table in `text` (| a | b |, then | ---: | ... |, then rows) as a DataFrame,
    numbers parsed."""
    import pandas as pd

    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in text.splitlines()
            if ln.strip().startswith("|")]
    df = pd.DataFrame(rows[2:], columns=rows[0])
    return df.apply(lambda col: pd.to_numeric(col, errors="coerce").fillna(col))


def lanes_timeline(data_dir, trace=f"n{N}_causal_natural"):
    """The timeline the page draws for a recording (modelled on its default SM count)."""
    from instrumentation.analysis.schedule_model import DEFAULT_SMS, timeline
    from instrumentation.trace import Trace

    return timeline(Trace.load(data_dir / "traces" / trace), sms=DEFAULT_SMS)


def test_metrics_lanes_and_stragglers(data_dir, default_view):
    at = default_view
    clean(at)

    def metrics_row(at):
        metrics = next(m.value for m in at.markdown if re.match(r"\|\s*makespan\s*\|", m.value.lstrip()))
        return metrics, dict(zip(*[[c.strip() for c in ln.strip().strip("|").split("|")]
                                   for ln in metrics.splitlines() if ln.strip() and "---" not in ln][:2]))

    # 32 work items on the default 132 SMs: the spread metrics are said to be meaningless, not printed
    text, row = metrics_row(at)
    assert list(row) == ["makespan", "waves", "over ideal · tail · imbalance · idle"]
    assert "not meaningful" in row["over ideal · tail · imbalance · idle"] and "%" not in text
    assert "fewer items than SMs" in text
    # on 16 SMs (more items than SMs) every metric, with units
    sixteen = page(data_dir, sched_sms="16")
    assert not sixteen.exception
    _, row = metrics_row(sixteen)
    assert list(row) == ["makespan", "tail", "over ideal", "load imbalance", "idle SM time", "waves"]
    assert row["makespan"].endswith("tile-units") and "% (ideal " in row["over ideal"]
    # the page's numbers are its own analysis of the recording
    from instrumentation.analysis.schedule_analysis import METRICS
    from instrumentation.analysis.schedule_model import schedule_stats, timeline
    from instrumentation.trace import Trace
    st = schedule_stats(timeline(Trace.load(data_dir / "traces" / f"n{N}_causal_natural"), sms=16), sms=16)
    assert float(row["makespan"].split()[0]) == pytest.approx(st["makespan"], rel=1e-3)
    assert float(row["load imbalance"]) == pytest.approx(st["imbalance"], abs=1e-3)
    explained = " ".join(c.value for c in at.caption)
    assert all(f"**{label}**: {text}" in explained for label, text in METRICS.values())   # every metric explained
    lanes = chart(at, "Work items on SMs")
    heat = [t for t in lanes["data"] if t["type"] == "heatmap"]
    assert len(heat) == 1 and heat[0]["z"].dtype == np.uint8
    assert not any(t["type"] in ("bar", "scattergl") for t in lanes["data"])
    tables = [markdown_table(m.value) for m in at.markdown if "-:|" in m.value]   # static tables
    late = next(t for t in tables if "late by (tile-units)" in t.columns)
    longest = next(t for t in tables if "duration (tile-units)" in t.columns)
    assert len(late) == 5 and (np.diff(late["ends (tile-units)"]) <= 0).all()
    assert list(longest["#"]) == [1, 2, 3, 4, 5] and {"batch", "head", "query block"} <= set(longest.columns)
    # the rows are the page's own analysis: the SMs that finish last, the longest work items
    tl = lanes_timeline(data_dir)
    ends = tl.groupby("sm")["t_end"].max() - tl["t_start"].min()
    assert np.allclose(sorted(late["ends (tile-units)"], reverse=True), ends.nlargest(5), rtol=1e-3)
    assert np.allclose(longest["duration (tile-units)"], (tl["t_end"] - tl["t_start"]).nlargest(5), rtol=1e-3)


def test_animation_for_each_traced_head(data_dir):
    at = page(data_dir)
    anim = chart(at, "The whole GPU over time")
    assert len(anim["frames"]) >= 24 and anim["layout"]["updatemenus"][0]["buttons"][0]["label"].startswith("▶")
    assert anim["layout"]["sliders"][0]["active"] == len(anim["frames"]) // 2     # opens mid-run
    assert "head bh=0" in anim["layout"]["title"]["subtitle"]["text"] or \
        "bh=0" in json.dumps(anim["layout"]["annotations"])
    assert at.selectbox(key="sched_head").options == ["bh 0 (batch 0, head 0)", "bh 3 (batch 1, head 1)"]
    at.selectbox(key="sched_head").set_value(3).run()
    clean(at)
    assert at.query_params["sched_head"] == "3"
    assert "tiles of head bh=3" in json.dumps(chart(at, "The whole GPU over time")["layout"]["annotations"])
    # one frame at a time: a still (no player), its frame in the link
    at.toggle(key="sched_still").set_value(True).run()
    # the still opens as the player does: on a frame where the picked head's work items run
    still = chart(at, "The whole GPU over time")
    t_now = float(re.match(r"t = ([0-9.e+-]+)", still["layout"]["title"]["subtitle"]["text"]).group(1))
    # the caption wraps (<br>) wherever its length puts the line ends
    words = " ".join(json.dumps(still["layout"]["annotations"]).replace("<br>", " ").split())
    span = re.search(r"its items run from t = ([0-9.e+-]+) to ([0-9.e+-]+)", words)
    assert float(span.group(1)) * 0.999 <= t_now <= float(span.group(2)) * 1.001, (t_now, span.groups())
    at.slider(key="sched_frame").set_value(5).run()
    clean(at)
    still = chart(at, "The whole GPU over time")
    assert not still.get("frames") and not still["layout"].get("sliders")
    assert at.query_params["sched_frame"] == "5"


def test_three_schedules_side_by_side(data_dir):
    at = page(data_dir, sched_compare=1, sched_sms=4)      # 4 modelled SMs: schedules differ
    clean(at)
    picked = at.multiselect(key="sched_cmp").value
    assert any("Schedules side by side" in c.value for c in at.caption)      # where it is drawn
    assert [p.rsplit("_", 1)[-1] for p in picked] == ["natural", "first", "persistent"]
    cmp = chart(at, "timelines)")
    assert cmp["layout"]["title"]["text"].startswith("natural vs longest_first vs persistent")
    assert sum(t["type"] == "heatmap" for t in cmp["data"]) == 3
    table = next(d.value for d in at.dataframe if "schedule" in d.value.columns)
    assert list(table["schedule"]) == list(SCHEDULES)
    assert table["waves"].nunique() == 1 and table["makespan"].nunique() > 1
    # two of three, and the choice travels in the link
    at.multiselect(key="sched_cmp").unselect(f"n{N}_causal_persistent").run()
    clean(at)
    assert sum(t["type"] == "heatmap" for t in chart(at, "timelines)")["data"]) == 2
    assert at.query_params["sched_cmp"] == f"n{N}_causal_natural,n{N}_causal_longest_first"


def test_url_controls_and_bad_values(data_dir):
    at = page(data_dir, sched_color="q_block")
    clean(at)
    bars = [t for t in chart(at, "Work items on SMs")["data"] if t.get("marker", {}).get("showscale")]
    assert bars[0]["marker"]["colorbar"]["title"]["text"] == "query block"
    at = page(data_dir, sched_color="rainbow", sched_head="7")
    assert not at.exception
    warnings = " ".join(w.value for w in at.warning)
    assert "sched_color='rainbow'" in warnings and "sched_head='7'" in warnings
    assert at.selectbox(key="sched_color").value == "tiles_visited"


def test_imbalance_view_only_where_items_differ(data_dir, default_view):
    at = default_view
    assert any("Causal imbalance" in c["layout"]["title"]["text"] for c in charts(at))
    at = page(data_dir, trace=f"n{N}_full_natural")
    clean(at)
    assert not any("imbalance" in c["layout"]["title"]["text"].lower() for c in charts(at))
    assert any("No imbalance view" in c.value for c in at.caption)


def test_live_comparison_runs_on_demand(data_dir):
    at = open_page("schedule", timeout=180, source="interpreter", seq_len=128, head_dim=32, block_m=64,
                   block_n=64, dtype="fp16", mask="causal", sched_compare=1)
    assert not at.exception
    assert any("Modelled timeline" in w.value for w in at.warning)
    at.multiselect(key="sched_cmp").select("longest_first").run()
    assert not any("timelines)" in c["layout"]["title"]["text"] for c in charts(at))   # not yet run
    at.button(key="sched_cmp_run").click().run()
    assert not at.exception
    cmp = chart(at, "timelines)")
    assert cmp["layout"]["title"]["text"].startswith("natural vs longest_first")


def test_time_window_redraws_the_lanes_in_detail(data_dir):
    at = page(data_dir, sched_sms=4)
    full = next(t for t in chart(at, "Work items on SMs")["data"] if t["type"] == "heatmap")
    assert not at.get("slider")                      # the slider comes when zoom is switched on
    at.toggle(key="sched_zoom").set_value(True).run()
    lo, hi = at.slider(key="sched_window").value
    at.slider(key="sched_window").set_value((lo, lo + (hi - lo) / 4)).run()
    clean(at)
    part = chart(at, "Work items on SMs")
    heat = next(t for t in part["data"] if t["type"] == "heatmap")
    assert heat["dx"] == pytest.approx(full["dx"] / 4, rel=0.05)          # same bins, a quarter of the time
    assert part["layout"]["xaxis"]["range"][1] == pytest.approx(lo + (hi - lo) / 4, rel=0.02)
    assert "sched_window" in at.query_params
    linked = page(data_dir, sched_sms=4, sched_window=at.query_params["sched_window"])    # the link opens zoomed
    assert linked.toggle(key="sched_zoom").value and linked.slider(key="sched_window").value == \
        pytest.approx((lo, lo + (hi - lo) / 4), rel=0.02)
    at.toggle(key="sched_zoom").set_value(False).run()                     # zoom off: the whole run again
    assert "sched_window" not in at.query_params
    assert next(t for t in chart(at, "Work items on SMs")["data"] if t["type"] == "heatmap")["dx"] == \
        pytest.approx(full["dx"])


@pytest.fixture(scope="module")
def video_data(tmp_path_factory):
    """A small recording (N=128, 32x32 blocks, head 0 tile-traced) the two video tests share."""
    root = tmp_path_factory.mktemp("video_data")
    record_small(root, "n128_causal_natural", n=128, bm=32, bn=32, trace_head=[0])
    return root


def test_schedule_page_video_shows_the_bar(video_data, fast_frames):
    """The schedule page's 'Make the GIF' renders with the bar and ends with a download."""
    with tilescope_data(video_data):
        at = open_page("schedule", source="recorded", trace="n128_causal_natural")
        assert not at.exception
        at.button(key="sched_video_make").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    bars = [b.proto for b in at.get("progress")]
    assert len(bars) == 1 and bars[0].value == 100, bars
    n = len(fast_frames)
    assert n >= 2 and f"Rendered the GIF at 960×540: {n} frames in" in bars[0].text, bars[0].text
    # named after the recording and the view (app.export.download_name)
    assert any(b.label.startswith("⬇ n128_causal_natural-whole-gpu-schedule.gif") for b in at.get("download_button"))


def test_schedule_page_mp4_says_the_size_of_its_file(video_data, tmp_path, fast_frames):
    """'Rendered the MP4 at 960×540' named the asked size while the file was 960×536: the bar
    says the size read back from the file, and at 960×540 and 1280×720 that is the asked one."""
    from app.export.animations import video_size

    with tilescope_data(video_data):
        at = open_page("schedule", source="recorded", trace="n128_causal_natural")
        at.selectbox(key="sched_video_fmt").set_value("mp4")
        for size in ((960, 540), (1280, 720)):
            at.selectbox(key="sched_video_size").set_value(size)
            at.button(key="sched_video_make").click().run()
            assert not at.exception and not at.error, [e.value for e in at.error]
            bar = [b.proto for b in at.get("progress")][0]
            assert f"Rendered the MP4 at {size[0]}×{size[1]}:" in bar.text, bar.text
            out = tmp_path / f"v{size[0]}.mp4"
            out.write_bytes(at.session_state["sched_video"][1])
            assert video_size(out) == size
