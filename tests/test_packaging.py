"""The installed project: console scripts, and the `kernels` name beside transformers.

Our top-level package `kernels` shares its import name with the Hugging Face hub package
`kernels` (pip install kernels), which transformers probes for. With Tilescope installed,
transformers must see that the hub package is absent and never import ours while probing (a
fresh process outside the repository: the probe and sys.modules as a user's script has them).
That transformers then builds and runs models beside ours (`kernels` imported, the same probe
answering False) is what tests/instrumentation/test_hf.py does in the test process, tiny Llama,
Qwen2 and Mistral models, eager and on our attention; the child does not build one again (the
modeling import is ~2.5 s of its ~6.5 s of CPU).
"""

import importlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_INSTALLED = 3          # the subprocess's exit status when `kernels` is not importable outside the repo

TRANSFORMERS_CHECK = textwrap.dedent(
    """
    import importlib.util
    import sys

    if importlib.util.find_spec("kernels") is None:
        sys.exit(3)

    import torch
    import transformers
    from transformers.utils import import_utils

    # The hub-kernels probe: find_spec("kernels") finds ours; its version comes from the
    # distribution that ships the name (tilescope), outside transformers' accepted range.
    assert not import_utils.is_kernels_available(), "transformers takes Tilescope's kernels for the hub package"
    assert "kernels" not in sys.modules, "transformers' probe imported Tilescope's kernels"

    import kernels
    assert hasattr(kernels, "flash_attention"), kernels.__file__
    print(kernels.__file__)
    """
)


def test_transformers_runs_beside_our_kernels_package(tmp_path):
    pytest.importorskip("transformers")
    # Outside the repository, so `kernels` resolves through the installation, as a user's script would.
    done = subprocess.run([sys.executable, "-c", TRANSFORMERS_CHECK], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if done.returncode == NOT_INSTALLED:
        pytest.skip("tilescope is not installed (pip install -e .)")
    assert done.returncode == 0, done.stderr[-3000:]
    assert Path(done.stdout.strip().splitlines()[-1]).resolve() == ROOT / "kernels" / "__init__.py", \
        "`kernels` resolves to another package (is the hub `kernels` package installed?)"


def test_console_scripts_print_their_help(capsys):
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    scripts = project["scripts"]
    assert {"tilescope-record", "tilescope-decode", "tilescope-export", "tilescope-bench",
            "tilescope-ring", "tilescope-app"} <= set(scripts)
    for name, target in scripts.items():
        module, _, func = target.partition(":")
        with pytest.raises(SystemExit) as stop:
            getattr(importlib.import_module(module), func)(["--help"])
        assert stop.value.code in (0, None), name
        assert "usage" in capsys.readouterr().out.lower(), name



def test_no_sys_path_changes_in_product_code():
    # The packages are importable because the project is installed, never by editing sys.path.
    edits = re.compile(r"sys\.path\.(insert|append|extend)\(|sys\.path\s*(\+=|=[^=])")
    found = [f"{path.relative_to(ROOT)}:{number}"
             for package in ("kernels", "instrumentation", "app", "benchmarks")
             for path in sorted((ROOT / package).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if edits.search(line)]
    assert not found


def test_app_launcher_runs_the_repository_app():
    from app import run_app

    assert run_app.MAIN == ROOT / "app" / "main.py" and run_app.MAIN.is_file()
