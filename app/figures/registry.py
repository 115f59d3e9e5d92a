"""Every chart the app shows, by name, built from a trace or a sweep: the one list that the
export command line and its gallery walk (a new view registers here and is exported too).

    TRACE_CHARTS["blockmap"](ctx) -> plotly Figure        ctx: ChartInputs (trace, sweep, options)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ChartInputs:
    trace: object = None              # instrumentation.trace.Trace
    sweep: tuple | None = None        # (meta, records DataFrame) from instrumentation.trace.sweep_file.load_sweep
    compare: object = None            # a second Trace of the same problem (schedule comparison)
    q_row: int | None = None          # softmax row (default: a row whose running max changes)
    step: int | None = None           # softmax step, 1-based (default: the first step with α < 1)
    sms: int | None = None
    gpu: str | None = None
    head: int | None = None           # traced head bh (softmax, tiles, animation); the decode merge's query head
    run: object = None                # a ModelRun (data/runs/NAME): the Model run page's charts
    run_name: str = ""
    model: tuple | None = None        # (app.figures.estimate.Problem, N): the Your model page's charts
    _cache: dict = field(default_factory=dict)

    def timeline(self):
        from instrumentation.analysis.schedule_model import timeline

        if "tl" not in self._cache:
            self._cache["tl"] = timeline(self.trace, sms=self.sms, gpu=self.gpu)
        return self._cache["tl"]

    def traced_head(self) -> int:
        """--head, checked against the heads with tile detail; default the first traced one."""
        tr = self.trace
        heads = sorted({int(h) for h in tr.meta.get("traced_heads") or []}
                       | {int(h) for h in tr.rows["bh"].unique()} | {int(h) for h in tr.tiles["bh"].unique()})
        if not heads:
            raise ValueError("this trace has no tile detail (recorded with level='work'): no head to show")
        if self.head is None:
            return heads[0]
        if int(self.head) not in heads:
            shown = ", ".join(map(str, heads[:12])) + (", ..." if len(heads) > 12 else "")
            raise ValueError(f"--head {self.head} has no tile detail in this recording; traced heads: {shown}")
        return int(self.head)

    def softmax_steps(self):
        from instrumentation.analysis.online_softmax import default_q_row, softmax_steps
        from instrumentation.recording.inputs import inputs_for_trace

        if "steps" not in self._cache:
            if len(self.trace.rows) == 0:
                raise ValueError("this trace has no per-row softmax state (recorded with level='work')")
            bh = self.traced_head()
            row = default_q_row(self.trace, bh) if self.q_row is None else int(self.q_row)
            q, k, v = inputs_for_trace(self.trace, bh)
            self._cache["steps"] = softmax_steps(self.trace, row, q, k, v, bh=bh)
        return self._cache["steps"]

    def softmax_step_index(self) -> int:
        """0-based index of the step to show: --step (1-based) or the first rescale (α < 1)."""
        steps = self.softmax_steps()
        if self.step is not None:
            if not 1 <= self.step <= len(steps):
                raise ValueError(f"--step must be within 1..{len(steps)} for this row, got {self.step}")
            return self.step - 1
        later = steps.index[(steps["alpha_kernel"] < 1) & (steps.index > 0)]
        return int(later[0]) if len(later) else len(steps) - 1


def _F():
    from app import figures
    return figures


def _blockmap_compare(c: ChartInputs):
    m = c.trace.meta
    n, bm, bn = int(m["shape"]["N"]), int(m["block_m"]), int(m["block_n"])
    left = {"mask": c.trace.mask_spec, "n": n, "block_m": bm, "block_n": bn, "n_k": c.trace.kv_len}
    right = dict(left, block_m=128 if bm != 128 else 64, block_n=128 if bn != 128 else 64)
    return _F().blockmap_comparison_figure(left, right, head_dim=int(m["shape"]["D"]))


def _compare(c: ChartInputs):
    if c.compare is None:
        raise ValueError("--chart compare needs --compare TRACE (a second schedule of the same problem)")
    return _F().schedule_comparison_figure(c.trace, c.compare, sms=c.sms, gpu=c.gpu)


def _sweep(c: ChartInputs):
    if c.sweep is None:
        raise ValueError("this chart draws a sweep: pass --sweep data/sweeps/NAME.json")
    return c.sweep


def _calculator(c: ChartInputs):
    meta, df = c.sweep if c.sweep is not None else ({}, None)
    from instrumentation.analysis import hbm
    el = hbm.DTYPE_BYTES.get(meta.get("dtype", "fp16"), 2)
    # seed 000's worked example (T = 8192), with the sweep's heads / head dim / block when given
    return _F().hbm_calculator_figure(8192, int(meta.get("heads", 32)), int(meta.get("head_dim", 128)),
                                      int(meta.get("block_m", 128)), int(meta.get("block_n", 128)), el)


def _ring(c: ChartInputs):
    """(figures module, meta, provenance) of a ring recording (data/ring/NAME)."""
    from app.figures import ring

    if "ring" not in c.trace.meta:
        raise ValueError("the ring charts draw a ring recording: pass --trace data/ring/NAME")
    return ring, c.trace.meta, ring.ring_provenance(c.trace.meta)


def _ring_timeline(c: ChartInputs):
    ring, meta, prov = _ring(c)
    return ring.ring_timeline_figure(c.trace.ring_steps, prov, meta.get("backend") == "cuda")


def _ring_diagram(c: ChartInputs):
    ring, _, prov = _ring(c)
    return ring.ring_diagram_figure(c.trace.ring_steps, prov)


def _ring_balance(c: ChartInputs):
    ring, meta, prov = _ring(c)
    return ring.balance_figure(c.trace.ring_balance, meta["mask"], prov)


def _decode_pair(c: ChartInputs):
    """(splits = 1, split) recordings of one decode step: --trace and --compare (or the bundled
    sibling that the command line loads into compare), in either order."""
    if c.trace.meta.get("kind") != "decode":
        raise ValueError("the decode charts draw a decode recording: pass --trace data/decode/NAME")
    if c.compare is None or c.compare.meta.get("kind") != "decode":
        raise ValueError("the decode charts compare splits = 1 with a split: pass --compare data/decode/NAME "
                         "(the same step with the other split count)")
    pair = sorted((c.trace, c.compare), key=lambda t: int(t.meta["kernel"]["num_splits"]))
    if int(pair[0].meta["kernel"]["num_splits"]) != 1 or int(pair[1].meta["kernel"]["num_splits"]) == 1:
        raise ValueError("the decode charts need one recording with num_splits = 1 and one with more splits")
    if pair[0].meta["shape"] != pair[1].meta["shape"]:
        raise ValueError("the two decode recordings are of different shapes; pass the same step with both split counts")
    return pair


def _decode_merge(c: ChartInputs):
    from app.figures import decode

    _, chosen = _decode_pair(c)
    steps, label = decode.decode_row_steps(chosen, 0, 0 if c.head is None else int(c.head), c.q_row)
    if c.step is not None and not 1 <= c.step <= len(steps):
        raise ValueError(f"--step must be within 1..{len(steps)} (the splits of this row), got {c.step}")
    step = len(steps) - 1 if c.step is None else c.step - 1
    return decode.merge_figure(steps, step, chosen.provenance(), label)


def _decode_kv(c: ChartInputs):
    from app.figures import decode

    _, chosen = _decode_pair(c)
    shape = chosen.meta["shape"]          # the bundled recordings use Llama-3-8B attention shapes
    return decode.decode_kv_figure("llama-3-8b", int(shape["B"]), int(shape["N_k"]),
                                   f"recording ({chosen.provenance()})")


def _kv_sharing():
    from app.figures import kv_sharing
    return kv_sharing


def _backward():
    from app.figures import backward_charts
    return backward_charts


def _decode_figures():
    from app.figures import decode
    return decode


def _serving():
    from app.figures import serving_traces
    return serving_traces


def _low_precision():
    from app.figures import low_precision
    return low_precision


TRACE_CHARTS = {
    "schedule": lambda c: _F().sm_lanes_figure(c.trace, tl=c.timeline()),
    "tiles": lambda c: _F().tile_grid_figure(c.trace, tl=c.timeline(), bh=c.traced_head()),
    "animation": lambda c: _F().tile_animation_figure(c.trace, tl=c.timeline(), max_frames=40,    # default head:
                                                      bh=None if c.head is None else c.traced_head()),  # busy mid-run
    "imbalance": lambda c: _F().imbalance_figure(c.trace, tl=c.timeline()),
    "kv-sharing": lambda c: _kv_sharing().kv_sharing_figure(c.trace, c.timeline()),
    "compare": _compare,
    "blockmap": lambda c: _F().blockmap_figure_for_trace(c.trace),
    "blockmap-compare": _blockmap_compare,
    "softmax": lambda c: _F().softmax_overview_figure(c.softmax_steps(), c.softmax_step_index()),
    "softmax-strip": lambda c: _F().softmax_strip_figure(c.softmax_steps(), c.softmax_step_index()),
    "softmax-tile": lambda c: _F().softmax_tile_figure(c.softmax_steps(), c.softmax_step_index()),
    "softmax-state": lambda c: _F().softmax_state_figure(c.softmax_steps(), c.softmax_step_index()),
    "softmax-error": lambda c: _F().softmax_error_figure(c.softmax_steps(), c.softmax_step_index()),
}
# a trace recorded with backward=True also draws the Backward page's charts
BACKWARD_CHARTS = {
    "bwd-order": lambda c: _backward().order_chart(c.trace, c.head),
    "bwd-lanes": lambda c: _backward().lanes_chart(c.trace, c.sms),
    "bwd-dq": lambda c: _backward().dq_chart(c.trace, c.head, q_row=c.q_row),
    "bwd-time": lambda c: _backward().time_chart(c.trace, c.timeline(), c.sms),
    "bwd-flops": lambda c: _backward().flops_chart(c.trace),
    "bwd-memory": lambda c: _backward().memory_chart(c.trace),
}
# ring recordings (data/ring/NAME) have their own views
RING_CHARTS = {"ring-timeline": _ring_timeline, "ring-diagram": _ring_diagram, "ring-balance": _ring_balance}
# decode recordings (data/decode/NAME, with the same step's other split count) have the decode page's views
DECODE_CHARTS = {
    "decode-lanes": lambda c: _decode_figures().decode_pair_lanes_figure(*_decode_pair(c)),
    "decode-merge": _decode_merge,
    "decode-roofline": lambda c: _decode_figures().decode_pair_roofline_figure(*_decode_pair(c)),
    "decode-kv-bytes": _decode_kv,
}
# serving recordings (data/serving/NAME): a paged decode step; a varlen batch (--compare: the same
# batch padded, a record() trace; without it the padded batch is the estimator's)
PAGED_CHARTS = {
    "serving-block-table": lambda c: _serving().block_table_figure_for(c.trace),
    "serving-page-walk": lambda c: _serving().page_walk_figure_for(c.trace),
    "serving-cache-bytes": lambda c: _serving().cache_bytes_figure_for(c.trace),
    "serving-page-sizes": lambda c: _serving().page_size_figure_for(c.trace),
}
VARLEN_CHARTS = {
    "serving-varlen-lanes": lambda c: _serving().varlen_lanes_figure_for(c.trace, c.compare, c.sms),
    "serving-varlen-work": lambda c: _serving().varlen_work_figure_for(c.trace, c.compare),
}
# precision studies (data/precision/NAME, instrumentation.precision_study): the Low precision page's charts
PRECISION_CHARTS = {
    "precision-rmse": lambda c: _low_precision().error_maps_figure(c.trace, "rmse"),
    "precision-max-abs": lambda c: _low_precision().error_maps_figure(c.trace, "max_abs"),
    "precision-summary": lambda c: _low_precision().error_summary_figure(c.trace),
    "precision-speed": lambda c: _low_precision().speed_figure(c.trace),
}
SWEEP_CHARTS = {
    "memory": lambda c: _F().memory_figure(_sweep(c)[1], _sweep(c)[0]),
    "time": lambda c: _F().time_figure(_sweep(c)[1], _sweep(c)[0]),
    "traffic": lambda c: _F().traffic_figure(_sweep(c)[1], _sweep(c)[0]),
    "calculator": _calculator,
}



def _model_run(fn_name: str):
    """A Model run chart of --run: figures.model_run.<fn_name>(call table, provenance)."""
    def build(c: ChartInputs):
        from app.figures import model_run as mr
        if c.run is None:
            raise ValueError("the model-run charts draw a captured model run: pass --run data/runs/NAME")
        if "run" not in c._cache:
            c._cache["run"] = (mr.call_table(c.run), mr.run_provenance(c.run, c.run_name))
        return getattr(mr, fn_name)(*c._cache["run"])
    return build


def _your_model(fn_name: str):
    """A Your model chart of --model/--n: figures.estimate.<fn_name> on the devices' sweeps."""
    def build(c: ChartInputs):
        from app.figures import estimate as est
        if c.model is None:
            raise ValueError("the estimator's charts draw a model's shape: pass --model PRESET --n N")
        p, n = c.model
        if "model" not in c._cache:
            c._cache["model"] = est.device_sweeps(p, n)
        ests = c._cache["model"]
        if fn_name == "peak_memory_figure":
            return est.peak_memory_figure(ests, n, p)
        if fn_name == "time_figure":         # the bundled recordings of this shape: measured beside the model
            from app.sources.bundled import discover_traces
            measured = est.measured_points([(r.name, r.meta) for r in discover_traces()], p)
            return est.time_figure(ests["H100"], n, p, measured)
        return getattr(est, fn_name)(ests["H100"], n, p)
    return build


# a captured model run (data/runs/NAME, instrumentation.hf.capture): the Model run page's charts
MODEL_RUN_CHARTS = {"model-run-layers": _model_run("layer_figure"), "model-run-layer-kinds": _model_run("layer_kind_figure"),
                    "model-run-steps": _model_run("steps_figure"), "model-run-kv-cache": _model_run("kv_cache_figure")}
# a model's layer at N tokens (kernels.presets), the analytic model: the Your model page's charts
ESTIMATE_CHARTS = {"your-model-peak-memory": _your_model("peak_memory_figure"),
                   "your-model-hbm-traffic": _your_model("traffic_figure"),
                   "your-model-flops": _your_model("flops_figure"), "your-model-time": _your_model("time_figure")}
CHARTS = {**TRACE_CHARTS, **BACKWARD_CHARTS, **RING_CHARTS, **DECODE_CHARTS, **PAGED_CHARTS, **VARLEN_CHARTS, **SWEEP_CHARTS,
          **MODEL_RUN_CHARTS, **ESTIMATE_CHARTS, **PRECISION_CHARTS}
OWN_INPUT_CHARTS = {**SWEEP_CHARTS, **MODEL_RUN_CHARTS, **ESTIMATE_CHARTS}     # drawn without a trace


def charts_for(inputs: ChartInputs) -> list[str]:
    """Every chart `inputs` can draw: a ring or decode recording's views, or a trace's, a sweep's,
    a model run's (--run) and a model shape's (--model)."""
    names = []
    if inputs.trace is not None:
        names += list(trace_charts(inputs.trace))
    if inputs.sweep is not None:
        names += list(SWEEP_CHARTS)
    if inputs.run is not None:
        names += list(MODEL_RUN_CHARTS)
    if inputs.model is not None:
        names += list(ESTIMATE_CHARTS)
    return names


def trace_charts(trace) -> dict:
    """The chart table for a recording's kind: ring, decode, or an attention trace."""
    if "ring" in trace.meta:
        return RING_CHARTS
    if "precision_study" in trace.meta:
        return PRECISION_CHARTS
    if len(trace.tables.get("fp8_error", ())):      # record(precision="fp8"): its error maps too
        return {**TRACE_CHARTS, **{k: PRECISION_CHARTS[k] for k in ("precision-rmse", "precision-max-abs")}}
    if trace.meta.get("varlen"):
        return VARLEN_CHARTS
    if trace.meta.get("kind") == "decode" and trace.meta.get("paged"):
        return PAGED_CHARTS
    if trace.meta.get("kind") == "decode":
        return DECODE_CHARTS
    return {**TRACE_CHARTS, **BACKWARD_CHARTS} if len(getattr(trace, "bwd_work", ())) else TRACE_CHARTS


def build(name: str, inputs: ChartInputs):
    """The chart `name` drawn from `inputs`; ValueError when these inputs cannot draw it."""
    if name not in CHARTS:
        raise ValueError(f"unknown chart {name!r}; use one of {sorted(CHARTS)}")
    if name not in OWN_INPUT_CHARTS and inputs.trace is None:
        raise ValueError(f"--chart {name} draws a trace: pass --trace data/traces/NAME")
    if name not in OWN_INPUT_CHARTS and name not in (own := trace_charts(inputs.trace)):
        kind = {id(RING_CHARTS): "ring", id(DECODE_CHARTS): "decode", id(PRECISION_CHARTS): "precision-study"}.get(
            id(own), "attention")
        raise ValueError(f"--chart {name} does not draw this {kind} recording; its charts: {', '.join(own)}")
    return CHARTS[name](inputs)


def sibling_schedule(trace_dir) -> Path | None:
    """Another bundled recording of the same problem with a different schedule (for 'compare')."""
    from instrumentation.trace import Trace

    trace_dir = Path(trace_dir)
    stem = trace_dir.name.rsplit("_", 1)[0]
    for other in sorted(trace_dir.parent.glob(f"{stem}_*")):
        if other != trace_dir and other.is_dir():
            try:
                Trace.load(other)
                return other
            except Exception:        # noqa: BLE001  (a broken sibling is simply not offered)
                continue
    return None
