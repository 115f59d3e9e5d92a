import os

# The Triton interpreter must be chosen before any @triton.jit module (or triton) is imported.
# Without CUDA every kernel runs in the interpreter; on a GPU machine the suite runs compiled.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"

import pytest  # noqa: E402
import torch  # noqa: E402

ON_GPU = os.environ["TRITON_INTERPRET"] in ("0", "") and torch.cuda.is_available()


@pytest.fixture(scope="session")
def device():
    """Where kernel tests put their tensors: CUDA when compiled, CPU in the interpreter."""
    return torch.device("cuda" if ON_GPU else "cpu")


def pytest_collection_modifyitems(config, items):
    # Browser tests last (tests/app/conftest.py): they share one Chromium whose Playwright sync API
    # holds a running asyncio loop until the session ends. The ones that want a server no session
    # has used yet go first among them, so the shared server is theirs at no extra start.
    def order(item):
        if "browser" not in item.keywords:
            return 0
        return 1 if "fresh_app_server" in getattr(item, "fixturenames", ()) else 2

    items.sort(key=order)          # stable: file order within each group
    from app.browser import missing_reason

    # no Chrome / Chromium (app.browser: BROWSER_PATH, else PATH): browser tests skip with the reason
    no_browser = missing_reason("the browser tests drive Chrome or Chromium")
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (run on the lent GPU)"))
        elif "browser" in item.keywords and no_browser:
            item.add_marker(pytest.mark.skip(reason=no_browser))
