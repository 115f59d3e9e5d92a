"""Tilescope: watch FlashAttention run tile by tile. `streamlit run app/main.py`

A small router: the URL seeds the session (app/url_state.py), the shared sidebar controls
(app/sidebar.py) resolve to Settings (app/settings.py), then one view from app/views/ runs.
app/views/ is not named pages/, so Streamlit's legacy pages-directory mode never starts.

The `app` package must be importable: `pip install -e .` (the README's first command) installs
it; Streamlit itself puts only app/ on sys.path. `streamlit run app/main.py` first imports this
file to find its server (the `st.App` at the bottom: Streamlit's own server plus app/server.py's
middleware); every session then runs it as the page script (`__name__ == "__main__"`), which is
`page_run()`.
"""

import logging
from pathlib import Path

import streamlit as st


def page_run() -> None:
    """One run of the page script: URL state, sidebar, then the chosen view."""
    from app import plotly_preload

    preload = plotly_preload.start()    # before the imports below: the browser loads Plotly meanwhile

    from app import presentation, sources, url_state
    from app.settings import OWN_DATA_PAGES, PAGES
    from app.sidebar import sidebar
    from app.text import plain
    from app.views import common

    st.set_page_config(page_title="Tilescope", page_icon="🔬", layout="wide")
    url_state.init_session()

    view_dir = Path(__file__).parent / "views"
    pages = {name: st.Page(view_dir / f"{name}.py", title=title, url_path=name,
                           default=name == st.session_state["_default_page"])
             for name, title in PAGES.items()}
    page = st.navigation(list(pages.values()))
    page_name = next(name for name, p in pages.items() if p is page)
    own_data = page_name in OWN_DATA_PAGES       # ring, decode: their own recordings, not the attention run
    settings = sidebar(attention=not own_data)
    link_slot = st.sidebar.empty()

    # The view draws into one slot. A live run that is not cached yet runs in an empty slot first,
    # so the previous view's charts and messages leave the screen while the kernel runs.
    runs = settings.live and not own_data and not sources.has_run(settings)
    notice = st.empty()        # above the view: why a refused run shows the last good view instead
    view = st.empty() if runs else st
    if not own_data:
        sources.run_before_page(settings, view)
    # A refused run (too big, not valid) keeps the last view that worked, its link, and says why above it.
    refused = None if own_data else sources.refusal(settings)
    last_good = st.session_state.get("_last_good")
    shown = last_good if refused is not None and last_good is not None else settings
    st.session_state["_settings"] = shown
    url_state.write_query(shown, page_name)
    url_state.show_url_errors()
    if settings.present:
        presentation.apply()
    if shown is not settings:
        with notice.container():
            common.explain_failure(refused, settings, shown=shown)
    with link_slot.container():   # now as well as after the page: a page that stops keeps a link
        url_state.show_share_link()
    st.session_state.pop("_download_stem", None)     # each page names its downloads itself
    try:
        with view.container():
            page.run()
        if refused is None and not own_data:
            st.session_state["_last_good"] = settings
    except Exception as exc:  # never a traceback on screen; the log keeps it
        logging.getLogger("tilescope").exception("page %s failed", page_name)
        st.error(f"This view could not be drawn: {type(exc).__name__}: {plain(exc)}. Try other settings "
                 "(the controls on the left); the rest of the app keeps working.")
    finally:   # after the page: the link carries the page's own controls too
        plotly_preload.done(preload)
        with link_slot.container():
            url_state.show_share_link()


if __name__ == "__main__":      # a session's run of the page script
    page_run()
else:                           # `streamlit run app/main.py` looks for a server app first: ours
    import os

    # Sessions run the page script in threads of their own: two first visits that import numpy /
    # pandas / Plotly at the same moment could meet a half-initialised module ("partially
    # initialized module 'numpy' has no attribute 'ndarray'"). Import them once, before any session.
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import plotly.graph_objects  # noqa: F401

    from app.server import asset_middleware
    from app.sources.upload import remove_stale_upload_dirs

    remove_stale_upload_dirs()      # at the server's start, what a killed server left behind

    # TILESCOPE_ASSETS=0: Streamlit's server alone (scripts/measure_app.py --compare-assets)
    app = st.App(__file__, middleware=asset_middleware() if os.environ.get("TILESCOPE_ASSETS") != "0" else [])
