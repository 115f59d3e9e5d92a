"""Tilescope: watch FlashAttention run tile by tile. `streamlit run app/main.py`

A small router: shared sidebar controls (app/state.py), then one page from app/pages/.
"""

import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app import state  # noqa: E402

st.set_page_config(page_title="Tilescope", page_icon="🔬", layout="wide")
state.init_session()

PAGE_DIR = Path(__file__).parent / "pages"
pages = {name: st.Page(PAGE_DIR / f"{name}.py", title=title, url_path=name,
                       default=name == st.session_state["_default_page"])
         for name, title in state.PAGES.items()}
page = st.navigation(list(pages.values()))
page_name = next(name for name, p in pages.items() if p is page)
settings = state.sidebar()
st.session_state["_settings"] = settings
state.write_query(settings, page_name)
state.show_url_errors()

try:
    page.run()
except Exception as exc:  # never a traceback on screen; the log keeps it
    logging.getLogger("tilescope").exception("page %s failed", page_name)
    st.error(f"This view could not be drawn: {type(exc).__name__}: {exc}. Try other settings "
             "(the controls on the left); the rest of the app keeps working.")
