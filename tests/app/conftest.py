import importlib.util

# The app needs plotly and streamlit; a machine without them (the bare GPU image) skips this folder.
if importlib.util.find_spec("plotly") is None or importlib.util.find_spec("streamlit") is None:
    collect_ignore_glob = ["test_*.py"]
