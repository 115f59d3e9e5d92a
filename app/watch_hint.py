"""The copyable snippet that watches (or captures) a user's own model, shown on the Your model and
Model run pages."""

from __future__ import annotations

import streamlit as st

WATCH_SNIPPET = """\
from instrumentation import hf                  # pip install -e . (Tilescope), transformers >= 5
from instrumentation.watch import watch

hf.use_tilescope(model)                         # attention through Tilescope's kernels
with watch(model, "runs/mine", every=100, backward=True) as w:
    for batch in loader:                        # each training-mode forward is a step
        loss = model(**batch).loss
        loss.backward(); opt.step(); opt.zero_grad()

# in another shell, while it trains (or after):
#   tilescope-app --watch runs/mine     then open http://localhost:8501/model_run
# one forward or generate instead:  with hf.capture(model) as run: model.generate(ids); run.save("runs/mine")
"""


def watch_snippet(expanded: bool = False) -> None:
    """The copyable snippet that watches (or captures) a user's own model, and what its times are."""
    with st.expander("Watch or capture your own model", expanded=expanded, icon=":material/play_circle:"):
        st.code(WATCH_SNIPPET, language="python")
        st.caption("On a GPU the traced kernels carry hardware clocks: the times drawn are measured. In Triton's "
                   "CPU interpreter (TRITON_INTERPRET=1) there is no clock: the times are modelled "
                   "(instrumentation.estimate). `python -m instrumentation.watch_demo` trains a tiny model "
                   "watched and prints the URL to open.")
