"""Page 2: the block-skip map. Which tiles the mask makes full, partial or skipped, what that
saves, and whether the kernel really visited exactly the predicted tiles."""

import streamlit as st

from app import settings, sources, url_state
from app.figures.blockmap import TILE_RULES, blockmap_comparison_figure, blockmap_figure, blockmap_stats
from app.text import RANGE_CONVENTION, plain
from app.views import common
from kernels import parse_mask
from kernels.masks import MASK_HELP, MASK_KINDS, MASKS

s = settings.current()
st.title("Block-skip map")
problems = s.problems()
if problems:
    common.explain_failure(sources.RunError(" ".join(problems)), s)
    st.stop()

trace = None
try:
    src = sources.current_source(s)
    common.name_downloads(src)
    common.banner(src)
    trace = src.trace
except sources.RunError as exc:  # e.g. too big for the interpreter: the prediction still works
    common.explain_failure(exc, s)
    st.warning("Showing the block map **predicted from the mask** only (MaskSpec.block_map); "
               "no kernel visits to overlay.", icon=":material/straighten:")

@st.cache_resource(show_spinner=False, max_entries=16)
def map_fig(key, mask, n, block_m, block_n, head_dim, bh, n_k, _trace):
    """The block map (key: the source's key, None for the mask's prediction alone): built once
    per view, not at every rerun, and sent once (common.chart(cached=True))."""
    return blockmap_figure(mask, n, block_m, block_n, head_dim, trace=_trace, bh=bh, n_k=n_k)


@st.cache_resource(show_spinner=False, max_entries=16)
def comparison_fig(left, right, head_dim):
    return blockmap_comparison_figure(left, right, head_dim=head_dim)


if trace is not None and len(trace.tiles) == 0:
    st.info("This trace has no tile detail (recorded with level='work'), so there are no kernel "
            "visits to overlay: the map below is the prediction from the mask.")
    trace = None

bh = None
if trace is not None:
    heads = sorted(int(h) for h in trace.tiles["bh"].unique())
    if len(heads) > 1:
        url_state.control("skip_head", heads[0], options=heads)
        bh = int(st.selectbox("Head whose visits are overlaid (traced ones)", heads, key="skip_head"))
    else:
        bh = heads[0]
stats = blockmap_stats(s.mask, s.seq_len, s.block_m, s.block_n, s.head_dim, trace=trace, bh=bh, n_k=s.n_k)
m = st.columns(6)
m[0].metric("tiles", f"{stats['tiles']:,}", help=f"grid {stats['grid'][0]}×{stats['grid'][1]}")
m[1].metric("full", f"{stats['full']:,}")
m[2].metric("partial", f"{stats['partial']:,}")
m[3].metric("skipped", f"{stats['skipped']:,}")
m[4].metric("fraction skipped", f"{stats['fraction_skipped']:.1%}")
m[5].metric("GFLOP saved", f"{stats['flops_saved'] / 1e9:,.3g}",     # short: six metrics share 1280 px
            help=f"per head: 4·bm·bn·d = {stats['flops_per_tile']:,} FLOPs per tile; "
                 f"{stats['flops_computed'] / 1e9:,.3g} GFLOP computed of {stats['flops_all_tiles'] / 1e9:,.3g}")
if trace is not None:
    if stats["disagreements"]:
        shown = ", ".join(f"(q {q}, k {k}: mask says {st_}, kernel {'visited' if v else 'skipped'})"
                          for q, k, st_, v in stats["disagreement_tiles"][:10])
        st.error(f"**The kernel disagrees with the block map on {stats['disagreements']} tile(s)**: "
                 f"{shown}. Either the mask's block classification or the kernel's block lists are "
                 "wrong: this is a bug, please report it with the trace (download below).", icon=":material/report:")
    else:
        st.success(f"The kernel visited exactly the {stats['visited']:,} tiles the block map predicts "
                   f"(head bh={bh}).", icon=":material/check_circle:")

st.markdown(f"A tile is Q block i × K block j: queries [i·{s.block_m}, (i+1)·{s.block_m}) against keys "
            f"[j·{s.block_n}, (j+1)·{s.block_n}). The mask puts it in one of three states:  \n"
            + "  \n".join(f"**{name}**: {TILE_RULES[name]}." for name in ("full", "partial", "skipped")))
st.caption("Hover a tile for its query and key ranges, its state and the rule. " + RANGE_CONVENTION)
common.chart(map_fig(src.key if trace is not None else None, s.mask, s.seq_len, s.block_m, s.block_n, s.head_dim,
                     bh, s.n_k, trace), "block-map", "skip_map", s.present, cached=True)

st.subheader("Compare side by side")
CMP_KINDS = ["two block sizes", "two masks"]
url_state.control("skip_cmp_kind", CMP_KINDS[0], options=CMP_KINDS)    # comparison choices live in the link
what = st.radio("Compare", CMP_KINDS, horizontal=True, key="skip_cmp_kind")
left = {"mask": s.mask, "n": s.seq_len, "n_k": s.n_k, "block_m": s.block_m, "block_n": s.block_n}
right = dict(left)
if what == "two block sizes":
    c1, c2 = st.columns(2)
    cmp_bm, cmp_bn = (128 if s.block_m != 128 else 64), (128 if s.block_n != 128 else 64)
    if settings.grid_problem(s.seq_len, s.n_k, cmp_bm, cmp_bn):    # a long run: the default must draw
        cmp_bm = cmp_bn = max(settings.BLOCK_SIZES)
    url_state.control("skip_cmp_bm", cmp_bm, options=settings.BLOCK_SIZES)
    right["block_m"] = c1.selectbox("block_m (right)", settings.BLOCK_SIZES, key="skip_cmp_bm")
    url_state.control("skip_cmp_bn", cmp_bn, options=settings.BLOCK_SIZES)
    right["block_n"] = c2.selectbox("block_n (right)", settings.BLOCK_SIZES, key="skip_cmp_bn")
else:
    others = {name: kind.default_text(s.seq_len) for name, kind in MASKS.items()}   # the registry's defaults
    kind = s.mask.kind
    default = next(k for k in MASK_KINDS if k != kind)
    url_state.control("skip_cmp_mask", others[default])        # checked by parse_mask below
    text = st.text_input("Mask (right)", key="skip_cmp_mask",
                         help=MASK_HELP)
try:
    if what != "two block sizes":
        right["mask"] = parse_mask(text, s.seq_len, s.n_k)     # the page's own mask field, parsed once
    too_big = settings.grid_problem(right["n"], right["n_k"], right["block_m"], right["block_n"])
    if too_big:
        st.error(f"The right-hand map cannot be drawn: {plain(too_big)}", icon=":material/error:")
    else:
        common.chart(comparison_fig(left, right, s.head_dim), "block-map-comparison", "skip_cmp", s.present,
                     cached=True)
except ValueError as exc:
    st.error(f"The right-hand mask does not work: {plain(exc)}")

if trace is not None:
    st.subheader("Downloads")
    common.trace_downloads(trace, "skip")
