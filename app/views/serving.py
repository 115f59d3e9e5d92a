"""Page: serving. A decode step over a paged KV cache (the block table as a picture, a sequence's
programs walking it, the cache's bytes paged vs a contiguous max-length reserve) and a packed
varlen batch on the SM lanes beside the same batch padded."""

import streamlit as st

from app import settings, sources, url_state
from app.figures import serving_traces as charts
from app.figures._common import fmt_bytes, plural
from app.sources import serving as srv
from app.text import plain
from app.views import common
from instrumentation.analysis.traced_items import traced_item_mask

s = settings.current()
st.title("Serving: a paged KV cache and a packed batch")
st.caption("PagedAttention keeps each sequence's keys and values in fixed-size pages anywhere in a "
           "pool, found through a block table; the kernel walks a sequence's logical blocks in order "
           "and looks each one's page up (the same Flash update, a different address). A packed "
           "(varlen) batch runs only the work items its real tokens need; padding every sequence to "
           "the longest computes the rest and throws it away.")


@st.cache_resource(show_spinner="Running a paged decode step…", max_entries=8)
def live_paged(where: str, lengths: tuple, page: int, prefix: int):
    return srv.run_paged(where, lengths, page, prefix)


@st.cache_resource(show_spinner="Running the packed batch and the same batch padded…", max_entries=4)
def live_varlen(where: str, lengths: tuple):
    return srv.run_varlen(where, lengths)


def parse_lengths(text: str) -> tuple:
    try:
        lens = tuple(int(x) for x in str(text).replace(" ", "").split(",") if x)
    except ValueError:
        raise ValueError(f"sequence lengths must be whole numbers separated by commas, e.g. 300,120,37; got {text!r}") from None
    if not lens:
        raise ValueError("give at least one sequence length, e.g. 300,120,37")
    return lens


def uploaded():
    """The sidebar's uploaded trace and its kind ('paged', 'varlen', 'padded'), or (None, None)."""
    up = st.session_state.get("ctl_upload")
    if s.source != "upload" or up is None:
        return None, None
    try:
        trace = sources.uploaded_trace(up)
    except sources.RunError as exc:
        st.error(plain(exc), icon=":material/error:")
        return None, None
    return trace, srv.kind_of(trace.meta)


live = s.source in ("gpu", "interpreter")
found = srv.bundled_serving(sources.data_dir())
upload, upload_kind = uploaded()
if s.source == "upload" and upload is None:
    st.info("Upload a paged decode step (`record_decode(..., block_table=)`) or a varlen batch "
            "(`record_varlen`), saved with Trace.save and zipped, in the sidebar; until then the "
            "bundled recordings are shown.", icon=":material/upload:")
elif upload is not None and upload_kind not in ("paged", "varlen"):
    st.warning("The uploaded trace is neither a paged decode step nor a varlen batch: the bundled "
               "recordings are shown.", icon=":material/info:")

# -- paged decode ----------------------------------------------------------------------------------
st.header("A paged KV cache")
# a recording: its name, follow, reserve; live: lengths, page, prefix, and follow, reserve on a second
# row (five in one row wrapped their labels onto three lines at 1280 px)
c = st.columns([2, 1, 1])
_, slot_follow, slot_reserve = st.columns([2, 1, 1]) if live else c
paged = None
if live:
    lim = srv.LIVE_LIMITS[s.source]
    url_state.control("srv_lens", "300,120,37,512")
    text = c[0].text_input(f"sequence lengths (1 to {lim['seqs']}, each ≤ {lim['length']:,})", key="srv_lens")
    url_state.control("srv_page", 16, int, options=[16, 32, 64, 128, 256])
    page = c[1].selectbox("page size (tokens)", [16, 32, 64, 128, 256], key="srv_page")
    url_state.control("srv_prefix", 64, int, bounds=(0, lim["length"]))
    prefix = c[2].number_input("shared prefix (tokens)", 0, lim["length"], key="srv_prefix",
                               help="tokens every sequence shares; its whole pages are held once")
    try:
        lens = srv.check_lengths(parse_lengths(text), s.source)
        used = min(int(prefix), max(lens))     # a prefix past the longest shares the same pages
        if used < prefix:
            st.caption(f"Shared prefix: {used:,} tokens, the longest sequence (each sequence shares the "
                       "whole pages of its own length).")
        paged = live_paged(s.source, lens, int(page), used)
        common.name_downloads(f"serving_paged_{s.source}")
    except ValueError as exc:
        st.error(plain(exc), icon=":material/error:")
    if s.source == "interpreter":
        st.info("Live in the CPU interpreter: the real block table and page reads, **modelled timing**; "
                "small shapes (H 4, H_kv 2, D 32, fp32).", icon=":material/memory:")
elif upload_kind == "paged":
    paged = upload
    common.name_downloads(upload)
elif found.get("paged"):
    names = [p.name for p in found["paged"]]
    url_state.control("srv_rec", names[0], options=names)
    rec = c[0].selectbox("paged decode recording", names, key="srv_rec")
    paged = common.trace_dir(found["paged"][names.index(rec)])
    common.name_downloads(rec)
else:
    st.warning("No paged decode recording is bundled (data/serving/ has none). Switch the source to "
               "the live interpreter in the sidebar to run one.", icon=":material/folder_off:")

if paged is not None:
    t = charts.paged_tables(paged)
    n_seq = len(t["lengths"])
    url_state.control("srv_follow", 0, int, bounds=(0, n_seq - 1))
    follow = slot_follow.number_input("follow sequence", 0, n_seq - 1, key="srv_follow",
                                      help="whose lookups are drawn, and whose page reads are walked below")
    ss = st.session_state          # a reserve left at one table's width follows the next table's
    if ss.get("srv_maxlen") is not None and ss["srv_maxlen"] == ss.get("_srv_maxlen_default"):
        ss["srv_maxlen"] = t["table_tokens"]
    ss["_srv_maxlen_default"] = t["table_tokens"]
    url_state.control("srv_maxlen", t["table_tokens"], int, bounds=(max(t["lengths"]), 1 << 20))
    max_len = slot_reserve.number_input("contiguous reserve (tokens)", max(t["lengths"]), 1 << 20,
                                        key="srv_maxlen",
                                        help="tokens a contiguous cache reserves per sequence (the model's max length)")
    sh = t["shape"]                # the metrics below have no caption of their own: this line is theirs
    st.caption(f"Data: {plain(paged.provenance())} · lengths {', '.join(map(str, t['lengths']))} · "
               f"page {t['page_size']} tokens · H {sh['H']}, H_kv {sh['H_kv']}, D {sh['D']}, {t['dtype']}")
    common.chart(charts.block_table_figure_for(paged, int(follow)), "serving-block-table", "srv_table", s.present)
    common.chart(charts.page_walk_figure_for(paged, int(follow)), "serving-page-walk", "srv_walk", s.present)
    acc, _ = charts.cache_bytes_for(paged, int(max_len))
    m = st.columns(4)
    m[0].metric("paged", fmt_bytes(acc.paged_bytes, binary=True), f"{acc.paged_bytes_per_token:,.0f} B per token",
                delta_color="off", delta_arrow="off",
                help="one layer: pages in use × page size × 2·H_kv·D·e; per token: over the tokens the sequences "
                     "hold, a shared page counted once (so it can be below 2·H_kv·D·e)")
    m[1].metric("contiguous", fmt_bytes(acc.contiguous_bytes, binary=True),
                f"{acc.contiguous_bytes_per_token:,.0f} B per token", delta_color="off", delta_arrow="off",
                help="one layer: B × the reserve × 2·H_kv·D·e")
    m[2].metric("unused slots, paged", fmt_bytes(acc.paged_unused_bytes, binary=True),
                f"{acc.paged_unused_bytes / acc.paged_bytes:.1%} of the pages", delta_color="off", delta_arrow="off")
    m[3].metric("saved by shared pages", fmt_bytes(acc.shared_saved_bytes, binary=True),
                f"{plural(acc.shared_pages, 'page')} held once", delta_color="off", delta_arrow="off")
    common.chart(charts.cache_bytes_figure_for(paged, int(max_len)), "serving-cache-bytes", "srv_bytes", s.present)
    common.chart(charts.page_size_figure_for(paged), "serving-page-sizes", "srv_sizes", s.present)
    common.trace_downloads(paged, key="srv_trace")

# -- varlen ----------------------------------------------------------------------------------------
st.header("A packed batch of ragged lengths")
packed = padded = None
if live:
    linked = None                 # the link's own lengths, before the control takes (or refuses) them
    if "srv_vlens" not in st.session_state and url_state.in_link("srv_vlens"):
        linked = st.session_state.get("_link_params", {}).get("srv_vlens", st.query_params.get("srv_vlens"))
    url_state.control("srv_vlens", srv.VARLEN_DEFAULT[s.source])
    vlim = srv.VARLEN_LIMITS[s.source]
    vtext = st.text_input(f"varlen batch: sequence lengths (1 to {vlim['seqs']}, each ≤ {vlim['length']:,})",
                          key="srv_vlens")
    url_state.control("srv_vrun", False)              # 1 or 0; anything else is named in a warning
    if linked is not None and linked != vtext:
        st.session_state["srv_vrun"] = False          # the link's lengths were refused: run nothing for it
    if st.toggle("Run the packed and the padded batch", key="srv_vrun",
                 help="two kernel runs; in the interpreter they take a minute on a busy machine"):
        try:
            packed, padded = live_varlen(s.source, tuple(srv.check_varlen(parse_lengths(vtext), s.source)))
            vstem = f"serving_varlen_{s.source}"
        except ValueError as exc:
            st.error(plain(exc), icon=":material/error:")
elif upload_kind == "varlen":
    packed = vstem = upload
elif found.get("varlen"):
    vnames = [p.name for p in found["varlen"]]
    url_state.control("srv_vrec", vnames[0], options=vnames)
    vrec = st.selectbox("varlen recording", vnames, key="srv_vrec")
    packed, vstem = common.trace_dir(found["varlen"][vnames.index(vrec)]), vrec
    lens = packed.meta["varlen"]["lengths_q"]
    # the same batch padded: a record() trace whose shape is the batch at its longest length (and,
    # where it says which lengths it pads, these)
    for p in found.get("padded", []):
        cand = common.trace_dir(p)
        if cand.meta["shape"]["B"] == len(lens) and cand.meta["shape"]["N_q"] == max(lens) and \
                (cand.meta.get("padded_from") or {}).get("lengths", lens) == lens:
            padded = cand
            break
else:
    st.warning("No varlen recording is bundled (data/serving/ has none). Switch the source to the "
               "live interpreter in the sidebar to run one.", icon=":material/folder_off:")
if packed is not None:
    common.name_downloads(vstem)
    if padded is None:
        st.caption("The padded batch is not recorded here: its work items and time are the analytic "
                   "model's (instrumentation.estimate).")
    common.chart(charts.varlen_lanes_figure_for(packed, padded), "serving-varlen-lanes", "srv_lanes", s.present)
    st.caption("**Which launch:** " + charts.varlen_lanes_note(packed, padded)
               + (" Magenta outlines: the tile-traced heads' items." if traced_item_mask(packed).any() else ""))
    common.chart(charts.varlen_work_figure_for(packed, padded), "serving-varlen-work", "srv_work", s.present)
    common.trace_downloads(packed, key="srv_vtrace")       # the packed batch: upload it back here
