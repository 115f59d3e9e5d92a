"""Pure figure functions: data (Trace, timeline, sweep records) -> plotly Figure.

No Streamlit here, so every figure is testable and exportable headless (app.export). The
analysis behind the figures (softmax steps, block-map statistics, traffic crossovers and slopes)
lives in instrumentation/; the names are re-exported here for convenience.

    schedule.py, schedule_animation.py   SM lanes, tile grid, imbalance, comparisons; the animation
    schedule_common.py                   what those two share (colours, captions, the lane raster)
    blockmap.py, softmax.py, memory.py   block-skip maps, the online softmax, memory and traffic
    ring.py, decode.py, kv_sharing.py    across devices, prefill vs decode, K/V sharing
    _common.py, _slide.py                colours, axes and templates; the slide look
    registry.py                          every chart by name, the list `python -m app.export` walks
"""

from ._common import SLIDE_TEMPLATE, TEMPLATE, title_text  # noqa: F401  (registers the templates)
from ._slide import is_slide, presentation
from .blockmap import (blockmap_comparison_figure, blockmap_figure, blockmap_figure_for_trace,
                       blockmap_stats, flops_per_tile)
from .memory import (crossover, hbm_calculator_figure, hbm_calculator_numbers, loglog_slope,
                     memory_figure, sweep_provenance, tile_count_point, time_figure, traffic_figure,
                     traffic_model)
from .schedule import (imbalance_figure, schedule_comparison_figure, schedule_comparison_stats,
                       sm_lanes_figure, tile_grid_figure, tile_states)
from .schedule_animation import tile_animation_figure
from .softmax import (default_q_row, inputs_for_trace, softmax_error_figure, softmax_overview_figure,
                      softmax_state_figure, softmax_steps, softmax_strip_figure, softmax_tile_figure)

__all__ = [
    "presentation", "is_slide", "TEMPLATE", "SLIDE_TEMPLATE", "title_text",
    "sm_lanes_figure", "tile_grid_figure", "tile_animation_figure", "imbalance_figure",
    "schedule_comparison_figure", "schedule_comparison_stats", "tile_states",
    "blockmap_figure", "blockmap_figure_for_trace", "blockmap_comparison_figure", "blockmap_stats",
    "flops_per_tile",
    "softmax_steps", "default_q_row", "inputs_for_trace", "softmax_tile_figure", "softmax_state_figure",
    "softmax_error_figure", "softmax_strip_figure", "softmax_overview_figure",
    "memory_figure", "time_figure", "traffic_figure", "traffic_model", "hbm_calculator_figure",
    "hbm_calculator_numbers", "crossover", "loglog_slope", "sweep_provenance", "tile_count_point",
]
