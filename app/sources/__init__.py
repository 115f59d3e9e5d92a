"""Where the trace behind a view comes from, one module per kind of source:

    bundled.py   recordings under data/traces/ (found without loading their tables, cached loads)
    live.py      live runs on this machine's CUDA GPU or in Triton's CPU interpreter, estimates
    upload.py    a zip of a trace directory (manifest.json + parquet files)
    model_run.py captured model runs (data/runs/, uploads) and a run's call as a recording
    named.py     a recording by name: a bundled trace or a model run's call
    current.py   the settings' source resolved to the trace the page shows
    errors.py    RunError, what every source raises when it cannot give a trace

The names the pages use are re-exported here (`from app import sources; sources.current_source(s)`).
"""

from app.sources.bundled import (Recording, data_dir, data_index, default_recording, discover_sweeps,
                                 discover_traces, distance, load_recording, nearest, recordings,
                                 schedule_variants)
from app.sources.current import Source, current_source, refusal, run_before_page
from app.sources.errors import RunError
from app.sources.live import (computed_tiles, estimate, has_run, live_source, run_live, run_lock,
                              seconds_per_tile)
from app.sources.upload import trace_from_zip, upload_digest, uploaded_trace
from app.sources.model_run import call_name, call_problem, is_call_name
from app.sources.named import recording_named

__all__ = [
    "Recording", "data_dir", "data_index", "default_recording", "discover_sweeps", "discover_traces",
    "distance", "load_recording", "nearest", "recording_named", "recordings", "schedule_variants",
    "Source", "current_source", "refusal", "run_before_page", "RunError",
    "computed_tiles", "estimate", "has_run", "live_source", "run_live", "run_lock", "seconds_per_tile",
    "trace_from_zip", "upload_digest", "uploaded_trace", "call_name", "call_problem", "is_call_name",
]
