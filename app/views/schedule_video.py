"""The schedule page's video menu: the whole-GPU animation as a GIF or MP4 of a chosen size,
length and frame rate, rendered on request with a per-frame progress bar."""

import tempfile
import time
from pathlib import Path

import streamlit as st

from app import export
from app.export.animations import video_size
from app.figures.schedule_animation import tile_animation_figure
from app.views import common
from app.views.progress import FrameProgress
from instrumentation.analysis.schedule_analysis import cached_timeline

# seconds per rendered video frame, all in (the browser's start, each frame drawn in one reused page,
# encoding; 16k causal schedule, a 5 s clip at 8 fps, loaded 2-CPU machine): the estimate until this
# session has made a video at that size, then its own rate
SECONDS_PER_FRAME = {(960, 540): 0.15, (1280, 720): 0.2, (1920, 1080): 0.3}
VIDEO_SECONDS = [5, 10, 15, 20, 30]  # a lecture wants 10-20 s
VIDEO_FPS = [8, 12, 24]


@st.cache_resource(show_spinner=False, max_entries=4)
def video_fig(key, sms, color_by, bh, frames, _trace):
    """The animation with exactly the frames a video renders, so its caption's "frames every
    ..." is the video's own spacing."""
    return tile_animation_figure(_trace, cached_timeline(_trace, sms), max_frames=frames, bh=bh, color_by=color_by)


def video_menu(src, trace, sms, color_by, bh: int, present: bool) -> None:
    """GIF / MP4 of the animation as shown, of a chosen length and frame rate (frames = length x
    fps; at most MAX_ANIMATION_FRAMES distinct ones rendered, each held for its share): rendered
    when asked, with the time it will take said before (this session's measured rate per frame)
    and a per-frame progress bar while it runs, then offered as a download.

    Arguments: the page's source and trace, its modelled SM count (None: the recorded one), the
    lanes' colour column, the traced head bh, the slide look or not."""
    with st.popover("⬇ Video (GIF · MP4)", width="content", key="sched_video_menu"):
        v1, v2, v3, v4 = st.columns(4)
        fmt = v1.selectbox("Video", ["gif", "mp4"], key="sched_video_fmt", format_func=str.upper)
        size = v2.selectbox("Size", list(SECONDS_PER_FRAME), key="sched_video_size",
                            format_func=lambda wh: f"{wh[0]}×{wh[1]}")
        seconds = v3.selectbox("Length", VIDEO_SECONDS, index=2, key="sched_video_seconds",
                               format_func=lambda x: f"{x} s")
        fps = v4.selectbox("Frames per second", VIDEO_FPS, key="sched_video_fps")
        rendered = min(export.MAX_ANIMATION_FRAMES, seconds * fps)
        rate = st.session_state.get("sched_video_rate", {}).get(size, SECONDS_PER_FRAME[size])
        est = rate * rendered
        st.caption(f"{seconds * fps} video frames ({seconds} s at {fps} fps) from {rendered} distinct frames "
                   f"of the run{', each held ' + format(seconds * fps / rendered, '.2g') + '×' if rendered < seconds * fps else ''}; "
                   f"about {rate:.2g} s per frame to render.")
        made = st.session_state.get("sched_video")
        want = (src.key, sms, color_by, bh, fmt, size, seconds, fps, present)
        if st.button(f"Make the {fmt.upper()} (about {est:.0f} s)", key="sched_video_make"):
            fig = video_fig(src.key, sms, color_by, bh, rendered, trace)
            bar = FrameProgress(fmt.upper(), rate)
            began = time.monotonic()
            with tempfile.TemporaryDirectory() as tmp:
                path = export.export_animation(fig, Path(tmp) / f"schedule.{fmt}", fmt, max_frames=rendered,
                                               fps=fps, duration=seconds, size=size, presentation=present,
                                               progress=bar)
                made = st.session_state["sched_video"] = (want, path.read_bytes())
                w, h = video_size(path)           # the file's own size, read back, is what is said
            took = time.monotonic() - began
            bar.bar.progress(1.0, text=f"Rendered the {fmt.upper()} at {w}×{h}: {len(fig.frames)} frames in {took:.0f} s")
            per_frame = max(0.05, took / max(1, len(fig.frames)))
            st.session_state.setdefault("sched_video_rate", {})[size] = per_frame
        if made and made[0] == want:
            name = export.download_name(src, "whole-gpu-schedule", fmt)
            st.download_button(f"⬇ {name} ({len(made[1]) / 1e6:.1f} MB)", data=made[1],
                               file_name=name, mime=common.MIME[fmt], key="sched_video_dl", on_click="ignore")
