"""`tilescope-app`: start the dashboard from any directory.

The same as `streamlit run app/main.py` from the repository root; any further arguments go to
`streamlit run` (for example `--server.port 8502 --server.headless true`).

    tilescope-app --watch DIR      the Model run page follows the run in DIR (a growing run written by
                                   instrumentation.watch, or any saved run), listed by DIR's name
"""

import os
import sys
from pathlib import Path

MAIN = Path(__file__).resolve().with_name("main.py")


def main(argv=None) -> None:
    """Run `streamlit run <this package's main.py> [argv...]` in this process.

    Arguments:
        argv: extra arguments for `streamlit run` (default: the command line's own); `--watch DIR`
            is taken out and sets the run the Model run page follows.
    Returns:
        Does not return: exits with Streamlit's status when the server stops.
    """
    from streamlit.web import cli

    args = sys.argv[1:] if argv is None else list(argv)
    if "--watch" in args:
        i = args.index("--watch")
        if i + 1 >= len(args):
            raise SystemExit("tilescope-app: --watch needs a directory: tilescope-app --watch runs/mine")
        folder = Path(args[i + 1]).expanduser().resolve()
        if not folder.is_dir():
            raise SystemExit(f"tilescope-app: --watch {args[i + 1]}: no such directory (start the watched job "
                             "first, or give the directory it writes)")
        os.environ["TILESCOPE_WATCH"] = str(folder)      # app.sources.model_run.WATCH_ENV
        del args[i:i + 2]
    cli.main(args=["run", str(MAIN), *args], prog_name="streamlit")


if __name__ == "__main__":
    main()
