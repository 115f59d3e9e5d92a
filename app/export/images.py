"""Figures as PNG / SVG / PDF (kaleido) or standalone HTML; an animated figure as one still."""

from __future__ import annotations

import re
from pathlib import Path

import plotly.graph_objects as go

from .common import ExportError, kaleido_server, write_atomic

IMAGE_FORMATS = ("png", "svg", "pdf")
FIGURE_FORMATS = IMAGE_FORMATS + ("html",)
DEFAULT_SIZE = (1100, 650)
PNG_SCALE = 2
SLIDE_PIXELS = (1920, 1080)


def figure_size(fig: go.Figure) -> tuple[int, int]:
    return (fig.layout.width or DEFAULT_SIZE[0], fig.layout.height or DEFAULT_SIZE[1])


def png_scale(fig: go.Figure) -> float:
    """Scale 2 in the normal look; in the slide look, enough for at least 1920 x 1080 pixels
    (a strip lower than 16:9 gets the slide's width, 1920, not a 1080-pixel height that would
    make it several thousand pixels wide)."""
    from app.figures import is_slide

    if not is_slide(fig):
        return PNG_SCALE
    w, h = figure_size(fig)
    if w / h > SLIDE_PIXELS[0] / SLIDE_PIXELS[1] + 0.01:
        return max(SLIDE_PIXELS[0] / w, 1.0)
    return max(SLIDE_PIXELS[0] / w, SLIDE_PIXELS[1] / h, 1.0)


def static_frame(fig: go.Figure, frame: int | None = None, validate: bool = True) -> go.Figure:
    """One frame of an animated figure as a still: the frame's data and layout applied to the
    base figure, player buttons and slider removed. frame: 0-based, default the one its player
    opens on (else the middle one); validate=False: build the still without plotly's validation
    (its parts come from a validated figure; ~0.5 s saved on the whole-GPU animation). A figure
    without frames comes back unchanged."""
    if not fig.frames:
        return fig
    n = len(fig.frames)
    opens = fig.layout.sliders[0].active if fig.layout.sliders else None
    i = (int(opens) if opens is not None else n // 2) if frame is None else int(frame)
    if not 0 <= i < n:
        raise ExportError(f"frame must be within 1..{n}, got {i + 1}")
    base = fig.to_dict()
    layout = {k: v for k, v in base["layout"].items() if k not in ("updatemenus", "sliders")}
    fr = base["frames"][i]
    data = list(base["data"])
    for j, fd in zip(fr.get("traces", range(len(fr.get("data", [])))), fr.get("data", [])):
        data[j] = {**data[j], **fd}
    still = go.Figure(data=data, layout=layout, _validate=validate)
    still.update_layout(fr.get("layout", {}))
    if base["layout"].get("sliders") or base["layout"].get("updatemenus"):
        _drop_player_room(still)
    return still


def _drop_player_room(still: go.Figure) -> None:
    """Both looks keep room under the plot for the player (play buttons, slider), which a
    still does not have: move the provenance caption up under the x-axis title and shrink
    the bottom margin by as much (the slide look's room is PLAYER_PX; the normal look's is
    what lies between the x-axis title, ~65 px under the plot, and the caption)."""
    from app.figures._slide import PLAYER_PX, is_slide

    caps = [a for a in still.layout.annotations if a.name == "provenance" and a.yshift is not None]
    b = still.layout.margin.b
    if not caps or b is None:
        return
    cut = PLAYER_PX if is_slide(still) else max(0, min(-caps[0].yshift - 65, b - 100))
    if cut <= 0:
        return
    still.update_layout(margin=dict(b=b - cut))
    for ann in caps:
        ann.yshift += cut


def figure_bytes(fig: go.Figure, fmt: str, scale: float | None = None, frame: int | None = None) -> bytes:
    """PNG / SVG / PDF bytes (an animated figure as one still frame, default mid-run), or a
    standalone HTML page (plotly.js inlined, works offline, animation kept)."""
    if fmt == "html":
        return fig.to_html(include_plotlyjs=True, full_html=True, auto_play=False).encode()
    if fmt not in IMAGE_FORMATS:
        raise ExportError(f"image format must be one of {FIGURE_FORMATS}, got {fmt!r}")
    fig = without_hover_hints(static_frame(fig, frame))
    w, h = figure_size(fig)
    scale = (png_scale(fig) if fmt == "png" else 1.0) if scale is None else scale
    with kaleido_server():
        data = fig.to_image(format=fmt, width=w, height=h, scale=scale)
    return pdf_titled(data, figure_title(fig)) if fmt == "pdf" else data


def without_hover_hints(fig: go.Figure) -> go.Figure:
    """A copy of `fig` without hover hints in its texts: an image or a video is not hovered (the
    copy skips plotly's validation: `fig` was validated; ~1 s saved on the whole-GPU animation)."""
    from app.figures._common import drop_hover_hints

    return drop_hover_hints(go.Figure(fig.to_dict(), _validate=False))


def figure_title(fig: go.Figure) -> str:
    """The figure's title as plain text ("" when it has none)."""
    text = (fig.layout.title.text if fig.layout.title else None) or ""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text)).strip()


def pdf_titled(pdf: bytes, title: str) -> bytes:
    """The PDF with its document title set to `title` (kaleido's page is titled "Kaleido-fier",
    which a PDF viewer shows in its window and a slide tool as the file's name): an incremental
    update, a new Info dictionary appended after the file with its own cross-reference section,
    so nothing kaleido wrote moves. A PDF whose trailer cannot be read is returned unchanged."""
    m = re.search(rb"trailer\s*<<(.*?)>>\s*startxref\s*(\d+)\s*%%EOF\s*$", pdf, re.S)
    if not title or m is None:
        return pdf
    size = re.search(rb"/Size\s+(\d+)", m.group(1))
    root = re.search(rb"/Root\s+(\d+\s+\d+\s+R)", m.group(1))
    if size is None or root is None:
        return pdf
    n = int(size.group(1))
    hex_title = ("FEFF" + title.encode("utf-16-be").hex().upper()).encode()     # any character, escaped
    body = pdf if pdf.endswith(b"\n") else pdf + b"\n"
    obj_at = len(body)
    obj = b"%d 0 obj\n<</Title <%s>\n/Producer (Tilescope via kaleido)>>\nendobj\n" % (n, hex_title)
    xref_at = obj_at + len(obj)
    tail = (b"xref\n%d 1\n%010d 00000 n \ntrailer\n<</Size %d\n/Root %s\n/Info %d 0 R\n/Prev %s>>\n"
            b"startxref\n%d\n%%%%EOF\n" % (n, obj_at, n + 1, root.group(1), n, m.group(2), xref_at))
    return body + obj + tail


def export_figure(fig: go.Figure, path, fmt: str | None = None, scale: float | None = None,
                  frame: int | None = None) -> Path:
    """Write `fig` as png/svg/pdf (kaleido; an animated figure as one still frame) or html
    (standalone: plotly.js inlined, works offline, animation kept)."""
    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt not in FIGURE_FORMATS:
        raise ExportError(f"figure format must be one of {FIGURE_FORMATS}, got {fmt!r}")
    return write_atomic(path, figure_bytes(fig, fmt, scale, frame))
