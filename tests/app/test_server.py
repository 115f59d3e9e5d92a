"""app/server.py: the frontend's files from memory, a modulepreload link in the page's HTML, Plotly's
chunk without the trace types no chart draws, and everything else passed to Streamlit untouched."""

import asyncio
import random
import re
from pathlib import Path

from app.server import (_REGISTER, _RETHEME, _STATIC_IMPORT, _TRACE_MODULE, _UNMEASURED, COMPILE_HINT, STATIC_DIR,
                        UNUSED_TRACES, AssetMiddleware, _asset_files, drawn_once, preload_chunks, without_traces)


def served(url: str) -> bytes:
    """What the middleware serves for a static file: scripts with the compile hint, Plotly's chunk
    without the unused trace types and drawing each chart once, the rest byte for byte."""
    own = (STATIC_DIR / url.lstrip("/")).read_bytes()
    if url.startswith("/static/js/PlotlyChart."):
        own = drawn_once(without_traces(own))
    return COMPILE_HINT + own if url.endswith(".js") else own


def registered(chunk: bytes) -> list[str]:
    """The trace types a Plotly chunk registers, in order."""
    modules = dict(_TRACE_MODULE.findall(chunk))
    return [modules[c[:-2]].decode() for c in _REGISTER.search(chunk).group(1).split(b",")]


def call(mw, path, method="GET"):
    """One request through the middleware; returns (status, headers, body, reached_streamlit)."""
    sent, reached = [], []

    async def send(msg):
        sent.append(msg)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(mw({"type": "http", "method": method, "path": path, "headers": []}, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body, mw.app.calls


class FakeStreamlit:
    """Stands in for Streamlit's server: answers every request with `html` (in pieces)."""

    def __init__(self, html=b"<html><head><title>t</title></head><body></body></html>", headers=()):
        self.html, self.headers, self.calls = html, list(headers), 0

    async def __call__(self, scope, receive, send):
        self.calls += 1
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(self.html)).encode()),
            *self.headers]})
        half = len(self.html) // 2
        await send({"type": "http.response.body", "body": self.html[:half], "more_body": True})
        await send({"type": "http.response.body", "body": self.html[half:]})


def test_static_files_come_from_memory_byte_for_byte():
    files = _asset_files()
    assert files and all(u.startswith("/static/") for u in files)
    mw = AssetMiddleware(FakeStreamlit())
    others = [u for u in sorted(files) if not u.endswith(".js")]
    for url in random.Random(0).sample(sorted(files), 5) + others[:2] + preload_chunks(files):
        status, headers, body, calls = call(mw, url)
        assert status == 200 and calls == 0
        # scripts: V8's compile hint as a first line of its own, then Streamlit's file (unchanged
        # but for Plotly's registration)
        assert body == served(url)
        assert int(headers[b"content-length"]) == len(body)
        if url.endswith(".js"):
            assert headers[b"content-type"].startswith(b"text/javascript") or b"javascript" in headers[b"content-type"]
    status, headers, body, _ = call(mw, preload_chunks(files)[0], method="HEAD")
    assert status == 200 and body == b"" and int(headers[b"content-length"]) > 1_000_000


def test_anything_else_goes_to_streamlit():
    mw = AssetMiddleware(FakeStreamlit())
    for i, path in enumerate(["/static/js/not-a-chunk.js", "/static/../../../etc/passwd", "/_stcore/health",
                              "/static", "/app/static/x.png"], start=1):
        status, headers, body, calls = call(mw, path)
        assert calls == i, path     # Streamlit answered (here: with its page)
    status, _, _, calls = call(mw, "/static/js/x.js", method="POST")
    assert calls == 6


def test_the_page_html_asks_for_plotly_first_and_keeps_its_length_right():
    files = _asset_files()
    chunk = preload_chunks(files)
    assert chunk[0].startswith("/static/js/PlotlyChart.")
    # everything Plotly's chunk imports is preloaded, by Streamlit's own page or by us
    index = (STATIC_DIR / "index.html").read_bytes()
    for url in chunk:
        for dep in _STATIC_IMPORT.findall(files[url].read_bytes()):
            assert f"/static/js/{dep.decode()}" in chunk or b"./static/js/" + dep in index, (url, dep)
    status, headers, body, _ = call(AssetMiddleware(FakeStreamlit()), "/")
    for url in chunk:
        assert f'<link rel="modulepreload" crossorigin href=".{url}">'.encode() in body
    assert body.index(b"modulepreload") < body.index(b"</head>")
    assert int(headers[b"content-length"]) == len(body)
    # a compressed page is passed on as it is
    zipped = FakeStreamlit(html=b"\x1f\x8b binary", headers=[(b"content-encoding", b"gzip")])
    _, headers, body, _ = call(AssetMiddleware(zipped), "/")
    assert body == b"\x1f\x8b binary" and int(headers[b"content-length"]) == len(body)


def test_streamlit_run_app_main_serves_through_it(app_server_http):
    """`streamlit run app/main.py` finds app/main.py's st.App: the live server's page HTML carries
    the link and the chunk it names comes back whole."""
    import urllib.request

    app_server = app_server_http
    html = urllib.request.urlopen(app_server + "/?page=schedule", timeout=30).read()
    chunk = preload_chunks(_asset_files())[0]
    assert f'href=".{chunk}"'.encode() in html
    with urllib.request.urlopen(app_server + chunk, timeout=30) as r:
        assert r.read() == served(chunk)


def test_plotly_chunk_registers_every_trace_type_but_the_unused_ones():
    url = preload_chunks(_asset_files())[0]
    own = (STATIC_DIR / url.lstrip("/")).read_bytes()
    before, after = registered(own), registered(without_traces(own))
    assert set(UNUSED_TRACES) <= set(before) and {"bar", "heatmap", "scattergl", "pie"} <= set(before)
    assert after == [t for t in before if t not in UNUSED_TRACES]
    # only the register list changed, and a second pass changes nothing
    new, where = without_traces(own), _REGISTER.search(own).span(1)
    assert new[:where[0]] == own[:where[0]] and new.endswith(own[where[1]:])
    assert without_traces(new) == new


def test_a_chunk_of_another_shape_is_served_unchanged():
    mods = b'A=_({"lib/bar.js"(e,t){t.exports=x()}}),B=_({"lib/image.js"(e,t){t.exports=y()}});'
    assert without_traces(mods + b"n.register([A(),B()])") == mods + b"n.register([A()])"
    for odd in (mods + b"n.register([A(),C()])",                       # a call that is not a trace module
                mods + b"n.register([A(),B()]);m.register([A(),B()])",   # two lists
                b"no registration at all", mods + b"n.register([B()])"):  # no bar: not Plotly's list
        assert without_traces(odd) == odd


def test_no_chart_draws_a_trace_type_the_browser_does_not_register():
    """The app's figures are built from go.Scatter / go.Bar / go.Heatmap: none names a dropped type
    (as a graph_objects class, a plotly.express call that makes one, or a type string)."""
    classes = set(UNUSED_TRACES)
    root = Path(__file__).resolve().parents[2] / "app"
    for f in root.rglob("*.py"):
        text = f.read_text()
        used = {m.lower() for m in re.findall(r"\bgo\.([A-Z]\w*)\(", text)}
        assert not used & classes, (f, used & classes)
        assert not re.search(r"\bpx\.(imshow|scatter_3d|line_3d)\b", text), f
        assert not re.search(r"""type["']?\s*[:=]\s*["'](%s)["']""" % "|".join(UNUSED_TRACES), text), f


def test_chart_component_waits_for_its_width_and_skips_the_first_retheme():
    url = preload_chunks(_asset_files())[0]
    own = (STATIC_DIR / url.lstrip("/")).read_bytes()
    assert len(_UNMEASURED.findall(own)) == 1 and len(_RETHEME.findall(own)) == 1
    new = drawn_once(own)
    assert not _UNMEASURED.findall(new) and not _RETHEME.findall(new)
    wrapper = re.search(rb"let\{width:([\w$]+)\}=[\w$]+\([\w$]+\);return \1>0\?", new)
    assert wrapper, "the chart renders only once its container has a width"
    assert new.count(b"$tsRef.current") == 2 and b".useRef)(!1))" in new
    assert drawn_once(new) == new            # a second pass changes nothing
    # another build's shape: left as it is
    for odd in (b"let{width:t}=E(k);return t?a:b;let{width:t}=E(k);return t?a:b", b"nothing here"):
        assert drawn_once(odd) == odd
    assert drawn_once(b"x;let{width:t}=E(k);return t?i(J,{width:t}):null") == b"x;let{width:t}=E(k);return t>0?i(J,{width:t}):null"
