"""Page: across devices. Ring attention recorded on several GPUs (data/ring/): per-rank compute
and transfers, the ring of K/V chunks, natural vs zigzag balance, and one row's (m, l) merged
across ranks, the online-softmax merge one level up."""

import json
from pathlib import Path

import pandas as pd
import streamlit as st

from app import presentation, settings, sources, url_state
from app.figures._common import fmt_bytes
from app.figures.ring import (balance_figure, efficiency_note, kv_step_bytes, overlap_stats, ring_diagram_figure,
                              ring_merge_figure, ring_provenance, ring_timeline_figure)
from instrumentation.trace.files import DTYPE_BYTES
from app.views import common

s = settings.current()
st.title("Across devices: ring attention")
st.caption("Past one GPU, each rank keeps a slice of the queries while the keys and values travel "
           "round a ring (torch.distributed: NCCL between GPUs). Each rank attends its queries to "
           "the chunk it holds with our kernel, which returns the log-sum-exp, and merges the partial "
           "results with the same online-softmax algebra that joins tiles inside the kernel. Only K "
           "and V move between ranks: per step each rank sends the chunk it holds, 2·B·H_kv·(N/W)·D "
           "values (K and V). The queries and each row's running (m, l, O) stay on their rank; each "
           "step's partial result merges into them there.")


def recordings() -> dict[str, Path]:
    return {p.parent.name: p.parent for p in sorted((sources.data_dir() / "ring").glob("*/manifest.json"))}


def _same_problem(a: dict, b: dict) -> bool:
    """Two GPU recordings of one problem under the two layouts (measured balance side by side;
    interpreted kernels' host times say nothing about balance)."""
    ra, rb = a.get("ring", {}), b.get("ring", {})
    return (a["shape"] == b["shape"] and a["mask"] == b["mask"] and a.get("backend") == b.get("backend") == "cuda"
            and ra.get("world") == rb.get("world") and ra.get("layout") != rb.get("layout"))


recs = recordings()
if not recs:
    st.warning("No ring recordings are bundled (data/ring/ is empty). Record one on GPUs with "
               "`python -m instrumentation.ring --world-size 4 --seq-len 65536 --out data/ring/NAME`, "
               "or on this CPU with `--backend gloo --seq-len 192`.", icon=":material/folder_off:")
    st.stop()
if s.source != "recorded":
    st.info("This page shows recorded ring runs (several GPUs cannot run inside the app); the "
            "source control on the left applies to the single-GPU pages.", icon=":material/info:")
names = list(recs)
url_state.control("ring_rec", names[0], options=names)
name = st.selectbox("Recording (data/ring/)", names, key="ring_rec")
trace = common.trace_dir(recs[name])
meta, ring = trace.meta, trace.meta["ring"]
steps = trace.ring_steps
prov = ring_provenance(meta)
hardware = meta.get("backend") == "cuda"
st.info(f"**Data: {prov}**  \n" + (efficiency_note(meta) or "no hardware timing (interpreter)") +
        f" · output vs one device: relative error {ring['rel_err_vs_single']:.1e}", icon=":material/info:")

sent = steps.loc[steps.bytes_sent > 0, "bytes_sent"]
per_step = kv_step_bytes(meta)
sh = meta["shape"]
st.caption(f"Sent per rank and step here: K and V of {sh['N'] // ring['world']:,} rows = 2 × B {sh['B']} × "
           f"H_kv {sh.get('H_kv', sh['H'])} × {sh['N'] // ring['world']:,} × D {sh['D']} × "
           f"{DTYPE_BYTES[meta['dtype']]} B = **{fmt_bytes(per_step)}**"
           + (f"; the recording's transfers: {fmt_bytes(int(sent.iloc[0]))} each"
              + ("" if sent.nunique() == 1 else f" to {fmt_bytes(int(sent.max()))}") if len(sent) else "")
           + ". Nothing else crosses the ring.")

ov = overlap_stats(steps)
shape = meta["shape"]
m = st.columns(5)
m[0].metric("ranks × tokens", f"{ring['world']} × {shape['N'] // ring['world']:,}",   # short: a fifth of 1280 px
            f"N = {shape['N']:,}", delta_color="off", delta_arrow="off", help=f"N = {shape['N']:,}, H = {shape['H']}, D = {shape['D']}")
m[1].metric("layout", ring["layout"], f"{meta['mask']} mask", delta_color="off", delta_arrow="off",
            help=f"the sequence is cut into chunks of {ring['chunk']:,} rows")
m[2].metric("ring time", f"{ring['ring_ms']:.2f} ms" if ring.get("ring_ms") else "—",
            f"one GPU {ring['single_device_ms']:.2f} ms" if ring.get("single_device_ms") else "interpreter",
            delta_color="off", delta_arrow="off")
m[3].metric("parallel efficiency", f"{100 * ring['parallel_efficiency']:.0f}%" if ring.get("parallel_efficiency")
            else "—", "vs one GPU", delta_color="off", delta_arrow="off", help="one-GPU time / (W × ring time)")
m[4].metric("transfers hidden", f"{100 * ov['hidden']:.0f}%",
            f"{ov['gbps']:.0f} GB/s effective" if ov["gbps"] and hardware else "", delta_color="off", delta_arrow="off",
            help="hidden: the share of transfer time that overlapped compute. Effective: bytes sent "
                 "over (send start to arrival), median over transfers; it includes waiting for the "
                 "peer to post its receive, so it is not the link bandwidth")

st.subheader("1. Per-rank timeline: is the transfer hidden behind compute?")
common.chart(ring_timeline_figure(steps, prov, hardware), "ring-timeline", "ring_tl", s.present)
st.caption("Each step's send/receive starts when the previous step's compute has freed the buffer "
           "and runs on a side stream while this step computes; the next step starts when both are "
           "done. A transfer that ends after its compute shows as exposed time.")

st.subheader("2. The ring")
common.chart(ring_diagram_figure(steps, prov), "ring-diagram", "ring_diag", s.present)

st.subheader("3. Natural vs zigzag under a causal mask")
if meta["mask"] != "causal":
    st.caption("Under the full mask every pair is visible and both layouts do equal work; the "
               "balance matters under causal.")
sibling = next((other for n, other in recs.items() if n != name and _same_problem(
    common.trace_dir(other).meta, meta)), None)
measured = None
if sibling is not None:
    other = common.trace_dir(sibling)
    measured = {ring["layout"]: steps, other.meta["ring"]["layout"]: other.ring_steps}
common.chart(balance_figure(trace.ring_balance, meta["mask"], prov, measured), "ring-balance", "ring_bal",
             s.present)
st.caption("Natural: rank r holds chunk r, so under causal the last rank attends to everything and "
           "rank 0 to one chunk, and every step waits for the busiest rank. Zigzag: rank r holds "
           "chunks r and 2W−1−r, so every rank does the same work at every step.")

st.subheader("4. One row's (m, l), merged across ranks")
rows = trace.ring_rows
q_rows = sorted(int(x) for x in rows.q_row.unique())
# on slides a bar fixed at the bottom (app/presentation.py): the merge chart, the page's last, and
# its step slider are on screen together
c1, c2 = st.container(key=f"{presentation.STEP_BAR}_ring").columns([1, 2])
url_state.control("ring_row", q_rows[-1], int, options=q_rows)
q_row = c1.selectbox("query row (traced ones)", q_rows, key="ring_row")
n_parts = int((rows.q_row == q_row).sum())
url_state.control("ring_step", n_parts, int, options=range(1, n_parts + 1))
upto = c2.slider("chunks merged", 1, n_parts, key="ring_step") if n_parts > 1 else 1
final = trace.out.set_index("q_row").lse.get(q_row)
common.chart(ring_merge_figure(rows, q_row, upto - 1, final, prov), "ring-merge", "ring_merge", s.present)
st.caption("Per chunk j the rank has (m_j, l_j); merging is m = max(m, m_j), l = l·e^(m_old − m) + "
           "l_j·e^(m_j − m), and O likewise. The order does not matter (the merge is associative), "
           "which is why any number of ranks gives the exact result. See the online-softmax page for "
           "the same merge tile by tile inside one kernel.")


def benchmark_table():
    """Our ring vs torch's context parallel vs one GPU, side by side per problem, from
    data/benchmarks/ring-*.json: each cell 'time ms (efficiency %)'. Of the ring benchmarks that
    compare with torch's CP, the one on the most GPUs, then the newest (probes and other files
    there are passed over)."""
    docs = []
    for path in (sources.data_dir() / "benchmarks").glob("ring-*.json"):
        try:
            doc = json.loads(path.read_text())
            records = doc["records"]
            worlds = [int(r["world"]) for r in records if str(r.get("impl", "")).startswith("torch_cp")]
            if doc["meta"].get("kind", "ring") == "ring" and worlds:
                docs.append(((max(worlds), str(doc["meta"].get("date", ""))), doc))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    if not docs:
        return None
    doc = max(docs, key=lambda d: d[0])[1]
    df = pd.DataFrame(doc["records"])
    cell = [("—" if pd.isna(ms) else f"{ms:.2f} ms" + ("" if pd.isna(eff) else f" ({100 * eff:.0f}%)"))
            for ms, eff in zip(df["ms"], df["parallel_efficiency"])]
    table = df.assign(cell=cell).pivot_table(index=["world", "mask", "seq_len"], columns="impl", values="cell",
                                             aggfunc="first")
    order = [c for c in ("ring:zigzag", "torch_cp:allgather", "torch_cp:alltoall", "ring:natural",
                         "tilescope_1gpu", "sdpa_1gpu") if c in table.columns]
    table = table[order].reset_index().rename(columns={"world": "GPUs", "seq_len": "N"})
    return table, doc["meta"]


st.subheader("Against PyTorch's context parallel")
bench = benchmark_table()
if bench is None:
    st.caption("No benchmark bundled yet: `python -m benchmarks.ring` on a machine with several GPUs "
               "writes data/benchmarks/ring-<device>.json.")
else:
    df, bmeta = bench
    st.dataframe(df, hide_index=True)
    st.caption(f"Each cell: time (parallel efficiency). `{bmeta['command']}` on {bmeta['gpu_count']} × "
               f"{bmeta['device']}, {bmeta['date'][:10]}, torch {bmeta['torch_version']}: {bmeta['timing']}; "
               f"efficiency = {bmeta['efficiency']} (ours against our kernel on one GPU, torch's against "
               "SDPA on one GPU). Outputs were checked against our one-GPU output before timing.")
common.trace_downloads(trace, "ring_dl")
