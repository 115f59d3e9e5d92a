"""The installed project: console scripts, and the `kernels` name beside transformers.

Our top-level package `kernels` shares its import name with the Hugging Face hub package
`kernels` (pip install kernels), which transformers probes for. With Tilescope installed,
transformers must see that the hub package is absent, never import ours while probing, and
still build and run a model.
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

    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    logits = {}
    for impl in ("eager", "sdpa"):
        torch.manual_seed(0)
        model = LlamaForCausalLM._from_config(config, attn_implementation=impl).eval()
        with torch.no_grad():
            logits[impl] = model(ids).logits
        assert logits[impl].shape == (1, 12, 64) and torch.isfinite(logits[impl]).all()
    torch.testing.assert_close(logits["eager"], logits["sdpa"], atol=1e-5, rtol=1e-5)

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
