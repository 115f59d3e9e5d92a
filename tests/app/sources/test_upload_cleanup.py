"""Upload directories a killed server left behind go when the next server starts, before any page
is opened; a live server's and another name's stay."""

import os
import subprocess
import sys
from pathlib import Path


def test_server_start_removes_a_dead_servers_upload_dirs(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / f"tilescope-upload-{dead}-abc"
    live = tmp_path / f"tilescope-upload-{os.getpid()}-def"
    other = tmp_path / "someone-else"
    for d in (stale, live, other):
        (d / "trace").mkdir(parents=True)
        (d / "trace" / "meta.json").write_text("{}")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    # what `streamlit run app/main.py` does first: import the file to find its server app
    done = subprocess.run([sys.executable, "-c", "import app.main; print(type(app.main.app).__name__)"],
                          env=env, capture_output=True, text=True, cwd=Path(__file__).parents[3], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not stale.exists()
    assert live.exists() and other.exists()
