import streamlit as st

st.title("Tilescope")
st.info("The dashboard is being built (issue 3). The kernels and the headless record API work now: "
        "see the README.")
