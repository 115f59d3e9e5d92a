"""Pure figure functions: data (Trace, timeline, sweep records) -> plotly Figure.

No Streamlit here, so every figure is testable and exportable headless (app.export).
"""

import copy

import plotly.graph_objects as go

from .blockmap import (blockmap_comparison_figure, blockmap_figure, blockmap_figure_for_trace,
                       blockmap_stats, flops_per_tile)
from .memory import (crossover, hbm_calculator_figure, hbm_calculator_numbers, loglog_slope,
                     memory_figure, sweep_provenance, tile_count_point, time_figure, traffic_figure,
                     traffic_model)
from .schedule import (animation_times, imbalance_figure, schedule_comparison_figure,
                       schedule_comparison_stats, sm_lanes_figure, tile_animation_figure,
                       tile_grid_figure, tile_states)
from .softmax import (inputs_for_trace, softmax_error_figure, softmax_overview_figure,
                      softmax_state_figure, softmax_steps, softmax_strip_figure, softmax_tile_figure)


def presentation(fig: go.Figure, font_size: int = 20) -> go.Figure:
    """A copy of `fig` styled for slides: larger fonts, light template, no grid clutter.

    Works on any figure here; provenance captions stay (smaller, but readable).
    """
    out = go.Figure(copy.deepcopy(fig.to_dict()))
    out.update_layout(template="simple_white", font=dict(size=font_size),
                      title_font=dict(size=int(font_size * 1.3)), hoverlabel=dict(font_size=font_size),
                      paper_bgcolor="white", plot_bgcolor="white")
    out.update_xaxes(showgrid=False, zeroline=False, ticks="outside")
    out.update_yaxes(showgrid=False, zeroline=False, ticks="outside")
    for ann in out.layout.annotations:
        if ann.name == "provenance":
            # larger tick labels and axis title push the caption down with them
            ann.font.size = max(12, int(font_size * 0.6))
            ann.yshift = (ann.yshift or -58) - 2 * font_size
            out.update_layout(margin=dict(b=(out.layout.margin.b or 100) + 2 * font_size))
    # subplot titles are annotations too; keep them in step with the larger font
    for ann in out.layout.annotations:
        if ann.name != "provenance" and ann.font.size is None:
            ann.font.size = int(font_size * 0.9)
    return out


__all__ = [
    "presentation",
    "sm_lanes_figure", "tile_grid_figure", "tile_animation_figure", "imbalance_figure",
    "schedule_comparison_figure", "schedule_comparison_stats", "tile_states", "animation_times",
    "blockmap_figure", "blockmap_figure_for_trace", "blockmap_comparison_figure", "blockmap_stats",
    "flops_per_tile",
    "softmax_steps", "inputs_for_trace", "softmax_tile_figure", "softmax_state_figure",
    "softmax_error_figure", "softmax_strip_figure", "softmax_overview_figure",
    "memory_figure", "time_figure", "traffic_figure", "traffic_model", "hbm_calculator_figure",
    "hbm_calculator_numbers", "crossover", "loglog_slope", "sweep_provenance", "tile_count_point",
]
