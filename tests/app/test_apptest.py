"""The app, headless: every page for every mask kind, every control, URL round trips, bad
settings, recorded and uploaded traces, and the figures' data (not just their presence).

The app reads its recordings from TILESCOPE_DATA; these tests point it at a temp directory with
small traces recorded here in the Triton interpreter (and a tiny sweep), so they do not depend
on bundled GPU data: the `data_dir` fixture of tests/app/conftest.py, recorded once per session.
"""

from __future__ import annotations

import io
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

from instrumentation import make_inputs, record
from kernels.masks import parse_mask

pytest.importorskip("streamlit")
from tests.app.conftest import N  # noqa: E402
from tests.app.headless import (  # noqa: E402,F401  (charts, clean, _record: imported by other files)
    charts, clean, open_page, record_small as _record, tilescope_data, titles, zip_trace)

PAGES = ("schedule", "block_skip", "online_softmax", "memory")
MASKS = {"full": "full", "causal": "causal", "sliding_window": "sliding_window:64",
         "prefix_lm": "prefix_lm:48", "document": "document:64,128,64"}


def app(data_dir, **query):
    """A new session on a link with these query parameters, run once (data_dir: the fixture,
    which points the app at the shared recordings)."""
    return open_page(timeout=90, **query)


def live(data_dir, page="schedule", **query):
    base = dict(page=page, source="interpreter", seq_len=N, head_dim=32, block_m=64, block_n=64,
                dtype="fp16")
    return app(data_dir, **{**base, **query})


def run_clicked(at):
    """Press the sidebar's Run button (live sources apply control changes only then)."""
    return at.button(key="ctl_run").click().run()


def table_with(at, column):
    return next(d.value for d in at.dataframe if column in d.value.columns)


@pytest.fixture(scope="module")
def rendered(data_dir):
    """rendered(page, mask): the live default view, rendered once per module for the tests that
    only read it (they never click or edit it)."""
    views = {}

    def get(page, mask):
        if (page, mask) not in views:
            views[page, mask] = live(data_dir, page=page, mask=mask)
        return views[page, mask]

    return get


# -- every page, every mask ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(MASKS))
@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_for_every_mask(rendered, page, kind):
    at = rendered(page, MASKS[kind])
    clean(at)
    figs = charts(at)
    assert figs, f"no chart on {page}"
    for fig in figs:
        assert fig["data"], "a chart without data"
    assert at.session_state["ctl_mask_kind"] == kind
    assert at.query_params["mask"] == MASKS[kind] and at.query_params["page"] == page
    if page != "memory":  # provenance banner of the live run
        assert any("Triton CPU interpreter" in i.value for i in at.info)


def test_block_map_heatmap_is_the_mask_block_map(data_dir):
    at = live(data_dir, page="block_skip", mask="document:64,128,64", block_m=32, block_n=64)
    clean(at)
    fig = charts(at)[0]
    z = np.array(fig["data"][0]["z"])
    want = parse_mask("document:64,128,64").block_map(N, 32, 64)
    np.testing.assert_array_equal(z, want)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["full"] == str(int((want == 2).sum()))
    assert metrics["partial"] == str(int((want == 1).sum()))
    assert metrics["skipped"] == str(int((want == 0).sum()))
    assert metrics["fraction skipped"] == f"{(want == 0).mean():.1%}"
    # the kernel's visits are overlaid and agree with the prediction
    assert any("· visited" in (t.get("name") or "") for t in fig["data"] if t.get("showlegend"))
    assert any("visited exactly" in s.value for s in at.success)


def test_block_map_comparison_side_by_side(data_dir):
    at = live(data_dir, page="block_skip", mask="causal")
    at.radio(key="skip_cmp_kind").set_value("two masks").run()
    at.text_input(key="skip_cmp_mask").set_value("sliding_window:32").run()
    clean(at)
    cmp = next(c for c in charts(at) if "compared" in c["layout"]["title"]["text"])
    left, right = [np.array(t["z"]) for t in cmp["data"] if t["type"] == "heatmap"]
    np.testing.assert_array_equal(left, parse_mask("causal").block_map(N, 64, 64))
    np.testing.assert_array_equal(right, parse_mask("sliding_window:32").block_map(N, 64, 64))
    at.text_input(key="skip_cmp_mask").set_value("sliding_window:0").run()
    assert any("right-hand mask" in e.value for e in at.error)
    assert not at.exception


# the schedule page's own tests (lanes raster, animation, comparison of up to three schedules,
# its URL controls) are in tests/app/test_schedule_page.py


def test_online_softmax_steps_through_the_kernel_state(data_dir):
    at = live(data_dir, page="online_softmax", mask="causal")
    clean(at)
    at.button(key="sm_first").click().run()
    tile = next(c for c in charts(at) if c["layout"]["title"]["text"].startswith("Step 1 of"))
    assert tile["data"][0]["type"] == "bar"
    at.button(key="sm_next").click().run()
    assert at.session_state["sm_step"] == 2                  # steps count from 1
    assert any(t.startswith("Step 2 of") for t in titles(at))
    at.slider(key="sm_step").set_value(at.slider(key="sm_step").max).run()
    err = next(c for c in charts(at) if c["layout"]["title"]["text"].startswith("Partial output error"))
    errors = err["data"][0]["customdata"]
    assert errors[-1] < 1e-6 < errors[0]                     # converges to the exact output
    clean(at)


def test_memory_page_numbers(data_dir):
    at = app(data_dir, page="memory")
    clean(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["naive HBM"] == "17.4 GB"                 # decimal GB, 3 significant digits
    assert metrics["flash HBM"] == "268 MB"
    assert metrics["reduction"].startswith("65.")
    assert any("cpu.json" in i.value for i in at.info)       # the sweep's provenance banner
    assert any("not measured on a GPU" in w.value for w in at.warning)
    table = next(d.value for d in at.dataframe if "N" in d.value.columns)
    assert list(table["N"]) == [4096, 8192, 16384]
    assert [round(x) for x in table["seed_standard_mib"]] == [132, 528, 2112]
    at.select_slider(key="mem_T").set_value(1024).run()
    assert {m.label: m.value for m in at.metric}["reduction"] != metrics["reduction"]


def test_memory_page_without_sweep_says_models_only(data_dir, tmp_path):
    with tilescope_data(tmp_path):
        at = app(data_dir, page="memory", source="interpreter", seq_len=128)
    clean(at)
    assert any("analytic model" in w.value for w in at.warning)
    assert any("ANALYTIC MODEL" in t for t in titles(at))


# -- controls and the URL -----------------------------------------------------------------------

CONTROL_CHANGES = [
    ("ctl_seq_len", 192, "seq_len", "192"),
    ("ctl_head_dim", 64, "head_dim", "64"),
    ("ctl_block_m", 32, "block_m", "32"),
    ("ctl_block_n", 32, "block_n", "32"),
    ("ctl_dtype", "fp32", "dtype", "fp32"),
    ("ctl_batch", 2, "batch", "2"),
    ("ctl_heads", 2, "heads", "2"),
    ("ctl_schedule", "longest_first", "schedule", "longest_first"),
    ("ctl_mask_kind", "full", "mask", "full"),
]


@pytest.mark.parametrize("key, value, param, text", CONTROL_CHANGES, ids=[c[2] for c in CONTROL_CHANGES])
def test_changing_a_control_reruns_and_updates_the_url(data_dir, key, value, param, text):
    at = live(data_dir, page="schedule", mask="causal")
    before = charts(at)[0]["layout"]["annotations"]
    at.sidebar.get("number_input" if key in ("ctl_seq_len", "ctl_batch", "ctl_heads") else "selectbox")
    widget = next(w for kind in ("number_input", "selectbox") for w in at.sidebar.get(kind) if w.key == key)
    widget.set_value(value).run()
    run_clicked(at)
    clean(at)
    assert at.query_params[param] == text
    after = charts(at)[0]
    caption = next(a["text"] for a in after["layout"]["annotations"] if a.get("name") == "provenance")
    assert caption != next(a["text"] for a in before if a.get("name") == "provenance")


def test_mask_parameters_are_controls(data_dir):
    at = live(data_dir, page="block_skip", mask="sliding_window:64")
    at.number_input(key="ctl_window").set_value(100).run()
    assert at.query_params["mask"] == "sliding_window:64"          # not run yet
    run_clicked(at)
    assert at.query_params["mask"] == "sliding_window:100"
    at.selectbox(key="ctl_mask_kind").set_value("prefix_lm").run()
    at.number_input(key="ctl_prefix").set_value(40).run()
    run_clicked(at)
    assert at.query_params["mask"] == "prefix_lm:40"
    at.selectbox(key="ctl_mask_kind").set_value("document").run()
    at.text_input(key="ctl_docs").set_value("100,156").run()
    run_clicked(at)
    clean(at)
    assert at.query_params["mask"] == "document:100,156"
    np.testing.assert_array_equal(np.array(charts(at)[0]["data"][0]["z"]),
                                  parse_mask("document:100,156").block_map(N, 64, 64))


def test_query_params_round_trip(data_dir):
    query = dict(page="block_skip", source="interpreter", seq_len="320", mask="prefix_lm:70",
                 head_dim="16", block_m="32", block_n="64", dtype="bf16", batch="1", heads="2",
                 schedule="persistent")
    at = app(data_dir, **query)
    clean(at)
    assert at.query_params == query
    ss = at.session_state
    assert (ss["ctl_seq_len"], ss["ctl_mask_kind"], ss["ctl_prefix"], ss["ctl_head_dim"],
            ss["ctl_block_m"], ss["ctl_dtype"], ss["ctl_heads"], ss["ctl_schedule"]) == \
        (320, "prefix_lm", 70, 16, 32, "bf16", 2, "persistent")
    assert "N=320" in titles(at)[0] and "prefix_lm:70" in titles(at)[0]
    # the same link in a new session reproduces the same view
    again = app(data_dir, **at.query_params)
    assert charts(again)[0]["data"][0]["z"] == charts(at)[0]["data"][0]["z"]


def test_switch_page_keeps_the_settings(data_dir):
    at = live(data_dir, page="schedule", mask="sliding_window:64", seq_len=192)
    at.switch_page("views/block_skip.py").run()
    clean(at)
    assert at.query_params["page"] == "block_skip" and at.query_params["seq_len"] == "192"
    assert "sliding_window:64, N=192" in titles(at)[0]


def test_presentation_toggle(data_dir):
    at = live(data_dir, page="block_skip", mask="causal")
    size_before = charts(at)[0]["layout"].get("font", {}).get("size")
    at.toggle(key="ctl_present").set_value(True).run()
    clean(at)
    assert at.query_params["present"] == "1"
    slide = charts(at)[0]["layout"]                 # the slide template carries the larger fonts
    assert slide["template"]["layout"]["font"]["size"] > (size_before or 12)
    assert slide["meta"]["tilescope_look"] == "slide"


def test_download_buttons_on_every_page(rendered):
    for page in PAGES:
        at = rendered(page, "causal")
        labels = [b.proto.label for b in at.get("download_button")]
        assert any("PNG" in x for x in labels) and any("SVG" in x for x in labels) \
            and any("HTML" in x for x in labels), (page, labels)
        if page == "schedule":   # videos are made on request: a button that names its format
            made = [b.proto.label for b in at.button]
            assert any(x.startswith("Make the GIF") for x in made), made
            assert any("Chrome trace" in x for x in labels) and any("CSV" in x for x in labels)


# -- bad settings: a visible message, never an exception -------------------------------------------

@pytest.mark.parametrize("query, needle", [
    ({"seq_len": "0"}, "not valid"),
    ({"seq_len": "-5"}, "not valid"),
    ({"seq_len": "abc"}, "not a whole number"),
    ({"mask": "diagonal"}, "does not parse"),
    ({"mask": "document:10,20"}, "sum to"),
    ({"mask": "sliding_window:0"}, "does not parse"),
    ({"block_m": "48"}, "not supported"),
    ({"source": "tpu"}, "not one of"),
    ({"trace": "nope", "source": "recorded"}, "not bundled"),
    ({"page": "nowhere"}, "not a page"),
])
def test_bad_link_settings_show_an_error(data_dir, query, needle):
    at = live(data_dir, **{"page": "block_skip", "mask": "causal", **query})
    assert not at.exception
    shown = [e.value for e in [*at.error, *at.warning]]        # a link value that falls back is a warning
    assert any(needle in s for s in shown), shown
    assert not any(e.value.startswith("The link's") for e in at.error), [e.value for e in at.error]
    at.run()                                                   # and the app keeps working
    assert not at.exception


@pytest.mark.parametrize("page", PAGES[:3])
def test_document_lengths_not_summing_to_n(data_dir, page):
    at = live(data_dir, page=page, mask="document:64,128,64")
    at.number_input(key="ctl_seq_len").set_value(320).run()
    run_clicked(at)
    assert not at.exception
    assert any("sum to 256" in e.value for e in at.error)
    at.button(key="scale_docs").click().run()                 # the offered fix works
    clean(at)
    assert sum(map(int, at.query_params["mask"].split(":")[1].split(","))) == 320


def test_too_large_for_the_interpreter_offers_a_recording(data_dir):
    at = live(data_dir, page="schedule", mask="full", seq_len=8192, block_m=32, block_n=32)
    assert not at.exception
    assert any("interpreter stops at" in e.value for e in at.error)
    at.button(key="open_nearest").click().run()
    clean(at)
    assert at.query_params["source"] == "recorded"
    assert at.query_params["trace"].startswith(f"n{N}_")


def test_negative_n_via_the_control(data_dir):
    at = live(data_dir, page="online_softmax", mask="causal")
    at.number_input(key="ctl_seq_len").set_value(0).run()
    run_clicked(at)
    assert not at.exception
    assert any("not valid" in e.value for e in at.error)
    at.number_input(key="ctl_seq_len").set_value(128).run()
    run_clicked(at)
    clean(at)


def test_gpu_out_of_memory_is_a_message(data_dir, monkeypatch):
    import torch

    from instrumentation import recording   # the app imports record() from here on its first live run

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64 GiB")

    monkeypatch.setattr(recording, "record", oom)
    at = live(data_dir, page="schedule", mask="causal", seq_len=448)   # not cached elsewhere
    assert not at.exception
    assert any("ran out of memory" in e.value for e in at.error)


# -- recorded and uploaded traces --------------------------------------------------------------------

def test_recorded_source_locks_the_controls_to_the_recording(data_dir):
    at = app(data_dir, page="block_skip", source="recorded", trace=f"n{N}_sliding_natural")
    clean(at)
    assert at.session_state["ctl_mask_kind"] == "sliding_window"
    # the recording's settings are one line of text, not controls
    assert not [w for w in at.sidebar.number_input if w.key == "ctl_seq_len"]
    shown = " ".join(m.value for m in at.sidebar.caption)
    assert f"N {N:,} · mask sliding_window:64" in shown and "schedule natural" in shown, shown
    assert at.query_params["mask"] == "sliding_window:64" and at.query_params["trace"] == f"n{N}_sliding_natural"
    at.selectbox(key="ctl_trace").set_value(f"n{N}_causal_natural").run()
    clean(at)
    assert at.query_params["mask"] == "causal"
    np.testing.assert_array_equal(np.array(charts(at)[0]["data"][0]["z"]),
                                  parse_mask("causal").block_map(N, 64, 64))


def test_recorded_link_without_a_name_finds_the_matching_recording(data_dir):
    at = app(data_dir, page="block_skip", source="recorded", seq_len=N, mask="sliding_window:64")
    clean(at)
    assert at.query_params["trace"] == f"n{N}_sliding_natural"


def _zip_dir(path: Path) -> bytes:
    return zip_trace(path, "mytrace")


def test_uploaded_trace(data_dir):
    data = _zip_dir(data_dir / "traces" / f"n{N}_sliding_natural")
    at = app(data_dir, page="block_skip", source="upload")
    assert any("Upload a trace" in e.value for e in at.error)
    at.file_uploader(key="ctl_upload").upload("mytrace.zip", data, "application/zip").run()
    clean(at)
    assert "upload mytrace.zip" in at.info[0].value
    assert at.session_state["ctl_mask_kind"] == "sliding_window"
    np.testing.assert_array_equal(np.array(charts(at)[0]["data"][0]["z"]),
                                  parse_mask("sliding_window:64").block_map(N, 64, 64))


@pytest.mark.parametrize("damage", ["not a zip", "no manifest", "bad checksum"])
def test_corrupt_upload_is_refused_with_a_message(data_dir, damage):
    src = data_dir / "traces" / f"n{N}_causal_natural"
    if damage == "not a zip":
        data = b"this is not a zip file at all"
    else:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for f in sorted(src.iterdir()):
                if damage == "no manifest" and f.name == "manifest.json":
                    continue
                body = f.read_bytes()
                if damage == "bad checksum" and f.name == "work.parquet":
                    body = body[:-20] + b"\0" * 20
                zf.writestr(f"t/{f.name}", body)
        data = buf.getvalue()
    at = app(data_dir, page="schedule", source="upload")
    at.file_uploader(key="ctl_upload").upload("broken.zip", data, "application/zip").run()
    assert not at.exception
    assert any("not a usable trace" in e.value for e in at.error), [e.value for e in at.error]


def test_parquet_download_uploads_back(data_dir):
    from app.sources import trace_from_zip
    from app.views.common import trace_zip
    from instrumentation import Trace

    trace = Trace.load(data_dir / "traces" / f"n{N}_causal_natural")
    again = trace_from_zip(trace_zip(trace, "parquet"))
    assert again.meta["mask"] == "causal" and len(again.tiles) == len(trace.tiles)
    with zipfile.ZipFile(io.BytesIO(trace_zip(trace, "csv"))) as zf:
        assert {"trace/work.csv", "trace/tiles.csv", "trace/rows.csv", "trace/meta.json"} <= set(zf.namelist())


# -- sessions at once ------------------------------------------------------------------------------

def test_live_runs_are_serialised_and_shared(data_dir, monkeypatch):
    """Two sessions asking at once both get their traces; runs never overlap; the same settings
    never run twice."""
    from app import settings
    from app.sources import live as sources
    from instrumentation import recording   # where the app's live runs take record() from

    real, active, peak, calls = recording.record, [0], [0], []
    lock = threading.Lock()

    def counting(*args, **kwargs):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            calls.append(kwargs["mask"])
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(recording, "record", counting)
    base = settings.Settings(source="interpreter", seq_len=160, mask=settings.parse_mask("causal"), head_dim=16, block_m=32,
                             block_n=32, dtype="fp32")
    wanted = [base, settings.variant(base, "longest_first"), base]
    out = [None] * 3

    def run(i):
        key = tuple(sorted(wanted[i].kernel().items()))
        out[i] = sources._run_live(key, "interpreter")[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(o is not None for o in out)
    assert out[0] is out[2]                                    # shared, not run twice
    assert {o.meta["schedule"] for o in out} == {"natural", "longest_first"}
    assert peak[0] == 1 and len(calls) == 2


def test_too_many_tiles_to_draw_is_an_error(data_dir):
    at = live(data_dir, page="block_skip", mask="causal", seq_len=65536, block_m=16, block_n=16)
    assert not at.exception
    assert any("more than" in e.value and "tiles" in e.value for e in at.error)


def test_uploaded_work_level_trace_without_tile_detail(data_dir, tmp_path):
    q, k, v = make_inputs(1, 1, N, 32, "fp16", seed=0)
    _, trace = record(q, k, v, mask="causal", block_m=64, block_n=64, level="work")
    data = _zip_dir(trace.save(tmp_path / "work-only"))
    for page in PAGES:
        at = app(data_dir, page=page, source="upload")
        at.file_uploader(key="ctl_upload").upload("work.zip", data, "application/zip").run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert not at.error, (page, [e.value for e in at.error])
        assert charts(at) or page == "online_softmax", page


def test_going_live_from_a_recording_keeps_the_problem_but_one_head(data_dir):
    at = app(data_dir, page="block_skip", source="recorded", trace=f"n{N}_prefix_b2h2")
    assert (at.query_params["batch"], at.query_params["heads"]) == ("2", "2")
    at.radio(key="ctl_source").set_value("interpreter").run()
    clean(at)
    q = at.query_params
    assert (q["source"], q["mask"], q["seq_len"], q["head_dim"]) == ("interpreter", "prefix_lm:48", str(N), "32")
    assert (q["batch"], q["heads"]) == ("1", "1")
    assert any("B×H set from 2×2 to 1×1" in i.value for i in at.info)


def test_a_live_link_starts_from_the_plain_defaults(data_dir):
    at = app(data_dir, page="block_skip", source="interpreter", seq_len=128)
    clean(at)
    q = at.query_params
    assert (q["batch"], q["heads"], q["head_dim"], q["dtype"]) == ("1", "1", "64", "fp16")
