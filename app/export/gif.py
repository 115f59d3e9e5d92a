"""GIF frames over one 256-colour palette that keeps a figure's own colours exact.

A GIF has 256 colours. Pillow's adaptive palette, made from the pixels alone, merges a small
flat fill into a big neighbour: in the whole-GPU animation 'pending (partial tile)' (#fde0c5)
came out as the grey of 'skipped by the mask' and 'done (partial tile)' as the lanes' yellow.
So the colours the figure names (its states, legend swatches, text) that appear in the frames
each keep an entry, then the most common other colours, and the rest of the palette is a median
cut of the frames (the lanes' Viridis raster, antialiased edges); every pixel goes to its
nearest entry, without dithering.
"""

from __future__ import annotations

import re

import numpy as np
import plotly.graph_objects as go

FLAT_COLOURS = 96      # palette entries for exact colours (the figure's own first, then the commonest)
PALETTE_FRAMES = 12    # frames the palette is made from, evenly spread (a 48-frame 1080p video: 100 M pixels)
_HEX = re.compile(r"#([0-9a-fA-F]{6}|[0-9a-fA-F]{3})\b")
_RGB = re.compile(r"rgba?\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)")


def figure_colours(fig: go.Figure) -> list[tuple[int, int, int]]:
    """Every colour a figure names (hex or rgb(a) strings anywhere in it), as RGB."""
    text = fig.to_json()
    out = set()
    for h in _HEX.findall(text):
        h = "".join(c * 2 for c in h) if len(h) == 3 else h
        out.add(tuple(int(h[i:i + 2], 16) for i in (0, 2, 4)))
    out.update(tuple(min(255, int(v)) for v in m) for m in _RGB.findall(text))
    return sorted(out)


def rgb_codes(frame: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 -> (H*W,) 0xRRGGBB codes (built in place, channel by channel: a third of
    the time of widening all three channels at once)."""
    out = frame[..., 0].astype(np.uint32)
    out <<= 8
    out |= frame[..., 1]
    out <<= 8
    out |= frame[..., 2]
    return out.reshape(-1)


def _rgb(codes: np.ndarray) -> np.ndarray:
    return np.stack([codes >> 16, codes >> 8 & 255, codes & 255], axis=1).astype(np.uint8)


def gif_palette(frames: list[np.ndarray], keep=(), codes: list[np.ndarray] | None = None) -> np.ndarray:
    """(<= 256, 3) uint8: `keep` colours found in the frames, the commonest other colours that
    fill >= 200 pixels (a swatch is hundreds), up to FLAT_COLOURS exact entries in all, then a
    median cut of the frames (of every other pixel of every other row: the cut's cost was most of
    a video's encoding, and the colours it places are the gradients and edges, not the flat fills).
    codes: rgb_codes of each frame, where the caller has them already."""
    from PIL import Image

    pick = np.unique(np.linspace(0, len(frames) - 1, min(len(frames), PALETTE_FRAMES)).round().astype(int))
    picked = [codes[i] for i in pick] if codes is not None else [rgb_codes(frames[i]) for i in pick]
    frames = [frames[i] for i in pick]
    codes, counts = np.unique(np.concatenate(picked), return_counts=True)
    wanted = np.array([r << 16 | g << 8 | b for r, g, b in keep], dtype=np.uint32)
    named = np.isin(codes, wanted)
    order = np.lexsort((-counts, ~named))               # the figure's own colours first, commonest first
    order = order[named[order] | (counts[order] >= 200)][:FLAT_COLOURS]
    flat = _rgb(codes[order])
    rest = Image.fromarray(np.concatenate([f[::2, ::2] for f in frames], axis=0)).quantize(256 - len(flat), method=Image.Quantize.MEDIANCUT)
    cut = np.array(rest.getpalette()[:3 * (256 - len(flat))], dtype=np.uint8).reshape(-1, 3)
    return np.concatenate([flat, cut])[:256]


def write_gif(path, frames: list[np.ndarray], fps: float, keep=(), hold=None) -> None:
    """The frames as a looping GIF over one shared palette (gif_palette); hold: how many
    1/fps ticks each frame shows for (default one each)."""
    from PIL import Image

    codes = [rgb_codes(f) for f in frames]
    pal = gif_palette(frames, keep, codes)
    flat_pal = pal.reshape(-1).tolist() + [0] * (768 - pal.size)
    # each colour to its nearest palette entry, exactly (Pillow's lookup is coarser): the colours of
    # every frame marked in one 2^24 table (a scatter, not a sort per frame), each matched once, and
    # every frame then a gather through that table
    seen = np.zeros(1 << 24, dtype=bool)
    for c in codes:
        seen[c] = True
    colours = np.flatnonzero(seen).astype(np.uint32)
    lut = np.zeros(1 << 24, dtype=np.uint8)
    for lo in range(0, len(colours), 4096):          # (chunk, 256) distances, bounded memory
        part = colours[lo:lo + 4096]
        lut[part] = ((_rgb(part)[:, None, :].astype(np.int32) - pal[None, :, :].astype(np.int32)) ** 2).sum(-1).argmin(1)
    images = []
    for f, c in zip(frames, codes):
        im = Image.fromarray(lut[c].reshape(f.shape[:2]), mode="P")
        im.putpalette(flat_pal)
        images.append(im)
    ticks = [1] * len(frames) if hold is None else [int(n) for n in hold]
    images[0].save(path, format="GIF", save_all=True, append_images=images[1:],
                   duration=[int(round(1000 * n / fps)) for n in ticks], loop=0, optimize=False)
