"""app/server.py: the frontend's files from memory, a modulepreload link in the page's HTML, and
everything else passed to Streamlit untouched."""

import asyncio
import random

from app.server import _STATIC_IMPORT, COMPILE_HINT, STATIC_DIR, AssetMiddleware, _asset_files, preload_chunks


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
        own = (STATIC_DIR / url.lstrip("/")).read_bytes()
        # scripts: V8's compile hint as a first line of its own, then Streamlit's file unchanged
        assert body == (COMPILE_HINT + own if url.endswith(".js") else own)
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
        assert r.read() == COMPILE_HINT + (STATIC_DIR / chunk.lstrip("/")).read_bytes()
