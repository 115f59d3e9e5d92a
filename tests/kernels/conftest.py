import pytest


@pytest.fixture(autouse=True)
def fresh_launch_plans():
    """Tests that force a launch rule (monkeypatch) must not meet a plan resolved before, nor leave
    one behind: launch plans are cached per call shape."""
    from kernels.launch import clear_caches

    clear_caches()
    yield
    clear_caches()
