"""`tilescope-app`: start the dashboard from any directory.

The same as `streamlit run app/main.py` from the repository root; any further arguments go to
`streamlit run` (for example `--server.port 8502 --server.headless true`).
"""

import sys
from pathlib import Path

MAIN = Path(__file__).resolve().with_name("main.py")


def main(argv=None) -> None:
    """Run `streamlit run <this package's main.py> [argv...]` in this process.

    Arguments:
        argv: extra arguments for `streamlit run` (default: the command line's own).
    Returns:
        Does not return: exits with Streamlit's status when the server stops.
    """
    from streamlit.web import cli

    args = sys.argv[1:] if argv is None else list(argv)
    cli.main(args=["run", str(MAIN), *args], prog_name="streamlit")


if __name__ == "__main__":
    main()
