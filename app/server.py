"""What Tilescope adds to Streamlit's web server: its frontend's files served from memory, and the
browser told to fetch the Plotly chart code first thing.

`streamlit run app/main.py` finds the `st.App` that app/main.py builds with `asset_middleware()`
(Streamlit's public ASGI app: the same server, routes and websocket, plus this middleware).

Why (Chromium traces of the 16k schedule page on a 2-CPU machine, notes in the README):
  - Streamlit's frontend fetches its 4.7 MB Plotly chunk only when React mounts the first chart,
    ~1.1 s after navigation, and its static route streams files in 64 kB pieces through a thread
    pool: with the page's script and websocket busy beside it, that fetch took 0.4-0.95 s, all on
    the way to the first chart. A `<link rel="modulepreload">` in the page's HTML starts it with the
    frontend's own files, and the files come from memory in one piece.
  - Every JavaScript file starts with V8's explicit compile hint (`//# allFunctionsCalledOnLoad`,
    Chrome 136+; other browsers read a comment): V8 then compiles the whole file while it streams
    in, on a background thread, instead of compiling each function lazily on the main thread the
    first time it runs. Nearly all of the frontend's and Plotly's code runs while a page opens, and
    the main thread is the bottleneck there: script time per visit 1.82 -> 1.50 s, settle 3.00 ->
    2.82 s (medians of 12 interleaved visits; data in the README).
  - Plotly's chunk registers every Plotly trace type when it is evaluated. Tilescope draws
    scatter, bar and heatmap charts only; the 3D types and `image` pull in WebGL matrix and image-
    probing modules whose evaluation was ~0.5 s of the main thread's CPU per visit (0.70 -> 0.17 s
    for the chunk's evaluation, Chromium traces of the 16k schedule page, 3 interleaved visits
    each). `without_traces` leaves them out of the registration (their code is still sent, never
    run); every other type, 2D WebGL and maps included, stays. A chunk whose registration does
    not look as expected is served unchanged; TILESCOPE_PLOTLY_TRACES=all serves it unchanged too.
  - Streamlit's chart component drew every chart twice on opening: once before it had measured
    its container (no width: Plotly autosizes; on slides the figure's 1280 px) and again at the
    measured width, and once more when an effect re-applied the theme to the figure it had just
    themed (a deep copy: Plotly redraws everything). `drawn_once` makes the chart wait for its
    width and skips that effect's first run (a theme change later still redraws), so each chart
    is drawn once: one Plotly.react instead of two per chart (the 16k lanes chart's second draw
    was 0.12-0.25 s of the main thread on the loaded 2-CPU machine). Each change applies only
    where Streamlit's code has the expected shape; TILESCOPE_PLOTLY_DRAWS=twice turns it off.
  - The set of files is Streamlit's own static directory, listed once: a request for anything else
    (another path, `..`) falls through to Streamlit unchanged.
"""

from __future__ import annotations

import mimetypes
import os
import re
from pathlib import Path

import streamlit as st

STATIC_DIR = Path(st.__file__).parent / "static"
# V8's explicit compile hint: a magic comment in a script's first line (v8.dev/blog/explicit-compile-hints)
COMPILE_HINT = b"//# allFunctionsCalledOnLoad\n"
# Streamlit's hashed bundles may be cached for good (its own rule for files under static/)
_IMMUTABLE = b"public, immutable, max-age=31536000"


def _asset_files() -> dict[str, Path]:
    """URL path -> file for every file of the frontend's static/ directory (hashed bundles)."""
    root = STATIC_DIR / "static"
    return {"/static/" + p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}


# Plotly's chart chunk (preloading the other widgets' chunks too, select boxes, toggles, metrics,
# was no faster: 3.05 s against 3.05 s, median of 10 interleaved visits each)
PRELOADED = ("PlotlyChart",)
_STATIC_IMPORT = re.compile(rb'(?:from|import)\s*"\./([\w.-]+\.js)"')


def preload_chunks(files: dict[str, Path]) -> list[str]:
    """URL paths the page's HTML asks the browser to fetch at once: the PRELOADED chunks and every
    module they import statically (all must be there before one can run; Plotly's are three small
    ones, which otherwise came ~0.2 s after the chunk was asked for), less those the frontend's
    own HTML preloads already."""
    js = {u.rsplit("/", 1)[1]: u for u in files if u.startswith("/static/js/") and u.endswith(".js")}
    index = (STATIC_DIR / "index.html").read_bytes() if (STATIC_DIR / "index.html").is_file() else b""
    todo = [name for name in js if name.split(".", 1)[0] in PRELOADED]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in js:
            continue
        seen.add(name)
        todo += [m.decode() for m in _STATIC_IMPORT.findall(files[js[name]].read_bytes())]
    # the big one first: Plotly's 4.7 MB chunk is the longest fetch
    return sorted((js[n] for n in seen if f"./static/js/{n}".encode() not in index),
                  key=lambda u: (not u.startswith("/static/js/PlotlyChart."), u))


# Plotly trace types no Tilescope chart draws whose modules cost the most to evaluate (the 3D
# family's WebGL matrix code, image's image probing); every chart is scatter, bar or heatmap
UNUSED_TRACES = ("scatter3d", "surface", "isosurface", "volume", "mesh3d", "cone", "streamtube", "image")
# Plotly's lib/index.js in the chunk: `n.register([Iu(),hee(),...])`, each call a lazily evaluated
# module `Iu=_({"lib/bar.js"(e,t){t.exports=Fu()}})` (minified names differ between builds)
_REGISTER = re.compile(rb"\.register\(\[((?:[\w$]+\(\),)*[\w$]+\(\))\]\)")
_TRACE_MODULE = re.compile(rb'([\w$]+)=[\w$]+\(\{"lib/(\w+)\.js"\(')


def without_traces(chunk: bytes, drop: tuple[str, ...] = UNUSED_TRACES) -> bytes:
    """Plotly's chart chunk with the trace types `drop` left out of Plotly's registration, so
    their modules are never evaluated; the chunk unchanged where its registration is not one list
    of lib/<type>.js modules (another Streamlit build).

    Arguments: chunk: the PlotlyChart chunk's bytes; drop: Plotly trace type names.
    Returns: the chunk's bytes, with those calls taken out of the register list."""
    lists = [m for m in _REGISTER.finditer(chunk)]
    modules = dict(_TRACE_MODULE.findall(chunk))
    if len(lists) != 1:
        return chunk
    calls = lists[0].group(1).split(b",")
    names = [modules.get(c[:-2]) for c in calls]
    if None in names or b"bar" not in names:
        return chunk
    kept = b",".join(c for c, n in zip(calls, names) if n.decode() not in drop)
    return chunk[:lists[0].start(1)] + kept + chunk[lists[0].end(1):]


# Streamlit's chart component (PlotlyChart chunk; minified names differ between builds):
# its wrapper renders the chart once the container's width is known, but an unmeasured
# container reads -1, which is truthy: `let{width:t}=E(k);return t?i(Je,...)`
_UNMEASURED = re.compile(rb"(let\{width:([\w$]+)\}=[\w$]+\([\w$]+\);return )\2\?")
# ... and on mount an effect re-applies the theme to the state it was just built with:
# `(0,P.useEffect)(()=>{F(t=>Le(t,e.theme,c))},[e.id,c,e.theme])`
_RETHEME = re.compile(rb"\(0,([\w$]+)\.useEffect\)\(\(\)=>\{([\w$]+)\(([\w$]+)=>([\w$]+)\(\3,([\w$]+)\.theme,"
                      rb"([\w$]+)\)\)\},\[\5\.id,\6,\5\.theme\]\)")


def drawn_once(chunk: bytes) -> bytes:
    """Streamlit's chart component drawing each chart once on opening: it waits until its
    container has a width (instead of drawing unsized, then again at the width), and the effect
    that re-themes the figure skips its first run (the figure it starts from is themed already);
    each change only where exactly one place in the chunk has the expected shape.

    Arguments: chunk: the PlotlyChart chunk's bytes.
    Returns: the chunk's bytes with those two changes (either left out where it does not fit)."""
    if len(_UNMEASURED.findall(chunk)) == 1:
        chunk = _UNMEASURED.sub(rb"\1\2>0?", chunk)
    if len(_RETHEME.findall(chunk)) == 1:       # a ref (one more hook, always called) marks the first run
        chunk = _RETHEME.sub(rb"(($tsRef)=>(0,\1.useEffect)(()=>{if(!$tsRef.current){$tsRef.current=!0;return}"
                             rb"\2(\3=>\4(\3,\5.theme,\6))},[\5.id,\6,\5.theme]))((0,\1.useRef)(!1))", chunk)
    return chunk


class AssetMiddleware:
    """ASGI middleware: static files from memory (scripts with the compile hint); `modulepreload`
    links in the page's HTML."""

    def __init__(self, app):
        self.app = app
        self.files = _asset_files()
        self.cache: dict[str, tuple[bytes, bytes]] = {}
        links = "".join(f'<link rel="modulepreload" crossorigin href=".{u}">' for u in preload_chunks(self.files))
        self.head_links = links.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") not in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path in self.files:
            return await self._send_file(path, scope["method"] == "HEAD", send)
        return await self.app(scope, receive, self._add_links(send) if self.head_links else send)

    async def _send_file(self, path: str, head_only: bool, send) -> None:
        if path not in self.cache:
            ctype = mimetypes.guess_type(path)[0] or "application/octet-stream"
            if ctype.startswith("text/") or ctype.endswith("javascript"):
                ctype += "; charset=utf-8"
            body = self.files[path].read_bytes()
            if path.startswith("/static/js/PlotlyChart.") and os.environ.get("TILESCOPE_PLOTLY_TRACES") != "all":
                body = without_traces(body)
            if path.startswith("/static/js/PlotlyChart.") and os.environ.get("TILESCOPE_PLOTLY_DRAWS") != "twice":
                body = drawn_once(body)
            if path.endswith(".js"):
                body = COMPILE_HINT + body
            self.cache[path] = (body, ctype.encode())
        body, ctype = self.cache[path]
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", ctype), (b"content-length", str(len(body)).encode()), (b"cache-control", _IMMUTABLE)]})
        await send({"type": "http.response.body", "body": b"" if head_only else body})

    def _add_links(self, send):
        """`send` for a response that adds the links to it if it is the (uncompressed) page HTML."""
        held: dict = {}
        parts: list[bytes] = []

        async def wrapped(msg):
            if msg["type"] == "http.response.start":
                headers = dict(msg.get("headers", []))
                if headers.get(b"content-type", b"").startswith(b"text/html") and b"content-encoding" not in headers:
                    held["start"] = msg
                    return None
                return await send(msg)
            if msg["type"] == "http.response.body" and "start" in held:
                parts.append(msg.get("body", b""))
                if msg.get("more_body"):
                    return None
                html = b"".join(parts)
                if b"</head>" in html:
                    html = html.replace(b"</head>", self.head_links + b"</head>", 1)
                start = held.pop("start")
                start["headers"] = [(k, str(len(html)).encode() if k == b"content-length" else v)
                                    for k, v in start.get("headers", [])]
                await send(start)
                return await send({"type": "http.response.body", "body": html})
            return await send(msg)

        return wrapped


def asset_middleware() -> list:
    """The middleware list for `st.App(..., middleware=asset_middleware())`."""
    from starlette.middleware import Middleware

    return [Middleware(AssetMiddleware)]
