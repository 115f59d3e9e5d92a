"""The shared controls in the sidebar: source, recording or upload, the problem (N, mask, D,
blocks, dtype, B, H), the schedule and presentation mode. `sidebar()` draws them and returns
the Settings they describe; the button callbacks here change them from a page.

For a live source the problem controls are a fragment: editing them reruns only the sidebar
(no kernel run), shows what changed and the estimated run time, and one "Run" button applies
them all (`_applied` in the session). A recording's view follows its controls at once.
(An st.form would hold the edits too, but it cannot show the estimate or the mask's own
parameter field until it is submitted.)
"""

from __future__ import annotations

import math

import streamlit as st

from app import about, sources
from app.sources import Recording
from app.text import plain
from app.settings import (BLOCK_SIZES, DEFAULTS, DTYPES, SCHEDULES, SOURCES, SUPPORTED_HEAD_DIMS,
                          Settings, default_docs, make_settings, parse_mask)
from kernels.masks import MASK_KINDS, MaskSpec, mask_kind

KERNEL_CONTROLS = ("seq_len", "head_dim", "block_m", "block_n", "dtype", "batch", "heads", "schedule",
                   "kv_len", "kv_heads")
INTERPRETER_PRESET_TILES = 600      # a preset in the interpreter is scaled to at most about this many tiles
WINDOW_FRACTION = 4                 # ... and a sliding window that covers all of its N to N / this


_PARAM_KEYS = {"sliding_window": "ctl_window", "prefix_lm": "ctl_prefix", "document": "ctl_docs",
               "local": "ctl_local"}  # stable names


def _param_key(kind: str) -> str:
    """Session key of a mask kind's parameter control (kinds are kernels.masks' registry)."""
    return _PARAM_KEYS.get(kind, f"ctl_mask_{kind}")


def _pair_keys(key: str) -> tuple[str, str]:
    """Session keys of a 'pair' widget's two number inputs (local: L, R)."""
    return f"{key}_l", f"{key}_r"


def _control_value(kind, param):
    return int(param) if kind.widget == "int" else kind.param_text(param)


def _default_param(kind):
    n = st.session_state.get("ctl_seq_len")
    return kind.default_param(n if isinstance(n, int) and n > 0 else 512)


def mask_to_controls(spec: MaskSpec) -> dict:
    """The `ctl_*` values that show the mask `spec` in the controls (kind plus its parameter)."""
    out = {"ctl_mask_kind": spec.kind}
    if spec.param is not None and spec.mask_kind.widget == "pair":
        out.update(zip(_pair_keys(_param_key(spec.kind)), (int(x) for x in spec.param)))
    elif spec.param is not None:
        out[_param_key(spec.kind)] = _control_value(spec.mask_kind, spec.param)
    return out


def mask_from_controls() -> str:
    """The mask text the controls show (it may not parse: the settings then say why)."""
    ss = st.session_state
    kind = mask_kind(ss.get("ctl_mask_kind", "causal"))
    if kind.widget is None:
        return kind.name
    if kind.widget == "pair":
        pair = (ss.get(key, x) for key, x in zip(_pair_keys(_param_key(kind.name)), _default_param(kind)))
        return f"{kind.name}:" + ",".join(str(int(x)) for x in pair)
    value = ss.get(_param_key(kind.name), _control_value(kind, _default_param(kind)))
    return f"{kind.name}:{int(value)}" if kind.widget == "int" else f"{kind.name}:{str(value).replace(' ', '')}"


def staged() -> dict:
    """The kernel settings the controls show now (for a live source: not necessarily run yet)."""
    ss = st.session_state
    out = {k: ss[f"ctl_{k}"] for k in KERNEL_CONTROLS}
    for k in ("seq_len", "head_dim", "block_m", "block_n", "batch", "heads", "kv_len", "kv_heads"):
        out[k] = int(out[k]) if out[k] is not None else 0
    out["mask"] = mask_from_controls()
    return out


def apply_staged() -> None:
    """What the Run button does: the controls' settings become the ones the view shows."""
    st.session_state["_applied"] = staged()


def _sync_controls(settings: dict) -> None:
    ss = st.session_state
    for key in KERNEL_CONTROLS:
        ss[f"ctl_{key}"] = settings.get(key, DEFAULTS[key])
    try:
        ss.update(mask_to_controls(parse_mask(settings["mask"])))
    except ValueError:
        pass


# -- callbacks ----------------------------------------------------------------------------------

def scale_docs_to_n() -> None:
    """Button callback: rescale the document lengths so they sum to N."""
    ss = st.session_state
    n = int(ss.get("ctl_seq_len", 0))
    try:
        lengths = [int(x) for x in str(ss.get("ctl_docs", "")).split(",") if x.strip()]
    except ValueError:
        lengths = []
    if n <= 0:
        return
    if not lengths or any(x <= 0 for x in lengths) or n < len(lengths):
        ss["ctl_docs"] = default_docs(n)
        return
    total = sum(lengths)
    scaled = [max(1, math.floor(x * n / total)) for x in lengths]
    scaled[-1] += n - sum(scaled)
    ss["ctl_docs"] = ",".join(map(str, scaled)) if scaled[-1] > 0 else default_docs(n)
    apply_staged()       # the user asked for it on the page: no second click on Run


def open_recording(name: str) -> None:
    """Button callback: switch the view to a bundled recording."""
    st.session_state["ctl_source"] = "recorded"
    st.session_state["ctl_trace"] = name


def _source_changed() -> None:
    """Going live from a recording keeps N, mask, D, blocks and dtype; in the interpreter, B and H
    drop to 1 so the first run takes seconds, not minutes (the user can raise them again)."""
    ss = st.session_state
    if ss.get("ctl_source") == "interpreter" and (ss.get("ctl_batch", 1), ss.get("ctl_heads", 1)) != (1, 1):
        ss["_source_note"] = (f"B×H set from {ss.get('ctl_batch')}×{ss.get('ctl_heads')} to 1×1 for the "
                              "CPU interpreter, so a run takes seconds; raise them below if you like.")
        ss["ctl_batch"], ss["ctl_heads"] = 1, 1
    if ss.get("ctl_source") in ("gpu", "interpreter"):
        apply_staged()       # choosing a live source is the request to run


def apply_preset() -> None:
    """Selectbox callback: a model's heads, KV heads, head dim and mask into the controls (a live
    source runs them with Run). In the interpreter the shape is scaled down (fewer heads, the
    same group ratio; a fixed chunk of queries and keys shortened in proportion) and a note says
    how; on a GPU it runs as published."""
    from kernels.presets import PRESETS

    ss = st.session_state
    p = PRESETS.get(ss.get("ctl_preset"))
    if p is None:
        return
    n = int(ss.get("ctl_seq_len") or DEFAULTS["seq_len"])
    note = ""
    if ss.get("ctl_source") == "interpreter":
        small = p.scaled(max_heads=4)
        if (small.heads, small.kv_heads) != (p.heads, p.kv_heads):
            note = (f"H {p.heads} / H_kv {p.kv_heads} scaled to {small.heads} / {small.kv_heads} "
                    "(the same group ratio) for the CPU interpreter")
        p = small
        ss["ctl_batch"] = 1
    shape = p.shape(n)
    n_q, n_k = shape["n_q"], shape["n_k"]
    bm, bn = int(ss.get("ctl_block_m", 64)), int(ss.get("ctl_block_n", 64))
    if ss.get("ctl_source") == "interpreter" and p.n_q:
        tiles = -(-n_q // bm) * -(-n_k // bn) * p.heads
        shrink = 1
        while tiles / shrink ** 2 > INTERPRETER_PRESET_TILES and n_q // (shrink * 2) >= bm:
            shrink *= 2
        if shrink > 1:
            note += ("; " if note else "") + (f"{n_q} queries of {n_k} keys shortened to {n_q // shrink} "
                                              f"of {n_k // shrink} (the same ratio)")
            n_q, n_k = n_q // shrink, n_k // shrink
    mask = parse_mask(shape["mask"])
    if ss.get("ctl_source") == "interpreter":
        mask, why = _scaled_window(mask, n_k)
        if why:
            note += ("; " if note else "") + why
    ss["ctl_seq_len"] = n_q
    ss["ctl_kv_len"] = 0 if n_k == n_q else n_k
    ss["ctl_heads"], ss["ctl_head_dim"] = p.heads, p.head_dim
    ss["ctl_kv_heads"] = 0 if p.kv_heads == p.heads else p.kv_heads
    ss.update(mask_to_controls(mask))
    ss["_preset_note"] = f"{p.label}: {note}; a GPU runs it as published." if note else ""


def _scaled_window(spec: MaskSpec, n_k: int) -> tuple[MaskSpec, str]:
    """A model's sliding window at the interpreter's small N: a window W >= N covers every key
    (the same as causal), so it becomes N / WINDOW_FRACTION (whole 16s), the window's share of the
    context at the lengths the model serves (Mistral-7B: 4096 of 32k is 1/8; Gemma-2: 4096 of
    8k is 1/2; a quarter sits between). (mask, note) with note '' when nothing changed."""
    if spec.kind != "sliding_window" or spec.param is None or int(spec.param) < n_k:
        return spec, ""
    w = max(16, n_k // WINDOW_FRACTION // 16 * 16)
    return (MaskSpec("sliding_window", w),
            f"window {int(spec.param)} ≥ N={n_k} (the same as causal) scaled to {w} = N/{WINDOW_FRACTION}")


# -- the sidebar --------------------------------------------------------------------------------

def _preset_control() -> None:
    from kernels.presets import PRESETS

    ss = st.session_state
    ss.setdefault("ctl_preset", "")
    st.selectbox("Model preset", ["", *PRESETS], key="ctl_preset", on_change=apply_preset,
                 format_func=lambda name: PRESETS[name].label if name else "— your own shape —",
                 help="a published model's heads, KV heads, head dim and mask (kernels.presets); "
                      "N stays yours unless the preset fixes it")
    p = PRESETS.get(ss["ctl_preset"])
    if p is not None:
        note = ss.get("_preset_note")
        st.caption(plain((note + " ") if note else "") + f"Source: {plain(p.source)}"
                   + (f" · {plain(p.notes)}" if p.notes else ""))


def _problem_controls() -> None:
    """A live source's problem controls (a recording's settings are shown as text instead)."""
    ss = st.session_state
    _preset_control()
    st.number_input("Sequence length N", step=64, key="ctl_seq_len")
    st.selectbox("Mask", MASK_KINDS, key="ctl_mask_kind")
    kind = mask_kind(ss["ctl_mask_kind"])
    if kind.widget == "pair":        # two number inputs side by side (local: L, R)
        cols = st.columns(2)
        labels = ("Window L (keys before)", "Window R (keys after)")
        for col, key, x, label in zip(cols, _pair_keys(_param_key(kind.name)), _default_param(kind), labels):
            ss.setdefault(key, int(x))
            col.number_input(label, min_value=kind.minimum, step=16, key=key, help=kind.ui_label)
    elif kind.widget is not None:    # the kind's own parameter control, from the mask registry
        key = _param_key(kind.name)
        ss.setdefault(key, _control_value(kind, _default_param(kind)))
        if kind.widget == "int":
            st.number_input(kind.ui_label, min_value=kind.minimum, step=16, key=key,
                            help=kind.ui_help)
        else:
            st.text_input(kind.ui_label, key=key, help=kind.ui_help)
    st.selectbox("Head dim D", SUPPORTED_HEAD_DIMS, key="ctl_head_dim")
    c1, c2 = st.columns(2)
    c1.selectbox("block_m", BLOCK_SIZES, key="ctl_block_m")
    c2.selectbox("block_n", BLOCK_SIZES, key="ctl_block_n")
    st.selectbox("dtype", DTYPES, key="ctl_dtype")
    c1, c2 = st.columns(2)
    c1.number_input("batch B", step=1, key="ctl_batch")
    c2.number_input("heads H", step=1, key="ctl_heads")
    c1, c2 = st.columns(2)
    c1.number_input("KV length N_k", min_value=0, step=64, key="ctl_kv_len",
                    help="keys and values; 0 = the same as N. With N_k > N the queries are the "
                         "last N positions (bottom-right, as in chunked prefill)")
    c2.number_input("KV heads H_kv", min_value=0, step=1, key="ctl_kv_heads",
                    help="0 = the same as H (MHA); H_kv < H shares K/V between H / H_kv query "
                         "heads (GQA), H_kv = 1 is MQA")
    st.selectbox("Schedule", SCHEDULES, key="ctl_schedule",
                 help="natural: programs in launch order; longest_first: query blocks with "
                      "most tiles first; persistent: one program per SM (the Triton kernel's pull "
                      "the next work item from a counter; on Hopper's Gluon kernel each walks its "
                      "own list, dealt longest first to the least loaded program)")


def recording_settings_text(v: dict) -> str:
    """A recording's problem as one line (the sidebar's summary in place of locked controls)."""
    kv = ""
    if v["kv_len"] and v["kv_len"] != v["seq_len"]:
        kv += f" · N_k {v['kv_len']:,}"
    if v["kv_heads"] and v["kv_heads"] != v["heads"]:
        kv += f" · H_kv {v['kv_heads']}"
    return (f"N {v['seq_len']:,} · mask {v['mask']} · D {v['head_dim']} · blocks "
            f"{v['block_m']}×{v['block_n']} · {v['dtype']} · B {v['batch']} · H {v['heads']}{kv} · "
            f"schedule {v['schedule']}")


def _recording_settings(live_name: str) -> None:
    # drawn as text, not as eleven disabled inputs: the browser lays those out on every run
    # (about 0.1 s of a 16k page's settle on two CPUs), and a value no one can change is no control
    st.caption(f"**The recording's settings:** {plain(recording_settings_text(staged()))}. To change "
               f"them, switch the source to {plain(repr(live_name))}.")


def _changes(applied: dict, want: dict) -> str:
    return ", ".join(f"{k} {applied.get(k)} → {v}" for k, v in want.items() if applied.get(k) != v)


RUN_BAR_CSS = ("<style>[data-testid='stLayoutWrapper']:has(> .st-key-run_bar) { position: sticky; bottom: 0; z-index: 5; background: rgb(248, 248, 247);"
               " padding: 0.3rem 0 0.6rem; box-shadow: 0 -6px 6px -6px rgba(0, 0, 0, 0.25); }</style>")


@st.fragment
def _live_controls() -> None:
    """The problem controls of a live source: edits rerun only this fragment; Run applies them."""
    ss = st.session_state
    _problem_controls()
    want = staged()
    pending = _changes(ss.get("_applied", {}), want)
    s = make_settings(ss["ctl_source"], want)
    problems = s.problems()
    # what changed, the estimate and Run stick to the sidebar's bottom edge: under a 1080 px
    # window the button sat below the fold, so an edit to N seemed to do nothing
    st.html(RUN_BAR_CSS)
    bar = st.container(key="run_bar")
    if pending:
        bar.caption(f"**Not run yet:** {plain(pending)}.")
    bar.caption(plain(" ".join(problems) if problems else sources.estimate(s)))
    if bar.button("▶ Run", key="ctl_run", type="primary" if pending else "secondary",
                  on_click=apply_staged, width="stretch",
                  help="run the kernel with the settings above (nothing runs until you press it)"):
        st.rerun()


def _keep_hidden_controls() -> None:
    """Streamlit forgets a widget's value in a run that does not draw it: the attention controls
    a page hides keep theirs (re-set as plain session values) for the pages that show them."""
    ss = st.session_state
    for key in [k for k in ss if isinstance(k, str) and k.startswith("ctl_")
                and k not in ("ctl_source", "ctl_present", "ctl_upload", "ctl_run")]:
        ss[key] = ss[key]


def sidebar(attention: bool = True) -> Settings:
    """Render the shared controls; return the settings they describe. attention=False (pages
    with their own recordings: ring, decode): only the source, presentation mode and About; the
    recording and problem controls, which do nothing there, are hidden (and keep their values)."""
    ss = st.session_state
    recs = sources.recordings()
    live_source = sources.live_source()
    options = [live_source, "recorded", "upload"]
    if ss.get("ctl_source") not in options:
        ss["ctl_source"] = live_source
    with st.sidebar:
        st.radio("Source", options, format_func=SOURCES.get, key="ctl_source", on_change=_source_changed,
                 help="Live runs execute the instrumented Triton kernel now; recordings come "
                      "from real GPUs (data/traces/) or from a zip you upload.")
        note = ss.pop("_source_note", None)
        if note:
            st.info(note, icon=":material/info:")
        source = ss["ctl_source"]
        if not attention or source not in ("gpu", "interpreter"):
            _keep_hidden_controls()    # before any control of this run is drawn
        if not attention:
            st.caption("This page has its own recordings and controls (on the page). The attention "
                       "settings (recording, N, mask, blocks) belong to the other pages and keep "
                       "their values there.")
        if source == "recorded" and attention:
            names = [r.name for r in recs]
            if sources.is_call_name(ss.get("ctl_trace")) and sources.recording_named(ss["ctl_trace"]):
                names.insert(0, ss["ctl_trace"])      # a model run's call, opened from the Model run page
            if not names:
                st.warning("No bundled recordings: data/traces/ is empty on this machine.")
            else:
                if ss.get("ctl_trace") not in names:
                    ss["ctl_trace"] = (sources.default_recording(recs, DEFAULTS) or recs[0]).name
                st.selectbox("Recording", names, key="ctl_trace",
                             format_func=lambda n: sources.recording_named(n).label)
                _sync_controls(sources.recording_named(ss["ctl_trace"]).settings())
        elif source == "upload":        # on every page: the uploaded file must not be lost
            up = st.file_uploader("Trace (.zip of a trace directory)", type=["zip"], key="ctl_upload",
                                  help="manifest.json + parquet files, as written by Trace.save")
            st.caption("A link cannot carry an uploaded file: share the zip with the link.")
            if up is not None:    # read once per zip (cached, a refusal too); the page shows why it failed
                try:
                    trace = sources.uploaded_trace(up)
                    _sync_controls({**DEFAULTS, **Recording(up.name, "", 0, trace.meta).settings()})
                except (sources.RunError, ValueError, TypeError, KeyError, OverflowError):
                    pass
        if attention and source in ("gpu", "interpreter"):
            _live_controls()
        elif attention:     # a recording's settings are facts, not controls: one line of text
            _recording_settings(SOURCES[live_source])
        st.toggle("Presentation mode", key="ctl_present",
                  help="larger fonts, light background, no clutter: for talks and screenshots")
        about.about_sources()
    values = ss.setdefault("_applied", staged()) if source in ("gpu", "interpreter") else staged()
    return make_settings(source, values, trace=ss.get("ctl_trace", "") if source == "recorded" else "",
                         present=bool(ss.get("ctl_present")))
