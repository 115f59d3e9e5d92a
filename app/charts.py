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
    sweep: tuple | None = None        # (meta, records DataFrame) from instrumentation.sweep.load_sweep
    compare: object = None            # a second Trace of the same problem (schedule comparison)
    q_row: int | None = None          # softmax row (default: a row whose running max changes)
    step: int | None = None           # softmax step, 1-based (default: the first step with α < 1)
    sms: int | None = None
    gpu: str | None = None
    _cache: dict = field(default_factory=dict)

    def timeline(self):
        from instrumentation.schedule_model import timeline

        if "tl" not in self._cache:
            self._cache["tl"] = timeline(self.trace, sms=self.sms, gpu=self.gpu)
        return self._cache["tl"]

    def softmax_steps(self):
        from instrumentation.online_softmax import default_q_row, inputs_for_trace, softmax_steps

        if "steps" not in self._cache:
            if len(self.trace.rows) == 0:
                raise ValueError("this trace has no per-row softmax state (recorded with level='work')")
            row = default_q_row(self.trace) if self.q_row is None else int(self.q_row)
            q, k, v = inputs_for_trace(self.trace)
            self._cache["steps"] = softmax_steps(self.trace, row, q, k, v)
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
    left = {"mask": m["mask"], "n": n, "block_m": bm, "block_n": bn}
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
    from instrumentation import hbm
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


TRACE_CHARTS = {
    "schedule": lambda c: _F().sm_lanes_figure(c.trace, tl=c.timeline()),
    "tiles": lambda c: _F().tile_grid_figure(c.trace, tl=c.timeline()),
    "animation": lambda c: _F().tile_animation_figure(c.trace, tl=c.timeline(), max_frames=40),
    "imbalance": lambda c: _F().imbalance_figure(c.trace, tl=c.timeline()),
    "compare": _compare,
    "blockmap": lambda c: _F().blockmap_figure_for_trace(c.trace),
    "blockmap-compare": _blockmap_compare,
    "softmax": lambda c: _F().softmax_overview_figure(c.softmax_steps(), c.softmax_step_index()),
    "softmax-strip": lambda c: _F().softmax_strip_figure(c.softmax_steps(), c.softmax_step_index()),
    "softmax-tile": lambda c: _F().softmax_tile_figure(c.softmax_steps(), c.softmax_step_index()),
    "softmax-state": lambda c: _F().softmax_state_figure(c.softmax_steps(), c.softmax_step_index()),
    "softmax-error": lambda c: _F().softmax_error_figure(c.softmax_steps(), c.softmax_step_index()),
}
# ring recordings (data/ring/NAME) have their own views
RING_CHARTS = {"ring-timeline": _ring_timeline, "ring-diagram": _ring_diagram, "ring-balance": _ring_balance}
SWEEP_CHARTS = {
    "memory": lambda c: _F().memory_figure(_sweep(c)[1], _sweep(c)[0]),
    "time": lambda c: _F().time_figure(_sweep(c)[1], _sweep(c)[0]),
    "traffic": lambda c: _F().traffic_figure(_sweep(c)[1], _sweep(c)[0]),
    "calculator": _calculator,
}
CHARTS = {**TRACE_CHARTS, **RING_CHARTS, **SWEEP_CHARTS}


def charts_for(inputs: ChartInputs) -> list[str]:
    """Every chart `inputs` can draw: a ring recording's views, or a trace's, and a sweep's."""
    names = []
    if inputs.trace is not None:
        names += list(RING_CHARTS if "ring" in inputs.trace.meta else TRACE_CHARTS)
    if inputs.sweep is not None:
        names += list(SWEEP_CHARTS)
    return names


def build(name: str, inputs: ChartInputs):
    if name not in CHARTS:
        raise ValueError(f"unknown chart {name!r}; use one of {sorted(CHARTS)}")
    if name not in SWEEP_CHARTS and inputs.trace is None:
        raise ValueError(f"--chart {name} draws a trace: pass --trace data/traces/NAME")
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
